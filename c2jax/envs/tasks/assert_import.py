"""Importing plain-assert test files as hidden tests: every `assert` rewritten into a host-decided assertion.

  source = convert(test_text, Style.CHECK, where="HumanEval/0", candidate=Candidate("solution", "has_close_elements"))
  source = convert(test_text, Style.ASSERTS, where="tests/test_mbpp_2.py")
  # a unittest module for a task's hidden_tests/test_*.py; `count_tests(source)` counts its test methods

Two input styles:

  Style.CHECK    a module defining `def check(candidate):` whose asserts test `candidate` (HumanEval's and MBPP's
                 form; the harness calls `check(entry_point)`). Other top-level statements (METADATA, imports,
                 helper functions) are kept; an assert outside a function is refused.
  Style.ASSERTS  a plain test file: top-level asserts (and top-level loops or blocks holding asserts) in file
                 order, and pytest-style `def test_x():` functions without parameters. Other top-level statements
                 (imports, assignments, helpers) stay module-level statements, run once when the module is
                 imported: a value an assert reads is computed before any assert runs. An
                 `if __name__ == "__main__":` block is dropped (it never runs on import).

The output is one unittest module: `import unittest`, the candidate imported by name from the solution module
(`from solution import has_close_elements`; in Style.CHECK bound to the check's parameter name too), the names the
caller provides (`provided`: e.g. helpers a task's prompt defines, imported from a trusted copy of that prompt
rather than from the submission, so a submission cannot redefine the helper a test encodes its inputs with), then
one TestCase class: Style.CHECK's `test_check` (the check's body, inlined so its top-level checks are unconditional
in the test and required by the grader), Style.ASSERTS' `test_asserts` (the top-level asserts) and one method per
`test_x` function.

Every `assert` (inside loops, nested blocks and helper functions too) becomes the matching TestCase assertion,
called on the test (`self`) in a test and on a module-level `_CASE = unittest.TestCase()` in a helper function:

  assert a == b / != / < / <= / > / >=      assertEqual / assertNotEqual / assertLess / ... / assertGreaterEqual
  assert a is b / is not b (None: IsNone)   assertIs / assertIsNot / assertIsNone / assertIsNotNone
  assert a in b / not in b                  assertIn / assertNotIn
  assert abs(a - b) < tol (<=, math.fabs,   assertAlmostEqual(a, b, delta=tol)   (abs(x) < tol: x against 0)
         tol > abs(a - b))
  assert isinstance(x, T)                   assertIsInstance(x, T)
  assert not (a == b) / not in / not is     assertNotEqual / assertNotIn / assertIsNot (and back)
  assert not E                              assertFalse(E)
  assert A and B                            assert A; assert B   (each rewritten; B still runs only when A holds)
  assert E (a call, name, all()/any(), ...) assertTrue(E)
  assert E, msg                             the same, with msg=msg

Why: the grader (c2jax/envs/grading/) decides an assertXxx call on the host from its recorded operands, by its
own type-strict comparison, so no `__eq__` or `__bool__` of a submitted object decides it, and its canary tests
perturb the literal expected operand of an assertEqual. A comparison left inside a plain `assert` is recorded too,
but `abs(a - b) < tol` would be decided on `a - b` as the submitted object computed it; assertAlmostEqual records
`a` and `b` themselves. The rewrite keeps Python's semantics on plain values, but one: `abs(a - b) < tol` admits
a difference of exactly `tol` (assertAlmostEqual's delta is inclusive).

Refused, in one sentence naming the file and line (`UnsupportedTest`), never left as a plain assert: a chained
comparison (`0 <= x < n` would evaluate `x` twice), an asserted tuple (always true), an assert inside a `try` that
has handlers (the handler could catch its failure, which the host would still count), a `yield` in a test (the
test would become a generator that never runs), a pytest-style test with parameters (fixtures), the names
`self`, `_CASE` or unittest's in a test body where the rewrite needs them, asserts in a class body, no check
function (Style.CHECK) or no assert at all, and a file that does not parse.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import enum
from typing import Iterable, Mapping

from c2jax.envs.tasks.coding_tasks import TaskFormatError
from c2jax.sandbox import host_ast

CASE = "_CASE"  # the module-level TestCase a helper function's assertions are called on
CLASS = "ImportedTest"
_SINGLE = {ast.Eq: "assertEqual", ast.NotEq: "assertNotEqual", ast.Lt: "assertLess", ast.LtE: "assertLessEqual",
           ast.Gt: "assertGreater", ast.GtE: "assertGreaterEqual", ast.Is: "assertIs", ast.IsNot: "assertIsNot",
           ast.In: "assertIn", ast.NotIn: "assertNotIn"}
# `not (a OP b)` as the complementary assertion, only where the complement is exact for every value.
_NEGATED = {ast.Eq: "assertNotEqual", ast.NotEq: "assertEqual", ast.Is: "assertIsNot", ast.IsNot: "assertIs",
            ast.In: "assertNotIn", ast.NotIn: "assertIn"}
_ABS = ("abs", "math.fabs", "fabs")


class Style(enum.Enum):
  """The input's form (the module docstring)."""

  CHECK = "check"
  ASSERTS = "asserts"


