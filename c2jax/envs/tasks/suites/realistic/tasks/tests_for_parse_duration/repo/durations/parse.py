import re

_PART = re.compile(r"(\d+)([hms])")
_SECONDS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text):
    """'1h30m' -> 5400, '45s' -> 45, '2h5s' -> 7205. Units h, m, s, each at most once, in that order.

    Raises ValueError for anything else (including the empty string).
    """
    text = text.strip()
    parts = _PART.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"bad duration {text!r}")
    units = [u for _, u in parts]
    if units != sorted(set(units), key="hms".index):
        raise ValueError(f"bad duration {text!r}: units repeat or are out of order")
    return sum(int(n) * _SECONDS[u] for n, u in parts)
