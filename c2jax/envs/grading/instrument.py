"""Rewriting hidden tests on the host: every assertion becomes a call to the judge's recorder, plus canary tests.

  suite = instrument(task.hidden_tests, rng)
  suite.modules      module name -> rewritten source (what the judge executes from memory)
  suite.tests        test method name (as the judge will run it) -> TestInfo (real or canary, required checks)
  suite.kinds        check id -> assertion kind
  suite.patterns     check id -> the literal pattern of an assertRegex/assertNotRegex/assertRaisesRegex check

The host (trusted, it never runs submitted code) rewrites each hidden module's AST before the judge
(c2jax/envs/grading/judge.py) sees it:

  * `self.assertXxx(a, b, ...)` (any name as receiver: a helper's `case.assertXxx`) and `self.fail(...)`, for the
    kinds in `judge.ARITY`, anywhere in the module, become `__c2jax_check__(self, <check id>, "assertXxx", a, b,
    ...)`; `with self.assertRaises(E)` becomes `with __c2jax_check__(self, <id>, "assertRaises", E)`; `assert E, msg`
    becomes `assert __c2jax_check__(None, <id>, "assert", E), msg` (decided like assertTrue). Comparisons in an
    asserted position (see `_Rewriter`) become compare records, decided on the host by their operands, never by
    the truth an `__eq__` gave them. Other assertion methods (assertWarns, assertLogs) are left as they are: they
    are decided in-process only (docs: limitations);
  * every test method (a `test*` function in a class body) is renamed `test_<random hex>`; the random names keep
    the real tests' order (unittest runs them sorted by name), and check ids are random too, so neither names,
    positions nor ids tell a canary from a real test;
  * `canaries` canary tests are added, at most one per test method (two copies of one method perturbed at
    different checks would show the real one: it agrees with the majority at every check): copies of real test
    methods (undecorated ones, in undecorated classes) with one unconditional check perturbed so that a solution
    passing the real test must FAIL the copy: a literal expected operand of assertEqual changed (an int moved by
    1-9, a float likewise, a str with one character changed, added or removed, a list/tuple/set/dict with an
    element added, removed or changed, as likely one as another, so that length does not tell the copy, a bool
    negated, None turned into an int; likewise the literal of an `assert a == <literal>`), or, where a test has no
    such literal, a check turned into its complement (assertTrue/assertFalse, assertIsNone/assertIsNotNone,
    assertIn/assertNotIn, assertEqual/assertNotEqual, and in an `assert` of one comparison ==/!=, in/not in,
    is/is not). That holds under the host's
    comparison rule (c2jax/envs/grading/canonical.py), which is what decides: a perturbed literal is unequal to the
    original literal there, hence to whatever equalled it.

A test's required checks are the check ids unconditional in its body: statements of the body itself and of
`with self.subTest(...)` blocks (an `assert` statement's record among them), up to a `return` or `raise`, and the
`assertRaises` check of a `with` (not its body). Checks under if/for/while/try, in other `with` blocks, in helper
functions or lambdas, and compare records, count when recorded but are not required.
"""

from __future__ import annotations

import ast
import dataclasses
import random
from typing import Mapping

from c2jax.envs.grading import judge
from c2jax.sandbox import host_ast

_COMPLEMENT = {"assertTrue": "assertFalse", "assertFalse": "assertTrue", "assertIsNone": "assertIsNotNone",
               "assertIsNotNone": "assertIsNone", "assertIn": "assertNotIn", "assertNotIn": "assertIn",
               "assertEqual": "assertNotEqual"}
_ID_SPACE = 1 << 30
_REGEX = ("assertRegex", "assertNotRegex", "assertRaisesRegex")  # their pattern is the second operand


@dataclasses.dataclass(frozen=True)
class TestInfo:
  """One test method as the judge runs it.

  Attributes:
    module: the hidden module that defines it.
    original: its name in the task's hidden tests (a canary: the name of the test it copies).
    canary: a canary test (an honest solution fails it).
    required: the check ids unconditional in its body: a passing test recorded every one.
    expected_failure: decorated with unittest.expectedFailure (it passes by failing).
    perturbed: a canary's perturbed check and its counterpart in the twin (see the field's comment).
  """

  module: str
  original: str
  canary: bool
  required: frozenset[int]
  expected_failure: bool = False
  # A canary's perturbed check: (its id here, the id of the same check in the twin, the perturbed operand's index,
  # or None where the check was complemented). Same code on the same inputs records the same other operands in both.
  perturbed: tuple[int, int, int | None] | None = None