@dataclasses.dataclass(frozen=True)
class Candidate:
  """The function under test: `name` imported from the submission's module `module` (dotted)."""

  module: str
  name: str


class UnsupportedTest(TaskFormatError):
  """A test the importer cannot rewrite faithfully; the message names the file, the line and the form."""


def _name(node: ast.expr) -> str:
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
    return f"{node.value.id}.{node.attr}"
  return ""


def _call(receiver: str, method: str, args: list[ast.expr], msg: ast.expr | None, at: ast.AST,
          keywords: Iterable[ast.keyword] = ()) -> ast.stmt:
  keywords = list(keywords) + ([ast.keyword(arg="msg", value=msg)] if msg is not None else [])
  call = ast.Call(func=ast.Attribute(value=ast.Name(id=receiver, ctx=ast.Load()), attr=method, ctx=ast.Load()),
                  args=args, keywords=keywords)
  return ast.copy_location(ast.Expr(value=call), at)


def _abs_operand(node: ast.expr) -> ast.expr | None:
  """The x of `abs(x)` / `math.fabs(x)`, else None."""
  if (isinstance(node, ast.Call) and _name(node.func) in _ABS and len(node.args) == 1 and not node.keywords
      and not isinstance(node.args[0], ast.Starred)):
    return node.args[0]
  return None


def _almost(test: ast.Compare) -> tuple[ast.expr, ast.expr, ast.expr] | None:
  """(a, b, tol) of `abs(a - b) < tol` (or <=, or `tol > abs(..)`, >=); `abs(x) < tol` gives (x, 0, tol)."""
  op, right = test.ops[0], test.comparators[0]
  if isinstance(op, (ast.Lt, ast.LtE)):
    inner, tol = _abs_operand(test.left), right
  elif isinstance(op, (ast.Gt, ast.GtE)):
    inner, tol = _abs_operand(right), test.left
  else:
    return None
  if inner is None:
    return None
  if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub):
    return inner.left, inner.right, tol
  return inner, ast.Constant(0), tol


def _is_none(node: ast.expr) -> bool:
  return isinstance(node, ast.Constant) and node.value is None


