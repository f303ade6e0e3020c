"""Deciding recorded checks on the host: the judge's canonical forms back to plain values, and unittest's semantics.

  holds = decide(kind, payload)   # one check as the judge recorded it (c2jax/envs/grading/judge.py, `record_check`)

The judge records each assertion's operands in canonical form (`judge.canonical`: exact built-in types only; a
subclass, an object with its own `__eq__` or anything past the size bounds is opaque). Here, in plain Python on the
host, each check is decided again; the judge's in-process verdict counts for nothing. The rule:

  * equality is Python's on plain values, made type-strict where Python is loose: a bool equals only a bool (True
    is not 1: an int-versus-bool task must not pass by accident), while int and float compare by value as Python
    does (100 == 100.0, a reference that returns 100.0 where the test says 100 passes); -0.0 == 0.0; NaN equals
    nothing (not even itself inside a list, where unittest's identity shortcut would pass); str and bytes never
    equal each other; a list never equals a tuple; set and frozenset compare as Python does (equal when they hold
    equal elements); dicts and sets compare by element under the same rule;
  * an instance of a class defined in Python (all of whose bases are too) equals another when both are of the
    same class (by qualified name) and their states (instance dict and slots) are equal under the same rule: the
    submission's `__eq__` is never asked, so an always-equal object equals nothing it does not hold the state of;
  * an opaque operand (a subclass of a built-in type, a function, a C-level object) fails every check that needs
    its value. Where unittest's own semantics ask the object
    itself (membership in an opaque container, the truth of an opaque value, `is`), the fact the judge took
    in-process is used: that is the submitted object's behaviour, which the test asked about;
  * assertIsInstance and assertRaises compare qualified class names (module.qualname) of the recorded MRO;
  * assertRegex and assertRaisesRegex run `re.search` here, on the recorded text, with the pattern the test
    holds where it is a literal (the host read it from the source: a recorded pattern that differs is
    malformed, so a forged report cannot hand the host a pattern that backtracks for hours); a pattern the
    test computes at run time is taken as recorded.

A compare record (a comparison in an asserted position: `assert a == b`, `assertTrue(a in b)`) is decided by
`compare_agrees`: each pair's truth as Python gave it in-process must be what the rule above gives on the plain
operands (==, != and the orders by value; in as assertIn; `is` by the recorded truth, which no object can bend,
but on None and bools); an undecidable pair (an opaque operand) does not agree. So an `__eq__` that always holds
fails wherever its truth was asserted, and so does `not (a != b)` over an `__ne__` that never holds.

Malformed payloads (what no judge writes) raise `Malformed`; the grader counts them as detected hack attempts.
"""

from __future__ import annotations

import fractions
import math
import re
from typing import Any

from c2jax.envs.grading import judge


class Malformed(ValueError):
  """A recorded check that the judge cannot have written (a forged or corrupted report)."""


class _Unique:
  """Stands for an opaque value or a NaN inside a key: equal to nothing but itself (each decode makes a new one)."""

  __slots__ = ()


class Opaque:
  """A decoded opaque operand (`reason` says what it was)."""

  __slots__ = ("reason",)

  def __init__(self, reason: str):
    self.reason = reason

  def __repr__(self) -> str:
    return f"Opaque({self.reason!r})"


def decode(form: Any, depth: int = 0) -> Any:  # noqa: C901
  """The plain value of a canonical form: tuples, sets and dicts as such (dicts as lists of pairs under "d")."""
  if depth > 64:
    raise Malformed("too deep")
  t = type(form)
  if form is None or t in (bool, int, str):
    return form
  if t is list:
    return [decode(e, depth + 1) for e in form]
  if t is not dict or len(form) != 1:
    raise Malformed(f"not a canonical form: {t.__name__}")
  (tag, body), = form.items()
  if tag == "o":
    return Opaque(str(body))
  if tag == "I" and type(body) is str and re.fullmatch(r"-?0x[0-9a-f]+", body) and len(body) < 5000:
    return int(body, 16)
  if tag == "f" and type(body) is str and len(body) < 40:
    try:
      return float(body)
    except ValueError as e:
      raise Malformed("bad float") from e
  if tag == "b" and type(body) is str:
    try:
      return bytes.fromhex(body)
    except ValueError as e:
      raise Malformed("bad bytes") from e
  if type(body) is not list:
    raise Malformed(f"bad canonical form {tag!r}")
  if tag == "t":
    return tuple(decode(e, depth + 1) for e in body)
  if tag in ("s", "S"):
    items = [decode(e, depth + 1) for e in body]
    return _PlainSet(items, frozen=tag == "S")
  if tag == "d":
    if not all(type(p) is list and len(p) == 2 for p in body):
      raise Malformed("bad dict")
    return _PlainDict([(decode(k, depth + 1), decode(v, depth + 1)) for k, v in body])
  if tag == "O":
    if not (len(body) == 2 and type(body[0]) is str and type(body[1]) is list
            and all(type(p) is list and len(p) == 2 and type(p[0]) is str for p in body[1])):
      raise Malformed("bad object")
    return PlainObject(body[0], tuple((k, decode(v, depth + 1)) for k, v in body[1]))
  raise Malformed(f"bad canonical form {tag!r}")