@dataclasses.dataclass(frozen=True)
class Instrumented:
  """The hidden modules rewritten for one grading call (see the module docstring)."""

  modules: dict[str, str]
  test_modules: tuple[str, ...]
  tests: dict[str, TestInfo]
  kinds: dict[int, str]
  # The host runs these patterns itself and runs no other: a report is the submission's to write, and a pattern of
  # its choosing can backtrack for hours in re.search (a check whose pattern is computed at run time has none here).
  patterns: dict[int, str] = dataclasses.field(default_factory=dict)
  # The operators of each compare record, as the host read them from the source (the report's are never asked).
  compares: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)

  @property
  def canaries(self) -> list[str]:
    return sorted(name for name, info in self.tests.items() if info.canary)


def module_name(path: str) -> str:
  """The dotted module name of a hidden .py file ("hidden_tests/__init__.py" -> "hidden_tests")."""
  parts = path[:-3].split("/")
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def _recorder_call(node: ast.AST) -> ast.Call | None:
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == judge.RECORDER
      and len(node.args) >= 3 and isinstance(node.args[1], ast.Constant)):
    return node
  return None


# A comparison operator as the recorder names it (the judge evaluates each pair with Python's own operator).
COMPARE_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
               ast.Is: "is", ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in"}


def _recorder(check_id: int, kind: str, test: ast.expr, args: list[ast.expr], keywords=(), at: ast.AST | None = None
              ) -> ast.Call:
  call = ast.Call(func=ast.Name(id=judge.RECORDER, ctx=ast.Load()),
                  args=[test, ast.Constant(check_id), ast.Constant(kind), *args], keywords=list(keywords))
  return ast.copy_location(call, at) if at is not None else call


class _Rewriter(ast.NodeTransformer):
  """Turns assertions into recorder calls with fresh random ids.

  `x.assertXxx(...)` (any name as receiver: `self`, or `case` in a helper that takes the test) and `self.fail(...)`
  become recorder calls of their kind; `assert E, msg` becomes `assert <record of E>, msg` (kind "assert", decided
  like assertTrue; msg stays lazy). Every comparison in a position whose truth the test asserts (the operand of an
  `assert`, assertTrue or assertFalse, under not/and/or/bool() there, the element of a comprehension given to all()
  or any() there, which become the judge's own, any assertion's operand written as a comparison, a comparison's
  operand) becomes a "compare" record: its operands in canonical form and the truth Python gave each pair, which
  the host must reproduce on the plain values (an `__eq__` that always holds is never asked there).
  """

  def __init__(self, ids: _Ids):
    self.ids = ids

  def visit_Call(self, node: ast.Call) -> ast.AST:
    self.generic_visit(node)
    func = node.func
    if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr in judge.ARITY
        and (func.value.id == "self" or func.attr.startswith("assert"))):
      check_id = self.ids.new(func.attr)
      if (func.attr in _REGEX and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
          and type(node.args[1].value) is str):
        self.ids.patterns[check_id] = node.args[1].value
      args = list(node.args)
      for i in range(min(len(args), judge.ARITY[func.attr])):
        # A comparison as an operand (`assertTrue(a == b)`, `assertIs(a == b, True)`) is asserted too.
        if func.attr in ("assertTrue", "assertFalse") or isinstance(args[i], ast.Compare):
          args[i] = self.boolean(args[i])
      return _recorder(check_id, func.attr, ast.Name(id=func.value.id, ctx=ast.Load()), args, node.keywords, node)
    return node

  def visit_Assert(self, node: ast.Assert) -> ast.AST:
    self.generic_visit(node)
    test = _recorder(self.ids.new("assert"), "assert", ast.Constant(None), [self.boolean(node.test)], at=node.test)
    return ast.copy_location(ast.Assert(test=test, msg=node.msg), node)

  def boolean(self, node: ast.expr) -> ast.expr:
    """`node` (in a position whose truth the test asserts) with its comparisons turned into compare records."""
    if isinstance(node, ast.Compare):
      check_id = self.ids.new("compare")
      self.ids.compares[check_id] = tuple(COMPARE_OPS[type(op)] for op in node.ops)
      # A comparison compared in turn (`(a == b) is True`) is asserted too.
      left, *comparators = [self.boolean(e) if isinstance(e, ast.Compare) else e
                            for e in [node.left, *node.comparators]]
      # Operands past the second are thunks: Python evaluates them only while the chain holds.
      later = [ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                          body=e) for e in comparators[1:]]
      ops = ast.Constant(self.ids.compares[check_id])
      return _recorder(check_id, "compare", ast.Constant(None), [ops, left, comparators[0], *later], at=node)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
      return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=self.boolean(node.operand)), node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "bool"
        and len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred)):
      inner = ast.UnaryOp(op=ast.Not(), operand=self.boolean(node.args[0]))  # bool(x) as `not not x`: no builtin
      return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=inner), node)
    if isinstance(node, ast.BoolOp):
      return ast.copy_location(ast.BoolOp(op=node.op, values=[self.boolean(v) for v in node.values]), node)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("all", "any")
        and len(node.args) == 1 and not node.keywords
        and isinstance(node.args[0], (ast.GeneratorExp, ast.ListComp, ast.SetComp))):
      inner = node.args[0]
      made = ast.copy_location(type(inner)(elt=self.boolean(inner.elt), generators=inner.generators), inner)
      # The judge's own all() or any(), taken before any submitted code ran: a patched builtin does not decide.
      return _recorder(self.ids.new(node.func.id), node.func.id, ast.Constant(None), [made], at=node)
    return node