class _Rewriter:
  """Rewrites the asserts of one input file; `where` names it in refusals."""

  def __init__(self, where: str):
    self.where = where
    self.count = 0

  def refuse(self, node: ast.AST, what: str) -> UnsupportedTest:
    return UnsupportedTest(f"{self.where} line {getattr(node, 'lineno', '?')}: {what}.")

  def assertion(self, node: ast.Assert, receiver: str) -> list[ast.stmt]:
    """The assertion calls that replace one `assert` statement."""
    self.count += 1
    test, msg = node.test, node.msg
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
      return [s for value in test.values
              for s in self.assertion(ast.copy_location(ast.Assert(test=value, msg=msg), value), receiver)]
    if isinstance(test, ast.Tuple):
      raise self.refuse(node, "the assert asserts a tuple, which is always true (a misplaced message?)")
    if isinstance(test, ast.Compare):
      if len(test.ops) > 1:
        raise self.refuse(node, "a chained comparison cannot become one assertion without evaluating its middle "
                                "operand twice; split it by hand")
      almost = _almost(test)
      if almost is not None:
        a, b, tol = almost
        return [_call(receiver, "assertAlmostEqual", [a, b], msg, node, [ast.keyword(arg="delta", value=tol)])]
      op, left, right = type(test.ops[0]), test.left, test.comparators[0]
      if op in (ast.Is, ast.IsNot) and (_is_none(right) or _is_none(left)):
        value = left if _is_none(right) else right
        return [_call(receiver, "assertIsNone" if op is ast.Is else "assertIsNotNone", [value], msg, node)]
      return [_call(receiver, _SINGLE[op], [left, right], msg, node)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
      inner = test.operand
      if isinstance(inner, ast.Compare) and len(inner.ops) == 1 and type(inner.ops[0]) in _NEGATED:
        op, left, right = type(inner.ops[0]), inner.left, inner.comparators[0]
        if op in (ast.Is, ast.IsNot) and (_is_none(right) or _is_none(left)):
          value = left if _is_none(right) else right
          return [_call(receiver, "assertIsNotNone" if op is ast.Is else "assertIsNone", [value], msg, node)]
        return [_call(receiver, _NEGATED[op], [left, right], msg, node)]
      return [_call(receiver, "assertFalse", [inner], msg, node)]
    if (isinstance(test, ast.Call) and _name(test.func) == "isinstance" and len(test.args) == 2
        and not test.keywords and not any(isinstance(a, ast.Starred) for a in test.args)):
      return [_call(receiver, "assertIsInstance", list(test.args), msg, node)]
    if isinstance(test, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Starred)):
      raise self.refuse(node, f"an assert of a {type(test).__name__} expression has no host-decided form")
    return [_call(receiver, "assertTrue", [test], msg, node)]

  def body(self, stmts: list[ast.stmt], receiver: str, in_try: bool = False) -> list[ast.stmt]:
    """`stmts` with every assert rewritten, recursively (nested functions keep the receiver: a closure)."""
    out = []
    for stmt in stmts:
      if isinstance(stmt, ast.Assert):
        if in_try:
          raise self.refuse(stmt, "an assert inside a try block with handlers could have its failure caught, which "
                                  "the grader would still count; move it out of the try")
        out += self.assertion(stmt, receiver)
        continue
      if isinstance(stmt, ast.ClassDef):
        if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
          raise self.refuse(stmt, f"class {stmt.name} holds asserts, which the importer does not rewrite in a "
                                  "class body")
        out.append(stmt)
        continue
      stmt = copy.copy(stmt)
      if isinstance(stmt, ast.Try) or (hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar)):
        stmt.body = self.body(stmt.body, receiver, in_try=in_try or bool(stmt.handlers))
        stmt.handlers = [self._handler(h, receiver, in_try) for h in stmt.handlers]
        stmt.orelse = self.body(stmt.orelse, receiver, in_try)
        stmt.finalbody = self.body(stmt.finalbody, receiver, in_try)
      else:
        for field in ("body", "orelse", "finalbody"):
          if isinstance(getattr(stmt, field, None), list):
            setattr(stmt, field, self.body(getattr(stmt, field), receiver, in_try))
        if isinstance(stmt, ast.Match):
          stmt.cases = [copy.copy(c) for c in stmt.cases]
          for case in stmt.cases:
            case.body = self.body(case.body, receiver, in_try)
      out.append(stmt)
    return out

  def _handler(self, handler: ast.ExceptHandler, receiver: str, in_try: bool) -> ast.ExceptHandler:
    handler = copy.copy(handler)
    handler.body = self.body(handler.body, receiver, in_try)
    return handler