class _PlainSet(list):
  """A decoded set: its elements in a list (hashing them here would merge True with 1)."""

  def __init__(self, items, frozen: bool):
    super().__init__(items)
    self.frozen = frozen


class _PlainDict(list):
  """A decoded dict: its (key, value) pairs."""


class PlainObject:
  """A decoded instance of a class defined in Python: its class's qualified name and its attributes."""

  __slots__ = ("name", "state")

  def __init__(self, name: str, state: tuple):
    self.name, self.state = name, state

  def __repr__(self) -> str:
    return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.state)})"


def key(value: Any) -> Any:
  """A hashable stand-in for a decoded value: key(a) == key(b) exactly when a equals b under the module's rule."""
  t = type(value)
  if value is None:
    return ("N",)
  if t is bool:
    return ("B", value)
  if t is int:
    return ("n", fractions.Fraction(value))
  if t is float:
    if math.isnan(value) or math.isinf(value):
      return ("n", value) if math.isinf(value) else _Unique()
    return ("n", fractions.Fraction(value))
  if t is str:
    return ("u", value)
  if t is bytes:
    return ("y", value)
  if t is list:
    return ("l", tuple(key(e) for e in value))
  if t is tuple:
    return ("t", tuple(key(e) for e in value))
  if t is _PlainSet:
    return ("s", frozenset(key(e) for e in value))
  if t is _PlainDict:
    return ("d", frozenset((key(k), key(v)) for k, v in value))
  if t is PlainObject:
    return ("O", value.name, frozenset((k, key(v)) for k, v in value.state))
  return _Unique()  # Opaque


def _has_opaque(value: Any) -> bool:
  if isinstance(value, Opaque):
    return True
  if type(value) in (list, tuple, _PlainSet):
    return any(_has_opaque(e) for e in value)
  if type(value) is _PlainDict:
    return any(_has_opaque(k) or _has_opaque(v) for k, v in value)
  if type(value) is PlainObject:
    return any(_has_opaque(v) for _, v in value.state)
  return False


def equal(a: Any, b: Any) -> bool:
  """Equality under the module's rule; False when either side holds an opaque value."""
  return not (_has_opaque(a) or _has_opaque(b)) and key(a) == key(b)


def _number(v: Any) -> bool:
  return type(v) in (int, float)


def _python(value: Any) -> Any:
  """A decoded value as the Python value it stood for (for ordering, membership in str and len)."""
  if type(value) is _PlainSet:
    return frozenset(_python(e) for e in value) if value.frozen else {_python(e) for e in value}
  if type(value) is _PlainDict:
    return {_python(k): _python(v) for k, v in value}
  if type(value) is list:
    return [_python(e) for e in value]
  if type(value) is tuple:
    return tuple(_python(e) for e in value)
  return value


def _almost_equal(first: Any, second: Any, places: Any, delta: Any) -> bool:
  if equal(first, second):
    return True
  if not (_number(first) and _number(second)):
    return False
  diff = abs(first - second)
  if delta is not None:
    return _number(delta) and diff <= delta
  places = 7 if places is None else places
  return type(places) is int and round(diff, places) == 0


def _contains(member: Any, container: Any, facts: dict) -> bool | None:
  """`member in container`, or None when it cannot be decided (an opaque member or container without a fact)."""
  if isinstance(container, (Opaque, PlainObject)):
    fact = facts.get("contains")
    return fact if type(fact) is bool else None
  if type(container) is str:
    return member in container if type(member) is str else None
  if type(container) is bytes:
    return member in container if type(member) in (bytes, int) and type(member) is not bool else None
  if _has_opaque(member):
    return None
  if type(container) is _PlainDict:
    return any(equal(member, k) for k, _ in container)
  if type(container) in (list, tuple, _PlainSet):
    return any(equal(member, e) for e in container)
  return None


def _truth(value: Any, facts: dict) -> bool | None:
  if isinstance(value, (Opaque, PlainObject)):
    fact = facts.get("truth")
    return fact if type(fact) is bool else None
  if _has_opaque(value):
    return bool(len(value)) if type(value) in (list, tuple, _PlainSet, _PlainDict) else None
  return bool(_python(value))