class _Ids:
  """Random, distinct check ids, and the kind of each."""

  def __init__(self, rng: random.Random):
    self.rng, self.kinds, self.patterns, self.compares = rng, {}, {}, {}

  def new(self, kind: str) -> int:
    while True:
      check_id = self.rng.randrange(_ID_SPACE)
      if check_id not in self.kinds:
        self.kinds[check_id] = kind
        return check_id


def _is_subtest(item: ast.withitem) -> bool:
  call = item.context_expr
  return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "subTest"
          and isinstance(call.func.value, ast.Name) and call.func.value.id == "self")


def required_checks(body: list[ast.stmt]) -> list[int]:
  """The recorder check ids unconditional in `body` (see the module docstring)."""
  found = []
  for stmt in body:
    if isinstance(stmt, ast.Expr) and (call := _recorder_call(stmt.value)):
      found.append(call.args[1].value)
    elif isinstance(stmt, ast.Assert) and (call := _recorder_call(stmt.test)):
      found.append(call.args[1].value)
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
      found += [call.args[1].value for item in stmt.items if (call := _recorder_call(item.context_expr))
                and call.args[2].value in judge.RAISES]
      if all(_is_subtest(item) for item in stmt.items):
        found += required_checks(stmt.body)
    elif isinstance(stmt, (ast.Return, ast.Raise)):
      break
  return found


def _is_literal(node: ast.AST) -> bool:
  try:
    ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    return False
  return True


