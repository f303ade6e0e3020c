"""Plain data <-> frozen dataclasses: the one converter between run configs (ml_collections ConfigDicts, dicts, the
JSON a trainer stores for its actors) and the typed configs the code takes.

  cfg = from_plain(RLConfig(model=model), c.rl, "rl")     # every field converted to its declared type
  plain = to_plain(cfg)                                   # back: enums by value, tuples as lists, pairs as dicts
  field_help(cfg)                                         # every leaf: key, value, default, its docstring sentence

Defaults live in the dataclasses, once: `from_plain` starts from a default instance and replaces only the fields
the data names, so a section that omits a field gets the dataclass's value. The conversion follows each field's
type annotation:

  enum                 the member's value, case-insensitive (or a member)
  bool / int / float / str
                       that type (an int is accepted for a float, never a bool for a number)
  tuple[X, ...]        a list or tuple, each item converted to X
  tuple[tuple[str, X], ...]
                       (name, value) pairs: a mapping in plain form (so `--config.rl.reward.weights.style=0.1` works)
  Mapping[str, X]      a mapping, each value converted to X (a dataclass X: from its default instance)
  a dataclass          a mapping of its fields, converted recursively from the default's value of that field
  X | None             None, or an X
  Any                  taken as it is (plain data: lists, dicts, scalars)

A key that is not a field, or a value of the wrong type, raises ValueError in one sentence that names the key by its
dotted path and says what is allowed; a dataclass's own `__post_init__` check is reported with the path of the
section it failed in. Fields whose metadata has `PLAIN: False` are left out of both directions (e.g. `RLConfig.model`:
a run config gives the architecture in its own section).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import numbers
import re
import types
import typing
from typing import Any, Mapping, TypeVar

T = TypeVar("T")

PLAIN = "plain"  # dataclass field metadata key: False keeps the field out of the plain form


def _plain_input(data: Any) -> Any:
  """A ConfigDict (or anything with `to_dict`) as plain dicts."""
  return data.to_dict() if hasattr(data, "to_dict") and not dataclasses.is_dataclass(data) else data


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
  return typing.get_type_hints(cls)


def plain_fields(cls_or_obj: Any) -> list[dataclasses.Field]:
  """The fields of a dataclass that have a plain form (all but those with `PLAIN: False` metadata)."""
  return [f for f in dataclasses.fields(cls_or_obj) if f.metadata.get(PLAIN, True)]


def _describe(tp: Any) -> str:
  if isinstance(tp, type) and issubclass(tp, enum.Enum):
    return "one of " + ", ".join(repr(m.value) for m in tp)
  if tp is bool:
    return "True or False"
  if tp is int:
    return "an integer"
  if tp is float:
    return "a number"
  if tp is str:
    return "a string"
  if dataclasses.is_dataclass(tp):
    return f"a mapping of {tp.__name__} fields"
  origin = typing.get_origin(tp)
  if origin in (tuple, list):
    return "a list"
  if origin in (dict, Mapping) or tp in (dict, Mapping):
    return "a mapping"
  return str(tp)


def _pairs_type(tp: Any) -> Any | None:
  """X when `tp` is tuple[tuple[str, X], ...] (named pairs), else None."""
  if typing.get_origin(tp) is tuple:
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis and typing.get_origin(args[0]) is tuple:
      inner = typing.get_args(args[0])
      if len(inner) == 2 and inner[0] is str:
        return inner[1]
  return None


def _join(where: str, key: Any) -> str:
  return f"{where}.{key}" if where else str(key)


def _convert(tp: Any, value: Any, default: Any, where: str) -> Any:  # noqa: C901
  """`value` converted to type `tp` (`default`: the current value, the base of a nested dataclass)."""
  value = _plain_input(value)
  if tp is Any or tp is object:
    return value
  origin = typing.get_origin(tp)
  if origin in (typing.Union, types.UnionType):
    members = typing.get_args(tp)
    if value is None:
      if type(None) in members:
        return None
      raise ValueError(f"{where}=None: give {' or '.join(_describe(m) for m in members)}.")
    # The first member whose shape fits the value (a mapping for Mapping or named pairs, a list for a tuple, ...).
    errors = []
    for member in (m for m in members if m is not type(None)):
      try:
        return _convert(member, value, default, where)
      except ValueError as e:
        errors.append(str(e))
    raise ValueError(errors[0])
  if isinstance(tp, type) and issubclass(tp, enum.Enum):
    if isinstance(value, tp):
      return value
    choices = {str(m.value).lower(): m for m in tp}
    key = str(value.value if isinstance(value, enum.Enum) else value).lower()
    if key not in choices:
      raise ValueError(f"{where}={value!r} is not {_describe(tp)}.")
    return choices[key]
  if tp is bool:
    if not isinstance(value, bool):
      raise ValueError(f"{where}={value!r} must be True or False.")
    return value
  if tp is int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
      raise ValueError(f"{where}={value!r} must be an integer.")
    return int(value)
  if tp is float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      raise ValueError(f"{where}={value!r} must be a number.")
    return float(value)
  if tp is str:
    if not isinstance(value, str):
      raise ValueError(f"{where}={value!r} must be a string.")
    return value
  if dataclasses.is_dataclass(tp):
    if isinstance(value, tp):
      return value
    if not isinstance(value, Mapping):
      raise ValueError(f"{where}={value!r} must be {_describe(tp)}.")
    base = default if isinstance(default, tp) else tp()
    return from_plain(base, value, where)
  pairs = _pairs_type(tp)
  if pairs is not None and isinstance(value, Mapping):
    return tuple((str(k), _convert(pairs, v, None, _join(where, k))) for k, v in value.items())
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise ValueError(f"{where}={value!r} must be a list.")
    args = typing.get_args(tp)
    if len(args) == 2 and args[1] is Ellipsis:
      return tuple(_convert(args[0], v, None, f"{where}[{i}]") for i, v in enumerate(value))
    if args and len(args) != len(value):
      raise ValueError(f"{where}={list(value)!r} must hold {len(args)} items.")
    return tuple(_convert(a, v, None, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value))) if args else \
        tuple(value)
  if origin in (dict, collections.abc.Mapping) or tp in (dict, Mapping):
    if not isinstance(value, Mapping):
      raise ValueError(f"{where}={value!r} must be a mapping.")
    args = typing.get_args(tp)
    item_tp = args[1] if len(args) == 2 else Any
    old = default if isinstance(default, Mapping) else {}
    return {str(k): _convert(item_tp, v, old.get(k), _join(where, k)) for k, v in value.items()}
  if isinstance(tp, type) and not isinstance(value, tp):
    raise ValueError(f"{where}={value!r} must be a {tp.__name__}.")
  return value


def from_plain(default: T, data: Mapping[str, Any] | None, where: str) -> T:
  """`default` (a dataclass instance) with the fields `data` names replaced, each converted to its declared type.

  Args:
    default: the values of every field `data` leaves out.
    data: a mapping (dict, ConfigDict) of field names to plain values; None or empty keeps `default`.
    where: the dotted path of this section in the run config, for errors ("rl", "actors").

  Raises:
    ValueError: one sentence naming the key and what is allowed (an unknown field, a value of the wrong type, or
      the dataclass's own check of the converted values).
  """
  data = _plain_input(data)
  if data is None:
    return default
  if not isinstance(data, Mapping):
    raise ValueError(f"{where or 'the config'}={data!r} must be a mapping of {type(default).__name__} fields.")
  known = {f.name: f for f in plain_fields(default)}
  unknown = sorted(set(map(str, data)) - set(known))
  if unknown:
    raise ValueError(f"{where or 'the config'} has no field {', '.join(map(repr, unknown))}; its fields are "
                     f"{', '.join(sorted(known))}.")
  hints = _hints(type(default))
  changes = {k: _convert(hints[k], v, getattr(default, k), _join(where, k)) for k, v in data.items()}
  try:
    return dataclasses.replace(default, **changes)
  except (ValueError, TypeError) as e:
    raise ValueError(f"{where}: {e}" if where else str(e)) from None


def to_plain(obj: Any, tp: Any = None) -> Any:
  """The plain form of `obj` (dataclasses as dicts of their plain fields, enums by value, tuples as lists, named
  pairs as dicts): JSON-serializable, and `from_plain` of it gives `obj` back."""
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    hints = _hints(type(obj))
    return {f.name: to_plain(getattr(obj, f.name), hints[f.name]) for f in plain_fields(obj)}
  if isinstance(obj, enum.Enum):
    return obj.value
  if isinstance(obj, Mapping):
    return {str(k): to_plain(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    members = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    if any(_pairs_type(m) is not None for m in members) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], str) for p in obj):
      return {k: to_plain(v) for k, v in obj}
    return [to_plain(v) for v in obj]
  return obj


def flatten(plain: Any, prefix: str = "") -> dict[str, Any]:
  """{dotted key: leaf} of a plain config (empty mappings and lists are leaves): the golden-snapshot form."""
  if isinstance(plain, Mapping) and plain:
    out = {}
    for k in sorted(plain):
      out.update(flatten(plain[k], f"{prefix}.{k}" if prefix else str(k)))
    return out
  return {prefix: plain}


def _tuples(plain: Any) -> Any:
  if isinstance(plain, Mapping):
    return {k: _tuples(v) for k, v in plain.items()}
  if isinstance(plain, list):
    return tuple(_tuples(v) for v in plain)
  return plain


def to_config_dict(obj: Any):
  """`obj` (a dataclass or plain data) as an ml_collections ConfigDict, lists as tuples: a tuple field is then a
  command-line override (`--config.rl.pass_k='(1, 4, 8)'`), which ml_collections refuses for lists."""
  import ml_collections  # only run configs need it
  return ml_collections.ConfigDict(_tuples(to_plain(obj)))


_NAMES = r"[a-z_][a-z0-9_]*(?:\s*[,/]\s*[a-z_][a-z0-9_]*)*"  # "a", "a, b", "a / b"
_ENTRY = re.compile(rf"^(\s*)({_NAMES}):\s+(.*)$")
_INNER_ENTRY = re.compile(rf"(?:;|\.)\s+(?:or\s+)?({_NAMES}):\s+")  # "a: text; b: text", "a: text. b / c: text"


def _names(group: str) -> list[str]:
  return [n.strip() for n in re.split(r"[,/]", group)]


def _first_sentence(text: str) -> str:
  return re.split(r"(?<!e\.g\.)(?<!i\.e\.)(?<=[.;])\s+(?=[A-Z(`])", text.strip(), maxsplit=1)[0].rstrip("; ")


def field_docs(cls: type) -> dict[str, str]:
  """{field name: the first sentence of its entry} from the "Attributes:" sections of `cls`'s docstring and its
  bases' (an entry "a, b: text" documents both; "a: text; b: text" each)."""
  docs: dict[str, str] = {}
  names = {f.name for f in dataclasses.fields(cls)}
  for klass in reversed(cls.__mro__):
    text = (klass.__dict__.get("__doc__") or "").expandtabs()
    lines = text.splitlines()
    try:
      start = next(i for i, line in enumerate(lines) if line.strip() == "Attributes:")
    except StopIteration:
      continue
    entries: list[list[str]] = []  # [names, text]
    indent = None
    for line in lines[start + 1:]:
      if not line.strip():
        if entries:
          break
        continue
      m = _ENTRY.match(line)
      if m and (indent is None or len(m.group(1)) == indent):
        indent = len(m.group(1))
        entries.append([m.group(2), m.group(3)])
      elif entries:
        entries[-1][1] += " " + line.strip()
    for head, body in entries:
      # Several fields in one entry ("a: text; b: text"): split where a field's name follows a semicolon or a stop.
      cuts = [m for m in _INNER_ENTRY.finditer(body) if all(n in names for n in _names(m.group(1)))]
      groups = [head] + [m.group(1) for m in cuts]
      starts = [0] + [m.end() for m in cuts]
      ends = [m.start() + 1 for m in cuts] + [len(body)]
      for group, a, b in zip(groups, starts, ends):
        for name in _names(group):
          docs[name] = _first_sentence(body[a:b])
  return docs


@dataclasses.dataclass(frozen=True)
class FieldHelp:
  """One leaf of a run config: its dotted key, its value, the dataclass's default (`NO_DEFAULT` when the field has
  none of its own, e.g. inside a free-form mapping) and the first sentence of its docstring entry."""

  key: str
  value: Any
  default: Any
  doc: str


NO_DEFAULT = object()


def _field_default(field: dataclasses.Field) -> Any:
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return NO_DEFAULT


def field_help(obj: Any, default: Any = NO_DEFAULT, prefix: str = "") -> list[FieldHelp]:
  """Every leaf field of the dataclass `obj` (sections recursively, mappings by their keys), in declaration order,
  with its plain value, its default (that of `default`, a dataclass instance of the same type, else the field's own)
  and its doc: generated from the dataclasses, what an entry point's `--config_help` prints."""
  out = []
  hints = _hints(obj.__class__)  # (not type(obj): mypy finds type[Any] unhashable for the cache)
  docs = field_docs(type(obj))
  # A field without an entry of its own is described by its section's first line.
  own = (type(obj).__doc__ or "").strip()
  generated = own.startswith(f"{type(obj).__name__}(")  # dataclasses' stand-in for a missing docstring
  summary = "" if generated or not own else _first_sentence(own.splitlines()[0])
  for f in plain_fields(obj):
    key = f"{prefix}.{f.name}" if prefix else f.name
    value = getattr(obj, f.name)
    if default is not NO_DEFAULT and dataclasses.is_dataclass(default):
      base = getattr(default, f.name)
    else:
      base = _field_default(f)
    doc = docs.get(f.name) or summary
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
      out.extend(field_help(value, base if type(base) is type(value) else NO_DEFAULT, key))
      continue
    if isinstance(value, Mapping) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
      bases = base if isinstance(base, Mapping) else {}
      for k, v in value.items():  # e.g. phases.<name>: a section per key
        out.extend(field_help(v, bases.get(k, NO_DEFAULT), f"{key}.{k}"))
      continue
    plain = to_plain(value, hints[f.name])
    plain_base = NO_DEFAULT if base is NO_DEFAULT else to_plain(base, hints[f.name])
    if isinstance(plain, Mapping) and plain:
      bases = plain_base if isinstance(plain_base, Mapping) else {}
      for k, v in flatten(plain, key).items():
        out.append(FieldHelp(k, v, flatten(bases, key).get(k, NO_DEFAULT), doc))
      continue
    out.append(FieldHelp(key, plain, plain_base, doc))
  return out