def _compare(op: str, a: Any, b: Any) -> bool:
  if _has_opaque(a) or _has_opaque(b) or type(a) is bool or type(b) is bool:
    return False
  if not ((_number(a) and _number(b)) or (type(a) is type(b) and type(a) in (str, bytes, list, tuple))):
    return False
  a, b = _python(a), _python(b)
  try:
    return {">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}[op]
  except TypeError:
    return False


def _search(pattern: Any, text: Any, flags: Any = 0) -> bool | None:
  if type(text) is not str or type(pattern) is not str or type(flags) is not int:
    return None
  try:
    return re.search(pattern, text, flags) is not None
  except re.error:
    return None


def _count_equal(a: Any, b: Any) -> bool:
  if type(a) not in (list, tuple, _PlainSet, _PlainDict, str) or type(b) not in (list, tuple, _PlainSet, str):
    return False
  if _has_opaque(a) or _has_opaque(b):
    return False
  items = lambda v: [k for k, _ in v] if type(v) is _PlainDict else list(v)
  counts: dict = {}
  for e in items(a):
    counts[key(e)] = counts.get(key(e), 0) + 1
  for e in items(b):
    counts[key(e)] = counts.get(key(e), 0) - 1
  return all(c == 0 for c in counts.values())


_TYPED_EQUAL = {"assertListEqual": (list,), "assertTupleEqual": (tuple,), "assertDictEqual": (_PlainDict,),
                "assertSetEqual": (_PlainSet,), "assertMultiLineEqual": (str,),
                "assertSequenceEqual": (list, tuple, str)}


def _raises(payload: dict) -> bool:
  expected, raised = payload.get("expected"), payload.get("raised")
  if type(expected) is not list or not all(type(n) is str for n in expected):
    raise Malformed("bad assertRaises record")
  if raised is None:
    return False
  if type(raised) is not list or not all(type(n) is str for n in raised):
    raise Malformed("bad assertRaises record")
  if not set(expected) & set(raised):
    return False
  if "regex" in payload:
    return bool(_search(decode(payload["regex"]), decode(payload.get("message"))))
  return True


_SINGLETON = (type(None), bool)


def _pair(op: str, a: Any, b: Any, truth: bool) -> bool | None:
  """`a op b` under the module's rule, or None where the plain values cannot decide it. Where Python's semantics ask
  the object itself (`is` on non-singletons, membership in an object) the truth recorded in-process stands."""
  if op in ("==", "!="):
    if _has_opaque(a) or _has_opaque(b):
      return None
    return equal(a, b) == (op == "==")
  if op in ("<", "<=", ">", ">="):
    if _has_opaque(a) or _has_opaque(b) or type(a) is bool or type(b) is bool:
      return None
    if type(a) is _PlainSet and type(b) is _PlainSet:  # subset order, by elements under the module's rule
      a, b = frozenset(key(e) for e in a), frozenset(key(e) for e in b)
      return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    if not ((_number(a) and _number(b)) or (type(a) is type(b) and type(a) in (str, bytes, list, tuple))):
      return None
    try:
      return {"<": _python(a) < _python(b), "<=": _python(a) <= _python(b), ">": _python(a) > _python(b),
              ">=": _python(a) >= _python(b)}[op]
    except TypeError:
      return None
  if op in ("is", "is not"):
    if type(a) in _SINGLETON or type(b) in _SINGLETON:  # identity of None, True, False: type-strict equality
      return (type(a) is type(b) and a == b) == (op == "is")
    return truth  # no object can make `is` lie
  if op in ("in", "not in"):
    inside = _contains(a, b, {"contains": truth if op == "in" else not truth})
    return None if inside is None else inside == (op == "in")
  raise Malformed(f"unknown comparison operator {op!r}")


def compare_agrees(payload: Any, ops: tuple[str, ...]) -> bool:
  """Whether a compare record (the operands of a comparison chain and the truth Python gave each pair) is what the
  host gets on the plain values: False where a pair's truth differs from the host's, where the host cannot decide
  it (an opaque operand), or where a comparison raised. An always-equal `__eq__` is caught here.

  Raises:
    Malformed: the payload is not what the judge records for a chain of `ops`.
  """
  if type(payload) is not dict or type(payload.get("args")) is not list or type(payload.get("truths")) is not list:
    raise Malformed("bad compare record")
  truths = payload["truths"]
  values = [decode(a) for a in payload["args"]]
  if (not all(type(t) is bool for t in truths) or len(values) != len(truths) + 1 or len(truths) > len(ops)
      or not all(truths[:-1])):
    raise Malformed("a compare record that is no evaluation of its chain")
  if not truths or (truths[-1] and len(truths) < len(ops)):
    return False  # a comparison raised: the test errored
  return all(_pair(op, values[i], values[i + 1], truth) == truth for i, (op, truth) in enumerate(zip(ops, truths)))


def decide(kind: str, payload: Any, pattern: str | None = None, ops: tuple[str, ...] | None = None  # noqa: C901
           ) -> bool:
  """Whether the recorded check holds (see the module docstring); for a compare record, whether it agrees.

  Args:
    kind: the assertion the host wrote for this check id.
    payload: what the judge recorded.
    pattern: the literal pattern the test holds for this check (a regex kind), when the host knows it: a recorded
      pattern that differs is malformed, so no pattern of the submission's choosing runs here.
    ops: a compare record's operators, as the host read them from the source.

  Raises:
    Malformed: the payload is not what the judge records for `kind`.
  """
  if type(payload) is not dict:
    raise Malformed("a check's payload is not an object")
  if kind == "compare":
    if ops is None:
      raise Malformed("a compare record of no comparison")
    return compare_agrees(payload, ops)
  if pattern is not None:
    args = payload.get("args")
    recorded = payload.get("regex") if kind == "assertRaisesRegex" else (
        args[1] if type(args) is list and len(args) > 1 else None)
    if decode(recorded) != pattern:
      raise Malformed("a pattern the test does not hold")
  if kind == "assertRaises" and "regex" in payload:
    raise Malformed("a pattern in an assertRaises record")
  if kind in ("assertRaises", "assertRaisesRegex"):
    return _raises(payload)
  if kind == "fail":
    return False
  args, kw, facts = payload.get("args"), payload.get("kw", {}), payload.get("facts", {})
  if type(args) is not list or type(kw) is not dict or type(facts) is not dict:
    raise Malformed("bad check record")
  values = [decode(a) for a in args]
  if len(values) != judge.ARITY.get(kind, -1):
    raise Malformed(f"a {kind} record with {len(values)} operands")
  if kind == "assertEqual":
    return equal(*values)
  if kind in _TYPED_EQUAL:
    a, b = values
    if kind == "assertSequenceEqual" and "seq_type" in kw:
      return False  # a seq_type names a class: opaque to the host
    types = _TYPED_EQUAL[kind]
    return type(a) in types and type(b) in types and equal(a, b)
  if kind == "assertNotEqual":
    a, b = values
    return not (_has_opaque(a) or _has_opaque(b)) and key(a) != key(b)
  if kind == "assertCountEqual":
    return _count_equal(*values)
  if kind in ("assertTrue", "assertFalse", "assert"):
    truth = _truth(values[0], facts)
    return truth is not None and truth == (kind != "assertFalse")
  if kind in ("assertIsNone", "assertIsNotNone"):
    return (values[0] is None) == (kind == "assertIsNone")
  if kind in ("assertIs", "assertIsNot"):
    a, b = values
    if any(v is None or type(v) is bool for v in (a, b)):  # singletons: identity is type-strict equality
      same = type(a) is type(b) and a == b
    else:
      same = facts.get("same")
      if type(same) is not bool:
        raise Malformed("an assertIs record without its fact")
    return same == (kind == "assertIs")
  if kind in ("assertIn", "assertNotIn"):
    inside = _contains(values[0], values[1], facts)
    return inside is not None and inside == (kind == "assertIn")
  if kind in ("assertIsInstance", "assertNotIsInstance"):
    mro, classes = facts.get("mro"), facts.get("classes")
    if type(mro) is not list or type(classes) is not list:
      raise Malformed("an assertIsInstance record without its facts")
    return bool(set(map(str, mro)) & set(map(str, classes))) == (kind == "assertIsInstance")
  if kind in ("assertAlmostEqual", "assertNotAlmostEqual"):
    places, delta = decode(kw.get("places")), decode(kw.get("delta"))
    close = _almost_equal(values[0], values[1], places, delta)
    if kind == "assertNotAlmostEqual":
      return not close and not (_has_opaque(values[0]) or _has_opaque(values[1]))
    return close
  if kind in ("assertGreater", "assertGreaterEqual", "assertLess", "assertLessEqual"):
    op = {"assertGreater": ">", "assertGreaterEqual": ">=", "assertLess": "<", "assertLessEqual": "<="}[kind]
    return _compare(op, *values)
  if kind in ("assertRegex", "assertNotRegex"):
    found = _search(values[1], values[0], decode(kw.get("flags", 0)))
    return found is not None and found == (kind == "assertRegex")
  raise Malformed(f"unknown check kind {kind!r}")