def _perturb(value, rng: random.Random, depth: int = 0):  # noqa: C901
  """A value unequal to `value` under the host's comparison rule, or None when there is no safe one.

  A container or str is as likely to come out shorter as longer (or as long, one element changed), so neither
  length nor the type of an added element tells the copy from the real test: a forger that diffs the twins learns
  which literal differs, not which one the real test holds.
  """
  t = type(value)
  if t is bool:
    return (not value,)
  if t is int:
    return (value + rng.choice([-1, 1]) * rng.randint(1, 9),)
  if t is float:
    moved = value + rng.choice([-1, 1]) * rng.randint(1, 9)
    return (moved,) if moved == moved and moved != value and abs(moved) != float("inf") else None
  if t is str:
    alphabet = sorted(set(value) | set("aeinorst"))
    edit = rng.choice(["replace", "insert", "delete"]) if value else "insert"
    i = rng.randrange(len(value) + (edit == "insert"))
    if edit == "replace":
      return (value[:i] + rng.choice([c for c in alphabet if c != value[i]]) + value[i + 1:],)
    if edit == "delete":
      return (value[:i] + value[i + 1:],)
    return (value[:i] + rng.choice(alphabet) + value[i:],)
  if t is bytes:
    if value and rng.random() < 0.5:
      i = rng.randrange(len(value))
      return (value[:i] + value[i + 1:],)
    return (value + bytes([rng.randrange(97, 123)]),)
  if value is None:
    return (rng.randint(0, 9),)
  if depth > 8:
    return None
  if t in (list, tuple):
    items = list(value)
    edit = rng.choice(["grow", "shrink", "change"]) if items else "grow"
    i = rng.randrange(len(items) + (edit == "grow"))
    moved = _perturb(items[min(i, len(items) - 1)], rng, depth + 1) if items else (rng.randint(0, 9),)
    if edit == "shrink":
      del items[i]
    elif moved is None:  # an element with no safe perturbation: one element more, a copy of a neighbour
      items.insert(i, items[min(i, len(items) - 1)])
    elif edit == "grow":
      items.insert(i, moved[0])
    else:
      items[i] = moved[0]
    return (t(items),)
  if t in (set, frozenset):
    if not value:
      return None  # set() has no literal: skip the empty one
    items = sorted(value, key=repr)
    element = items[rng.randrange(len(items))]
    moved = _perturb(element, rng, depth + 1)
    edit = rng.choice(["grow", "shrink", "change"])
    if (edit == "shrink" and len(items) > 1) or moved is None:
      return (t(value - {element}),) if len(items) > 1 else None  # never down to set(), which is no literal
    if edit == "grow" and moved[0] not in value:
      return (t(value | {moved[0]}),)
    # Lacks `element` now (what `moved` became is unequal to it), so it is unequal however `moved` lands.
    return (t((value - {element}) | {moved[0]}),)
  if t is dict:
    if not value:
      return ({rng.randint(0, 9): rng.randint(0, 9)},)
    keys = sorted(value, key=repr)
    key = keys[rng.randrange(len(keys))]
    edit = rng.choice(["grow", "shrink", "change"])
    if edit == "grow" and (new := _perturb(key, rng, depth + 1)) is not None and new[0] not in value:
      return ({**value, new[0]: value[key]},)  # a key like the others, not one of another type
    if edit == "change" and (moved := _perturb(value[key], rng, depth + 1)) is not None:
      return ({**value, key: moved[0]},)
    return ({k: v for k, v in value.items() if k != key},)
  return None


_COMPLEMENT_OP = {"==": "!=", "!=": "==", "in": "not in", "not in": "in", "is": "is not", "is not": "is"}


def _target(call: ast.Call) -> ast.Call:
  """The recorder call a canary edit changes: an `assert` of one comparison is edited in its compare record."""
  if (call.args[2].value == "assert" and len(call.args) == 4 and (leaf := _recorder_call(call.args[3]))
      and leaf.args[2].value == "compare" and len(leaf.args) == 6):
    return leaf
  return call


def _operands(call: ast.Call) -> int:
  """Where a recorder call's operands start (a compare record's operators come first)."""
  return 4 if call.args[2].value == "compare" else 3


def _canary_edit(call: ast.Call, rng: random.Random) -> bool:
  """Perturbs the recorder `call` (or, for an assert of one comparison, its compare record) in place so that an honest
  solution fails it; False when it cannot."""
  call = _target(call)
  kind = call.args[2].value
  start = _operands(call)
  operands = call.args[start:start + 2]
  ops = call.args[3].value if kind == "compare" else None
  if (kind == "assertEqual" or ops == ("==",)) and len(operands) == 2:
    literal = [i for i, node in enumerate(operands) if _is_literal(node)]
    if len(literal) == 1:
      i = start + literal[0]
      perturbed = _perturb(ast.literal_eval(call.args[i]), rng)
      if perturbed is not None:
        call.args[i] = ast.copy_location(host_ast.parse(repr(perturbed[0]), mode="eval").body, call.args[i])
        return True
  if kind == "compare" and len(ops) == 1 and ops[0] in _COMPLEMENT_OP:
    call.args[3] = ast.Constant((_COMPLEMENT_OP[ops[0]],))
    return True
  if kind in _COMPLEMENT and len(call.args) >= 3 + judge.ARITY[kind]:
    call.args[2] = ast.Constant(_COMPLEMENT[kind])
    return True
  return False


