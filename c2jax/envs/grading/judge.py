"""The judge: the script that runs a task's hidden tests inside the grading sandbox and records what they checked.

Grading (c2jax/envs/grading/grading.py) runs this file's source as `python3 -I -B -c <source>` in a fresh sandbox
holding the submission (and no hidden test file: they never touch the sandbox's disk), and feeds it one JSON document on
stdin (`{"nonce", "modules", "tests"}`: the hidden modules' sources, already rewritten by the host, see
c2jax/envs/grading/instrument.py, and the names of those that hold tests; grading by named tests adds "select", the ids
of the tests to run, every other test of those modules is left out). The judge

  1. reads the whole document before any submitted code is imported, leaves stdin at /dev/null for the tests, and
     keeps the real stdout (fd 1) for its report alone (the tests' own stdout goes to stderr);
  2. puts the repository root (the cwd, /work) LAST on sys.path, so a submitted `inspect.py` or `signal.py` does not
     replace the stdlib module a hidden test imports later (`-I` already keeps it off the path at startup);
  3. snapshots what the verdict's way depends on (the unittest framework's classes and modules, builtins, json,
     os, sys.modules' entries for them, this script's own globals), then serves the hidden modules from memory:
     it compiles and executes each into a module object it creates and registers itself (a meta path finder
     serves hidden helper modules imported by name), with `__c2jax_check__` (the recorder) in its globals. A
     hidden module that some other object has replaced in sys.modules is reported as planted and not run. A hidden
     module whose package is not hidden (a named test module of the repository, `pkg/tests/test_x.py`) imports
     that package from the repository first, as `import pkg.tests.test_x` would; a package directory that holds
     nothing on disk (a namespace package whose only module is served from memory) becomes an empty namespace
     package of that directory;
  4. runs the tests with unittest's runner. Every `self.assertXxx(...)` of the hidden tests was rewritten to
     `__c2jax_check__(self, check_id, "assertXxx", ...)`: the recorder records the operands in canonical plain form
     (`canonical`: exact built-in types only, matched with `type(x) is ...`; anything else is opaque) plus the
     facts the host cannot rebuild (identity for assertIs, membership in or truth of an opaque object, class names
     for assertIsInstance), then runs unittest's own assertion (as captured at startup) so that a failing test still
     stops where unittest would stop it. `assertRaises`/`assertRaisesRegex` (with or callable form) record the raised
     exception's class names (its MRO), its message and the expected class names, and suppress it as unittest does.
     An `assert E` statement records E like assertTrue and returns its truth to the statement; a comparison in an
     asserted position records its operands and the truth Python gave each pair (the host must get the same on the
     plain values), and all()/any() there are this script's own, captured at startup;
  5. compares the snapshot with the state after the tests (every changed or deleted entry is a finding), and writes
     `<nonce> <report>` to the saved stdout with functions captured at startup, then exits at once (`os._exit`: no
     atexit handler or leftover thread of the submission runs after the report).

The report (`REPORT_KEYS`): per test its id, status (ok, fail, error, skip, xfail, xfail_error, unexpected) and
recorded checks; fixture errors outside any test; hidden modules that failed to import; planted modules; integrity
findings. The judge decides nothing: the host's comparator (c2jax/envs/grading/canonical.py) decides every check, and
the host's canary tests (which an honest solution fails) catch blanket forgeries.

Everything this script does is advisory against a submission that sets out to attack it: the hidden tests import
submitted code into this interpreter, which can walk frames, read the nonce, patch the recorder or print a report
of its own. What makes the verdict robust is outside: the checks are decided on plain values by the host, opaque
values fail, and forging a report that passes the real tests but not the canaries needs to know which is which.

Stdlib only: this file runs under the sandbox's system python3, never imported there (the host imports it for its
constants and, in tests, its canonical form).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import json.encoder
import os
import re
import sys
import unittest
import unittest.case
import unittest.loader
import unittest.result
import unittest.runner
import unittest.suite

REPORT_KEYS = ("fixtures", "imports", "integrity", "planted", "tests")
RECORDER = "__c2jax_check__"
# Bounds of one operand's canonical form: beyond them it is opaque (and fails), never truncated.
MAX_NODES = 20_000
MAX_DEPTH = 32
MAX_CHARS = 200_000
INT_DIGITS_HEX = 4096  # ints of more hex digits are opaque
# How many positional operands each assertion decides on (msg and the rest are never recorded).
ARITY = {
    "assertEqual": 2, "assertNotEqual": 2, "assertListEqual": 2, "assertTupleEqual": 2, "assertDictEqual": 2,
    "assertSetEqual": 2, "assertSequenceEqual": 2, "assertMultiLineEqual": 2, "assertCountEqual": 2,
    "assertTrue": 1, "assertFalse": 1, "assertIs": 2, "assertIsNot": 2, "assertIsNone": 1, "assertIsNotNone": 1,
    "assertIn": 2, "assertNotIn": 2, "assertIsInstance": 2, "assertNotIsInstance": 2,
    "assertAlmostEqual": 2, "assertNotAlmostEqual": 2, "assertGreater": 2, "assertGreaterEqual": 2,
    "assertLess": 2, "assertLessEqual": 2, "assertRegex": 2, "assertNotRegex": 2,
    "assertRaises": 1, "assertRaisesRegex": 2, "fail": 0, "assert": 1,
}
# A comparison in an asserted position ("compare": the operators, then the operands, those past the second as
# thunks) is recorded apart: every pair's operands and the truth Python gave it.
COMPARE = "compare"
# all() and any() over a comprehension in an asserted position are the judge's own (captured below), unrecorded.
AGGREGATES = ("all", "any")
RAISES = ("assertRaises", "assertRaisesRegex")

# Captured before any submitted code runs: the recorder and the report use these, not the names a test may patch.
_type, _len, _str, _bool, _sorted, _all, _any = type, len, str, bool, sorted, all, any
_isinstance, _issubclass, _getattr, _hex = isinstance, issubclass, getattr, hex
_encode_str = json.encoder.encode_basestring_ascii
_os_write, _os_exit = os.write, os._exit
_TESTCASE = unittest.TestCase
_ORIGINAL = {k: _getattr(unittest.TestCase, k) for k in ARITY if k not in RAISES and k != "assert"}
_NONE_T, _BOOL, _INT, _FLOAT, _STR, _BYTES = _type(None), bool, int, float, str, bytes
_LIST, _TUPLE, _DICT, _SET, _FROZENSET, _OBJECT = list, tuple, dict, set, frozenset, object
_PATTERN = re.Pattern
_re_search = re.search
_OPS = {"==": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b, ">=": lambda a, b: a >= b, "is": lambda a, b: a is b,
        "is not": lambda a, b: a is not b, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b}


def _class_name(cls):
  try:
    return f"{cls.__module__}.{cls.__qualname__}"
  except Exception:  # noqa: BLE001  (a class with odd attributes)
    return "?"


def _class_names(spec):
  """The qualified names of a class or a tuple of classes (assertIsInstance, assertRaises)."""
  if _type(spec) is _TUPLE:
    return [_class_name(c) for c in spec]
  return [_class_name(spec)]


def _mro_names(cls):
  try:
    return [_class_name(c) for c in _type.__dict__["__mro__"].__get__(cls)]
  except Exception:  # noqa: BLE001
    return []


class _Budget:
  """Nodes and characters left for one operand."""

  def __init__(self):
    self.nodes, self.chars = MAX_NODES, MAX_CHARS


class _Opaque(Exception):
  pass


def _float_text(x):
  return float.__repr__(x)


def _canon(x, budget, depth):
  budget.nodes -= 1
  if budget.nodes < 0 or depth > MAX_DEPTH:
    raise _Opaque("too big")
  t = _type(x)
  if t is _NONE_T or t is _BOOL:
    return x
  if t is _INT:
    if -(1 << 62) < x < (1 << 62):
      return x
    text = _hex(x)
    if _len(text) > INT_DIGITS_HEX:
      raise _Opaque("int too big")
    return {"I": text}
  if t is _FLOAT:
    return {"f": _float_text(x)}
  if t is _STR:
    budget.chars -= _len(x)
    if budget.chars < 0:
      raise _Opaque("too big")
    return x
  if t is _BYTES:
    budget.chars -= 2 * _len(x)
    if budget.chars < 0:
      raise _Opaque("too big")
    return {"b": _BYTES.hex(x)}
  if t is _LIST:
    return [_canon(e, budget, depth + 1) for e in _LIST.copy(x)]
  if t is _TUPLE:
    return {"t": [_canon(e, budget, depth + 1) for e in x]}
  if t is _DICT:
    items = [[_canon(k, budget, depth + 1), _canon(v, budget, depth + 1)] for k, v in _DICT.items(_DICT.copy(x))]
    return {"d": _sorted(items, key=_dump)}
  if t is _SET or t is _FROZENSET:
    items = _sorted([_canon(e, budget, depth + 1) for e in x], key=_dump)
    return {"s" if t is _SET else "S": items}
  return _canon_object(x, t, budget, depth)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined by Python code, not by the interpreter or a C extension
_object_getattribute = object.__getattribute__
_MRO = _type.__dict__["__mro__"]
_FLAGS = _type.__dict__["__flags__"]


def _canon_object(x, t, budget, depth):
  """An instance of a class defined in Python (no built-in base but object) as its class name and its state."""
  mro = _MRO.__get__(t)
  if not all(c is _OBJECT or _FLAGS.__get__(c) & _HEAPTYPE for c in mro):
    raise _Opaque(_class_name(t))  # a subclass of int, str, list, an exception ...: never its base's value
  state = {}
  try:
    attrs = _object_getattribute(x, "__dict__")
  except AttributeError:
    attrs = {}
  if _type(attrs) is not _DICT:
    raise _Opaque(_class_name(t))
  for k, v in _DICT.items(_DICT.copy(attrs)):
    state[k] = v
  for c in mro:
    slots = _type.__dict__["__dict__"].__get__(c).get("__slots__", ())
    for name in ([slots] if _type(slots) is _STR else slots):
      if _type(name) is _STR and name not in ("__dict__", "__weakref__"):
        try:
          state[name] = _object_getattribute(x, name)
        except AttributeError:
          pass
  if not state:
    # No state of its own: its value lives elsewhere (a registry keyed by id(self)), where the host cannot see
    # it, and by class alone every instance would equal every other.
    raise _Opaque(_class_name(t) + " without state")
  items = []
  for k, v in _DICT.items(state):
    if _type(k) is not _STR:
      raise _Opaque(_class_name(t))
    items.append([k, _canon(v, budget, depth + 1)])
  return {"O": [_class_name(t), _sorted(items, key=_dump)]}


def canonical(x):
  """The canonical plain form of `x`: JSON-ready, built from exact built-in types only.

  None, bool, int and str stand for themselves (ints beyond 62 bits as {"I": hex}); float {"f": repr} (so NaN,
  infinities and -0.0 survive); bytes {"b": hex}; list a JSON list; tuple {"t": [...]}; dict {"d": [[k, v], ...]};
  set {"s": [...]}, frozenset {"S": [...]} (dict items and set elements sorted by their JSON text). An instance of
  a class defined in Python whose bases are all defined in Python is {"O": [class name, [[attribute, form], ...]]}:
  its state (instance dict and slots), never its `__eq__`; one without any state is opaque. Anything else (a
  subclass of a built-in type, a function, a C-level object) and anything past the bounds is {"o": reason}: opaque,
  never equal.
  """
  try:
    return _canon(x, _Budget(), 0)
  except _Opaque as e:
    return {"o": _str(e.args[0]) if e.args and _type(e.args[0]) is _STR else "?"}
  except RecursionError:
    return {"o": "too deep"}


def _dump(v):
  """JSON text of a canonical value (None, bool, int, str, list and str-keyed dicts only), without json.dumps."""
  t = _type(v)
  if v is None:
    return "null"
  if t is _BOOL:
    return "true" if v else "false"
  if t is _INT:
    return int.__repr__(v)
  if t is _STR:
    return _encode_str(v)
  if t is _LIST:
    return "[" + ",".join([_dump(e) for e in v]) + "]"
  if t is _DICT:
    return "{" + ",".join([_encode_str(k) + ":" + _dump(e) for k, e in _sorted(_DICT.items(v))]) + "}"
  raise TypeError(f"not a canonical value: {t!r}")


# -------------------------------------------------------------------------------------------------- recording


class _Log:
  """Where the recorder writes: the checks of the test running now (fixture checks outside any test)."""

  def __init__(self):
    self.current = None
    self.fixture = []


_LOG = _Log()


def _append(record):
  target = _LOG.current if _LOG.current is not None else _LOG.fixture
  target.append(record)


class _RaisesContext:
  """`with self.assertRaises(E)` as the recorder runs it: records, then fails or suppresses as unittest does."""

  def __init__(self, test, check_id, kind, expected, regex, msg):
    self.test, self.check_id, self.kind, self.expected, self.regex, self.msg = (test, check_id, kind, expected,
                                                                                 regex, msg)
    self.exception = None

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb):
    payload = {"expected": _class_names(self.expected), "raised": None, "message": None}
    if self.regex is not None:
      pattern = self.regex.pattern if _type(self.regex) is _PATTERN else self.regex
      payload["regex"] = canonical(pattern)
    if exc_type is not None:
      payload["raised"] = _mro_names(exc_type)
      try:
        payload["message"] = canonical(_str(exc))
      except Exception:  # noqa: BLE001  (a submitted exception whose __str__ raises)
        payload["message"] = {"o": "str failed"}
    _append([self.check_id, self.kind, payload])
    failure = _getattr(self.test, "failureException", AssertionError)
    if exc_type is None:
      raise failure(self.msg or f"{payload['expected']} not raised")
    try:
      matched = _issubclass(exc_type, self.expected)
    except TypeError:
      matched = False
    if not matched:
      return False  # not the expected exception: it propagates (an error, as in unittest)
    self.exception = exc.with_traceback(None)
    if self.regex is not None:
      if not _re_search(self.regex, _str(exc)):
        raise failure(self.msg or f"{self.regex!r} does not match {_str(exc)!r}")
    return True


def _is_opaque(form):
  """Opaque, or an object: what only the object itself can answer about (membership, truth)."""
  return _type(form) is _DICT and ("o" in form or "O" in form)


def _facts(kind, operands, forms):
  """What the host cannot rebuild from canonical `forms`, taken in-process (with names captured at startup)."""
  facts = {}
  if kind in ("assertIs", "assertIsNot"):
    facts["same"] = operands[0] is operands[1]
  elif kind in ("assertIn", "assertNotIn") and _is_opaque(forms[1]):
    try:
      facts["contains"] = _bool(operands[0] in operands[1])
    except Exception:  # noqa: BLE001
      facts["contains"] = None
  elif kind in ("assertTrue", "assertFalse", "assert") and _is_opaque(forms[0]):
    try:
      facts["truth"] = _bool(operands[0])
    except Exception:  # noqa: BLE001
      facts["truth"] = None
  elif kind in ("assertIsInstance", "assertNotIsInstance"):
    facts["mro"] = _mro_names(_type(operands[0]))
    facts["classes"] = _class_names(operands[1])
  return facts


def _record_compare(check_id, ops, operands):
  """A comparison chain in an asserted position: evaluated as Python does (pair by pair, later operands only while
  the chain holds), recorded as its operands and each pair's truth; returns the chain's truth."""
  values, truths = [operands[0], operands[1]], []
  try:
    for i, op in enumerate(ops):
      if i > 0:
        values.append(operands[i + 1]())  # a thunk: Python evaluates it only now
      truths.append(_bool(_OPS[op](values[i], values[i + 1])))
      if not truths[-1]:
        break
  finally:  # a comparison that raised is recorded as far as it went (the test errors, as it would have)
    _append([check_id, COMPARE, {"args": [canonical(v) for v in values[:_len(truths) + 1]], "truths": truths}])
  return truths[-1]


def record_check(test, check_id, kind, *args, **kwargs):
  """The recorder (`__c2jax_check__` in every hidden module): records one check, then runs it in-process.

  `test` is the TestCase (or the receiver of a helper's `case.assertXxx`); None for `assert` and compare records,
  which return the truth their expression had (the rewritten `assert` statement raises as it would have).
  """
  if kind == COMPARE:
    return _record_compare(check_id, args[0], args[1:])
  if kind in AGGREGATES:
    return _all(args[0]) if kind == "all" else _any(args[0])
  if kind in RAISES:
    regex = args[1] if kind == "assertRaisesRegex" else None
    rest = args[ARITY[kind]:]
    msg = kwargs.pop("msg", None)
    context = _RaisesContext(test, check_id, kind, args[0], regex, msg)
    if not rest:
      return context
    with context:
      rest[0](*rest[1:], **kwargs)
    return None
  n = ARITY[kind]
  operands = args[:n]
  payload = {"args": [canonical(a) for a in operands]}
  if kind in ("assertRegex", "assertNotRegex") and _len(operands) == 2 and _type(operands[1]) is _PATTERN:
    # A compiled pattern is recorded as its text and flags (re.Pattern is an immutable built-in type).
    payload["args"][1] = canonical(operands[1].pattern)
    payload["kw"] = {"flags": canonical(operands[1].flags)}
  extra = {}
  if kind in ("assertAlmostEqual", "assertNotAlmostEqual"):
    places = kwargs.get("places", args[2] if _len(args) > 2 else None)
    delta = kwargs.get("delta", args[4] if _len(args) > 4 else None)
    extra = {"places": canonical(places), "delta": canonical(delta)}
  elif kind == "assertSequenceEqual" and (kwargs.get("seq_type") is not None or _len(args) > 3):
    seq_type = kwargs.get("seq_type", args[3] if _len(args) > 3 else None)
    extra = {"seq_type": _class_names(seq_type)}
  if extra:
    payload["kw"] = extra
  facts = _facts(kind, operands, payload["args"])
  if facts:
    payload["facts"] = facts
  _append([check_id, kind, payload])
  if kind == "assert":
    return _bool(operands[0])
  if kind == "fail":
    raise _getattr(test, "failureException", AssertionError)(args[0] if args else kwargs.get("msg"))
  original = _ORIGINAL.get(kind)
  if original is not None and _isinstance(test, _TESTCASE):
    return original(test, *args, **kwargs)
  return _getattr(test, kind)(*args, **kwargs)


# -------------------------------------------------------------------------------------------------- running


class JudgeResult(unittest.TextTestResult):
  """unittest's verbose text result that keeps each test's status and the checks recorded while it ran."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.judged = []  # [test id, status, checks]
    self.fixture_errors = []
    self._status = None

  def startTest(self, test):
    super().startTest(test)
    self._status = "ok"
    _LOG.current = []

  def stopTest(self, test):
    super().stopTest(test)
    if _LOG.current is not None:
      self.judged.append([_str(test.id()), self._status, _LOG.current])
    _LOG.current = None

  def _bad(self, test, status):
    if _LOG.current is None:
      self.fixture_errors.append(_str(test))  # a fixture outside any test failed: setUpClass, tearDownModule, ...
    elif self._status == "ok":
      self._status = status

  def addError(self, test, err):
    super().addError(test, err)
    self._bad(test, "error")

  def addFailure(self, test, err):
    super().addFailure(test, err)
    self._bad(test, "fail")

  def addSkip(self, test, reason):
    super().addSkip(test, reason)
    self._bad(test, "skip")

  def addExpectedFailure(self, test, err):
    super().addExpectedFailure(test, err)
    # Whether the expected failure was an assertion or another exception: the host needs it (see canonical.py).
    self._bad(test, "xfail" if _issubclass(err[0], _getattr(test, "failureException", AssertionError))
              else "xfail_error")

  def addUnexpectedSuccess(self, test):
    super().addUnexpectedSuccess(test)
    self._bad(test, "unexpected")

  def addSubTest(self, test, subtest, err):
    super().addSubTest(test, subtest, err)
    if err is not None:
      self._bad(test, "fail" if _issubclass(err[0], _getattr(test, "failureException", AssertionError))
                else "error")


class _HiddenLoader(importlib.abc.Loader):
  """Serves the hidden modules from the stdin document: compiled and executed into module objects of its own."""

  def __init__(self, sources, root):
    self.sources, self.root = sources, root
    self.made = {}  # name -> the module object this loader created

  def path(self, name):
    return os.path.join(self.root, *name.split(".")) + (
        "/__init__.py" if self.is_package(name) else ".py")

  def is_package(self, name):
    return any(other.startswith(name + ".") for other in self.sources)

  def get_source(self, name):
    return self.sources[name]

  def create_module(self, spec):
    return None

  def exec_module(self, module):
    name = module.__name__
    self.made[name] = module
    module.__dict__[RECORDER] = record_check
    module.__file__ = self.path(name)
    if self.is_package(name):
      module.__path__ = []  # nothing on disk: a hidden package holds only what this loader serves
    exec(compile(self.sources[name], module.__file__, "exec"), module.__dict__)

  def spec(self, name):
    return importlib.machinery.ModuleSpec(name, self, origin=self.path(name), is_package=self.is_package(name))


class _HiddenFinder(importlib.abc.MetaPathFinder):
  """Finds hidden helper modules (imported by name from hidden code) in memory, before any path entry."""

  def __init__(self, loader):
    self.loader = loader

  def find_spec(self, name, path=None, target=None):
    return self.loader.spec(name) if name in self.loader.sources else None


def import_package(name, root):
  """Imports the repository's package `name` (a hidden module's parent that is not hidden) and its parents.

  A package missing only because its directory holds nothing on disk (the served modules are not written there)
  becomes an empty namespace package of that directory, which is what importing it would have made. Returns an
  error text, or None.
  """
  parts = name.split(".")
  for i in range(1, _len(parts) + 1):
    prefix = ".".join(parts[:i])
    if prefix in sys.modules:
      continue
    try:
      importlib.import_module(prefix)
    except ModuleNotFoundError as e:
      directory = os.path.join(root, *parts[:i])
      if e.name != prefix or os.path.lexists(directory):
        return f"{_type(e).__name__}: {e}"
      spec = importlib.machinery.ModuleSpec(prefix, None, is_package=True)
      spec.submodule_search_locations = [directory]
      sys.modules[prefix] = importlib.util.module_from_spec(spec)
      if i > 1:
        setattr(sys.modules[".".join(parts[:i - 1])], parts[i - 1], sys.modules[prefix])
    except BaseException as e:  # noqa: BLE001  (SystemExit from submitted code too)
      return f"{_type(e).__name__}: {e}"
  return None


def load_module(loader, name):
  """The hidden module `name` executed by `loader` (its parent packages first), registered in sys.modules.

  Returns (module or None, error text or None, planted): a module another object replaced in sys.modules before
  or while it ran is planted and not used.
  """
  planted = False
  parent = name.rpartition(".")[0]
  if parent and parent in loader.sources and parent not in loader.made:
    _, error, planted = load_module(loader, parent)
    if error is not None:
      return None, error, planted
  elif parent and parent not in loader.sources:
    error = import_package(parent, loader.root)
    if error is not None:
      return None, error, planted
  existing = sys.modules.get(name)
  if existing is not None and existing is not loader.made.get(name):
    planted = True
    del sys.modules[name]
  if name not in loader.made:
    spec = loader.spec(name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
      loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001  (SystemExit from submitted code too)
      if sys.modules.get(name) is module:
        del sys.modules[name]
      loader.made.pop(name, None)
      return None, f"{_type(e).__name__}: {e}", planted
  if sys.modules.get(name) is not loader.made[name]:
    planted = True
    sys.modules[name] = loader.made[name]
  if parent and parent not in loader.sources:
    try:  # what the import system does for a submodule: `pkg.tests.test_x` reachable from `pkg.tests`
      setattr(sys.modules[parent], name.rpartition(".")[2], loader.made[name])
    except Exception:  # noqa: BLE001  (a package object of the submission's making)
      pass
  return loader.made[name], None, planted


def selected(tests, wanted):
  """The tests of the suite `tests` whose id is in `wanted` (a frozenset), flattened in the suite's order."""
  out = unittest.TestSuite()
  for test in tests:
    if _isinstance(test, unittest.TestSuite):
      out.addTests(selected(test, wanted))
    elif test.id() in wanted:
      out.addTest(test)
  return out


# -------------------------------------------------------------------------------------------------- integrity

_WATCHED_MODULES = ("builtins", "json", "json.encoder", "os", "unittest", "unittest.case", "unittest.loader",
                    "unittest.result", "unittest.runner", "unittest.suite", "importlib", "importlib.util")
_WATCHED_CLASSES = (unittest.TestCase, unittest.TestResult, unittest.TextTestResult, unittest.TextTestRunner,
                    unittest.TestSuite, unittest.TestLoader, JudgeResult, _HiddenLoader, _RaisesContext, _Log, _Budget)


def snapshot():
  """What the verdict's way depends on, by identity: module and class namespaces, sys.modules' entries."""
  state = {}
  for name in _WATCHED_MODULES:
    module = sys.modules[name]
    state[f"sys.modules[{name}]"] = module
    for key, value in _DICT.items(_DICT.copy(module.__dict__)):
      state[f"{name}.{key}"] = value
  for cls in _WATCHED_CLASSES:
    namespace = _DICT(_type.__dict__["__dict__"].__get__(cls))
    for key, value in _DICT.items(namespace):
      state[f"{_class_name(cls)}.{key}"] = value
    # A class's namespace may not grow either: an added `__getattribute__` or `__eq__` changes every instance.
    state[f"{_class_name(cls)}.__dict__ keys"] = _sorted(namespace)
    state[f"{_class_name(cls)}.__bases__"] = cls.__bases__
  for key, value in _DICT.items(_DICT.copy(globals())):
    state[f"judge.{key}"] = value
  return state


# Entries that may change in an honest run. (Additions to a namespace are never findings: importing
# unittest.mock adds `unittest.mock`, gettext.install adds `builtins._`.)
_VOLATILE = ()


def integrity_findings(before, after, loader):
  """The names whose objects changed or vanished since `before`, and hidden modules whose recorder was replaced."""
  found = [k for k, v in _DICT.items(before) if k not in _VOLATILE and (
      k not in after or (after[k] != v if k.endswith("__dict__ keys") else after[k] is not v))]
  for name, module in _DICT.items(loader.made):
    if module.__dict__.get(RECORDER) is not record_check:
      found.append(f"{name}.{RECORDER}")
  return _sorted(found)


def _write_all(fd, data):
  while data:
    data = data[_os_write(fd, data):]


def main(argv):
  del argv
  document = json.loads(sys.stdin.read())
  nonce, sources, test_modules = document["nonce"], document["modules"], document["tests"]
  wanted = None if document.get("select") is None else frozenset(document["select"])
  devnull = os.open(os.devnull, os.O_RDONLY)
  os.dup2(devnull, 0)
  sys.stdin = open(devnull, closefd=False)
  report_fd = os.dup(1)
  os.dup2(2, 1)  # the tests' stdout joins the log: fd 1 as the submission sees it is not the report's
  root = os.getcwd()
  sys.path[:] = [p for p in sys.path if p not in ("", ".", root)]
  sys.path.append(root)
  loader = _HiddenLoader(sources, root)
  sys.meta_path.insert(0, _HiddenFinder(loader))
  before = snapshot()

  imports, planted, judged, fixtures = [], [], [], []
  try:
    suite = unittest.TestSuite()
    for name in test_modules:
      module, error, was_planted = load_module(loader, name)
      if was_planted:
        planted.append(name)
      if module is None:
        imports.append([name, _str(error)[:2000]])
        sys.stderr.write(f"importing the hidden tests {name} failed: {error}\n")
        continue
      tests = unittest.TestLoader().loadTestsFromModule(module)
      suite.addTest(tests if wanted is None else selected(tests, wanted))

    def make_result(*args, **kwargs):  # keeps the runner's result reachable even when the run breaks
      made.append(JudgeResult(*args, **kwargs))
      judged[:], fixtures[:] = [], []
      made[-1].judged, made[-1].fixture_errors = judged, fixtures
      return made[-1]

    made = []
    unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=make_result).run(suite)
  except BaseException as e:  # noqa: BLE001  (the submission broke the runner itself)
    # What ran so far stands; the breakage is one more failed test (an integrity finding says how, where it shows).
    fixtures = [*fixtures, f"the judge's runner failed: {_type(e).__name__}"]
  try:
    after = snapshot()
    findings = integrity_findings(before, after, loader)
  except BaseException as e:  # noqa: BLE001
    findings = [f"snapshot failed: {_type(e).__name__}"]
  for name in loader.sources:  # a served module replaced, or planted before anything imported it
    if (name in loader.made or name in sys.modules) and sys.modules.get(name) is not loader.made.get(name) and (
        name not in planted):
      planted.append(name)
  report = {"tests": judged, "fixtures": fixtures, "imports": imports, "planted": _sorted(planted),
            "integrity": findings}
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except Exception:  # noqa: BLE001  (a test may have closed or replaced it)
      pass
  _write_all(report_fd, f"\n{nonce} {_dump(report)}\n".encode())
  _os_exit(0)


if __name__ == "__main__":
  main(sys.argv)
