from units.errors import IncompatibleUnits, UnknownUnit
from units.registry import UNITS


def convert(value, src, dst):
    try:
        (src_dim, src_size), (dst_dim, dst_size) = UNITS[src], UNITS[dst]
    except KeyError as e:
        raise UnknownUnit(e.args[0]) from None
    if src_dim != dst_dim:
        raise IncompatibleUnits(f"cannot convert {src_dim} to {dst_dim}")
    return value * src_size / dst_size