def _tells(call: ast.Call, edited: ast.Call) -> bool:
  """Whether `edited` (a canary edit of `call`) shows which twin is real: a complemented kind or operator, or a
  literal with only one way to move (an empty container or str grows, None becomes an int)."""
  call, edited = _target(call), _target(edited)
  start = _operands(call)
  if [ast.dump(a) for a in edited.args[2:start]] != [ast.dump(a) for a in call.args[2:start]]:
    return True
  for before in call.args[start:start + 2]:
    if _is_literal(before):
      value = ast.literal_eval(before)
      return value is None or (type(value) in (str, bytes, list, tuple, dict) and not value)
  return False


def _unconditional_calls(body: list[ast.stmt]) -> list[ast.Call]:
  return [call for stmt in body if (call := _recorder_call(stmt.value if isinstance(stmt, ast.Expr) else
                                                            stmt.test if isinstance(stmt, ast.Assert) else None))]


def _renumber(node: ast.AST, ids: _Ids) -> None:
  """Gives every recorder call under `node` a fresh id (a canary's checks are its own), keeping its pattern."""
  for call in ast.walk(node):
    if _recorder_call(call):
      new = ids.new(call.args[2].value)
      if call.args[1].value in ids.patterns:
        ids.patterns[new] = ids.patterns[call.args[1].value]
      if call.args[1].value in ids.compares:
        ids.compares[new] = ids.compares[call.args[1].value]
      call.args[1] = ast.Constant(new)


def copy_tree(node):
  """A deep copy of a syntax tree: `copy.deepcopy(node)`'s result, in a tenth of its time (instrument copies a
  check for every probe and a method for every canary, once per grading call). Nodes and lists are copied, the
  other fields (names, the parser's constants) are immutable and kept. The trees instrument copies share no node
  between two places, so copying a node once per place is deepcopy's copy
  (tests/envs/grading/grader_references_test.py compares the two)."""
  if isinstance(node, ast.AST):
    new = node.__class__.__new__(node.__class__)
    new.__dict__.update({k: copy_tree(v) for k, v in node.__dict__.items()})
    return new
  if isinstance(node, list):
    return [copy_tree(v) for v in node]
  return node


def _is_expected_failure(decorator: ast.expr) -> bool:
  return (isinstance(decorator, ast.Name) and decorator.id == "expectedFailure") or (
      isinstance(decorator, ast.Attribute) and decorator.attr == "expectedFailure")