def _has_assert(node: ast.AST) -> bool:
  return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def _is_main_block(stmt: ast.stmt) -> bool:
  """`if __name__ == "__main__":` (either operand order)."""
  if not (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and len(stmt.test.ops) == 1
          and isinstance(stmt.test.ops[0], ast.Eq)):
    return False
  pair = [stmt.test.left, stmt.test.comparators[0]]
  return (any(isinstance(e, ast.Name) and e.id == "__name__" for e in pair)
          and any(isinstance(e, ast.Constant) and e.value == "__main__" for e in pair))


def _bound_names(stmts: list[ast.stmt]) -> set[str]:
  names = set()
  for node in ast.walk(ast.Module(body=stmts, type_ignores=[])):
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
      names.add(node.id)
    elif isinstance(node, ast.arg):
      names.add(node.arg)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, ast.alias):
      names.add((node.asname or node.name).split(".")[0])
  return names


def _check_test_body(rewriter: _Rewriter, stmts: list[ast.stmt], at: ast.AST, reserved: Iterable[str]) -> None:
  for node in ast.walk(ast.Module(body=stmts, type_ignores=[])):
    if isinstance(node, (ast.Yield, ast.YieldFrom)):
      raise rewriter.refuse(node, "a yield would make the test a generator, which unittest never runs")
  clash = sorted(_bound_names(stmts) & set(reserved))
  if clash:
    raise rewriter.refuse(at, f"the test binds the name {clash[0]!r}, which the rewritten test needs")


def _header(candidate: Candidate | None, provided: Mapping[str, str], used: set[str]) -> list[ast.stmt]:
  lines = ["import unittest"]
  if candidate is not None:
    lines.append(f"from {candidate.module} import {candidate.name}")
  for module in sorted(set(provided.values())):
    names = sorted(n for n, m in provided.items() if m == module and n in used)
    if names:
      lines.append(f"from {module} import {', '.join(names)}")
  source = "\n".join(lines) + "\n"
  return list(host_ast.parse(source, filename="<imports>").body)


def _method(name: str, body: list[ast.stmt], at: ast.AST) -> ast.FunctionDef:
  args = ast.arguments(posonlyargs=[], args=[ast.arg(arg="self")], kwonlyargs=[], kw_defaults=[], defaults=[])
  return ast.copy_location(ast.FunctionDef(name=name, args=args, body=body or [ast.Pass()], decorator_list=[],
                                           returns=None), at)


def _helpers(rewriter: _Rewriter, stmt: ast.stmt) -> tuple[ast.stmt, bool]:
  """A module-level statement with the asserts of its functions called on `_CASE`; (statement, uses _CASE)."""
  if not _has_assert(stmt):
    return stmt, False
  if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
    fn = copy.copy(stmt)
    fn.body = rewriter.body(stmt.body, CASE)
    return fn, True
  if isinstance(stmt, ast.ClassDef):
    raise rewriter.refuse(stmt, f"class {stmt.name} holds asserts, which the importer does not rewrite in a class "
                                "body")
  raise rewriter.refuse(stmt, "an assert outside the check function runs at import, outside any test")