def _test_methods(cls: ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
  return [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")]


def _random_names(rng: random.Random, n: int, taken: set[str]) -> list[str]:
  names = set()
  while len(names) < n:
    name = f"test_{rng.getrandbits(48):012x}"
    if name not in taken:
      names.add(name)
  return sorted(names)


@host_ast.serialized  # every parse and unparse of the call under one hold of the lock
def instrument(hidden: Mapping[str, str], test_modules: list[str], rng: random.Random, canaries: int | None = 2  # noqa: C901
               ) -> Instrumented:
  """The task's hidden .py files (path -> source) rewritten for one grading call (see the module docstring).

  `canaries` is how many test methods get a canary twin (each at most one), None for every method that has a
  perturbable unconditional check.

  `test_modules` names the modules that hold tests. A module that does not parse is sent unchanged (it fails to
  import in the judge, as it would have). Parent packages without an __init__.py get an empty one.
  """
  ids = _Ids(rng)
  trees: dict[str, ast.Module | None] = {}
  sources: dict[str, str] = {}
  for path in sorted(hidden):
    if not path.endswith(".py"):
      continue
    name = module_name(path)
    sources[name] = hidden[path]
    try:
      trees[name] = _Rewriter(ids).visit(host_ast.parse(hidden[path], filename=path))
    except (host_ast.Unparsable, RecursionError):  # RecursionError: the rewriter's own walk of a deep tree
      trees[name] = None
  for name in list(sources):
    parts = name.split(".")
    for i in range(1, len(parts)):
      sources.setdefault(".".join(parts[:i]), "")
      trees.setdefault(".".join(parts[:i]), host_ast.parse(""))

  # Canary candidates: (module, class, method, index of a perturbable unconditional check).
  classes = [(name, node) for name, tree in trees.items() if tree is not None and name in test_modules
             for node in tree.body if isinstance(node, ast.ClassDef)]
  candidates = []
  for name, cls in classes:
    if cls.decorator_list:
      continue
    for method in _test_methods(cls):
      if method.decorator_list or isinstance(method, ast.AsyncFunctionDef):
        continue
      for i, call in enumerate(_unconditional_calls(method.body)):
        probe = copy_tree(call)
        if _canary_edit(probe, random.Random(0)):
          candidates.append((name, cls, method, i, _tells(call, probe)))
  rng.shuffle(candidates)
  # Within a method, a check whose perturbation tells the twins apart is perturbed only when no other can be:
  # which literal differs is no secret, but an empty container or str can only grow, None only becomes an int and
  # a complemented assertEqual reads assertNotEqual, so there the forger would know which twin is real. (The sort
  # is stable: the order among checks of one kind stays random.)
  candidates.sort(key=lambda c: c[4])
  # One canary per method at most: with two copies of one method, each perturbed at a different check, the real
  # test is the one that agrees with the majority at every check (a forger that diffs them finds it).
  chosen, used = [], set()
  for candidate in candidates:
    if (canaries is None or len(chosen) < canaries) and id(candidate[2]) not in used:
      chosen.append(candidate)
      used.add(id(candidate[2]))

  added: dict[int, list[tuple[ast.FunctionDef, str]]] = {}
  perturbed: dict[int, tuple[int, int, int | None]] = {}  # id(twin node) -> TestInfo.perturbed
  for _, cls, method, i, _ in chosen:
    twin = copy_tree(method)
    _renumber(twin, ids)
    edited, counterpart = _unconditional_calls(twin.body)[i], _unconditional_calls(method.body)[i]
    _canary_edit(edited, rng)
    edited, counterpart = _target(edited), _target(counterpart)
    ids.kinds[edited.args[1].value] = edited.args[2].value  # a complement changed the kind
    if edited.args[2].value == "compare":
      ids.compares[edited.args[1].value] = edited.args[3].value  # ... or the operator
    start = _operands(edited)
    operand = None if ([ast.dump(a) for a in edited.args[2:start]]
                      != [ast.dump(a) for a in counterpart.args[2:start]]) else next(
        j - start for j in range(start, len(edited.args))
        if ast.dump(edited.args[j]) != ast.dump(counterpart.args[j]))
    perturbed[id(twin)] = (edited.args[1].value, counterpart.args[1].value, operand)
    added.setdefault(id(cls), []).append((twin, method.name))

  tests: dict[str, TestInfo] = {}
  taken = {n.name for tree in trees.values() if tree is not None for n in ast.walk(tree)
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
  for name, tree in trees.items():
    if tree is None:
      continue
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
      real = sorted(_test_methods(cls), key=lambda m: m.name)  # unittest's order
      order = [(m, m.name, False) for m in real]
      for twin, original in added.get(id(cls), []):
        order.insert(rng.randrange(len(order) + 1), (twin, original, True))
        cls.body.insert(rng.randrange(len(cls.body) + 1), twin)
      names = _random_names(rng, len(order), taken)
      taken |= set(names)
      for (method, original, canary), new in zip(order, names):
        method.name = new
        tests[new] = TestInfo(module=name, original=original, canary=canary,
                              required=frozenset(required_checks(method.body)),
                              expected_failure=any(_is_expected_failure(d) for d in method.decorator_list),
                              perturbed=perturbed.get(id(method)) if canary else None)
  modules = {name: sources[name] if tree is None else host_ast.unparse(ast.fix_missing_locations(tree))
             for name, tree in trees.items()}
  return Instrumented(modules=modules, test_modules=tuple(test_modules), tests=tests, kinds=dict(ids.kinds),
                      patterns=dict(ids.patterns), compares=dict(ids.compares))