def convert(source: str, style: Style, where: str, candidate: Candidate | None = None,  # noqa: C901
            provided: Mapping[str, str] | None = None) -> str:
  """The unittest module for a check-style or plain-assert test file (the module docstring).

  Args:
    source: the test file's text.
    style: its form.
    where: names the file (or problem) in refusals.
    candidate: the submission's function under test; required for Style.CHECK (bound to the check's parameter).
    provided: name -> module the tests may import it from (names the test uses and does not define itself).

  Returns:
    The rewritten module's source.

  Raises:
    UnsupportedTest: a form the importer refuses (the module docstring), naming `where` and the line.
  """
  provided = dict(provided or {})
  rewriter = _Rewriter(where)
  try:
    tree = host_ast.parse(source, filename=where)
  except host_ast.Unparsable as e:
    raise UnsupportedTest(str(e)) from None
  top: list[ast.stmt] = []
  methods: list[ast.FunctionDef] = []
  uses_case = False
  reserved = ("self", CASE, "unittest")
  if style is Style.CHECK:
    if candidate is None:
      raise UnsupportedTest(f"{where}: a check-style test needs the candidate function (module and name).")
    checks = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if not checks:
      raise UnsupportedTest(f"{where}: no top-level `def check(candidate):`; is it a plain-assert file "
                            "(Style.ASSERTS)?")
    check = checks[-1]
    a = check.args
    if (len(a.args) + len(a.posonlyargs) != 1 or a.vararg or a.kwarg or a.kwonlyargs or a.defaults
        or check.decorator_list):
      raise rewriter.refuse(check, "check must take exactly one parameter, the candidate, and be undecorated")
    param = (a.posonlyargs + a.args)[0].arg
    _check_test_body(rewriter, check.body, check, reserved + (candidate.name,) if param != candidate.name
                     else reserved)
    if not _has_assert(check):
      raise rewriter.refuse(check, "the check function holds no assert")
    body = rewriter.body(check.body, "self")
    if param != candidate.name:  # the harness's call check(entry_point), inlined
      body.insert(0, ast.Assign(targets=[ast.Name(id=param, ctx=ast.Store())],
                                value=ast.Name(id=candidate.name, ctx=ast.Load()), lineno=check.lineno))
    methods.append(_method("test_check", body, check))
    for stmt in tree.body:
      if stmt is check:
        continue
      if isinstance(stmt, ast.FunctionDef) and stmt.name == "check":
        continue  # an earlier definition the last one replaces, as at import
      stmt, case = _helpers(rewriter, stmt)
      uses_case |= case
      top.append(stmt)
  else:
    loose: list[ast.stmt] = []
    for stmt in tree.body:
      if _is_main_block(stmt):
        continue  # never runs when the module is imported, which is how the judge runs it
      if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name.startswith("test"):
        a = stmt.args
        if a.args or a.posonlyargs or a.vararg or a.kwarg or a.kwonlyargs or stmt.decorator_list:
          raise rewriter.refuse(stmt, f"test function {stmt.name} takes parameters or decorators (pytest fixtures "
                                      "or marks), which unittest cannot supply")
        if isinstance(stmt, ast.AsyncFunctionDef):
          raise rewriter.refuse(stmt, f"test function {stmt.name} is async")
        _check_test_body(rewriter, stmt.body, stmt, reserved)
        methods.append(_method(stmt.name, rewriter.body(stmt.body, "self"), stmt))
      elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
        stmt, case = _helpers(rewriter, stmt)
        uses_case |= case
        top.append(stmt)
      elif _has_assert(stmt):
        loose.append(stmt)
      else:
        top.append(stmt)
    if loose:
      _check_test_body(rewriter, loose, loose[0], reserved)
      methods.insert(0, _method("test_asserts", rewriter.body(loose, "self"), loose[0]))
    if any(m.name == "test_asserts" for m in methods[1:]):
      raise rewriter.refuse(methods[0], "a test function named test_asserts clashes with the top-level asserts' test")
  if rewriter.count == 0:
    raise UnsupportedTest(f"{where}: the file holds no assert to import.")
  names = [m.name for m in methods]
  if len(set(names)) != len(names):
    raise UnsupportedTest(f"{where}: two test functions are named {sorted(n for n in names if names.count(n) > 1)[0]}"
                          "; the later would replace the earlier.")
  used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - _bound_names(tree.body)
  header = _header(candidate, provided, used)
  if uses_case:
    header += host_ast.parse(f"{CASE} = unittest.TestCase()\n", filename="<case>").body
  cls = ast.ClassDef(name=CLASS, bases=[ast.Attribute(value=ast.Name(id="unittest", ctx=ast.Load()),
                                                      attr="TestCase", ctx=ast.Load())],
                     keywords=[], body=methods, decorator_list=[])
  module = ast.fix_missing_locations(ast.Module(body=header + top + [cls], type_ignores=[]))
  return host_ast.unparse(module) + "\n"


def count_tests(source: str) -> int:
  """How many test methods a module written by `convert` holds (a task's expected_tests)."""
  tree = host_ast.parse(source, filename="<imported>")
  return sum(1 for cls in tree.body if isinstance(cls, ast.ClassDef) and cls.name == CLASS
             for m in cls.body if isinstance(m, ast.FunctionDef) and m.name.startswith("test"))
