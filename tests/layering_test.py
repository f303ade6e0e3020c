"""The declared layer order (docs/design/layers.md) and a check that every import keeps to it.

A module may import modules of its own package and of packages in lower layers, nothing else; no two modules may
import each other, directly or through others; a leaf package (the sandbox) imports nothing of the project outside
itself. Imports are read from the source (module level, inside functions and classes, and `importlib.import_module`
/ `__import__` calls whose module name, or its leading part, is a string constant), so an import hidden in a
function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

from absl.testing import absltest
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
TREES = ("c2jax", "pallas_kernels", "configs", "experiments", "tools")
# Data shipped with the package (the realistic suite's task repositories), not part of the library.
EXCLUDED = ("c2jax/envs/tasks/suites/realistic/tasks/",)

# Lowest first. A package may import its own modules and packages of strictly lower layers; packages that share a
# layer are peers and import neither each other nor anything above. Why this order: docs/design/layers.md.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("c2jax", "c2jax.registry", "c2jax.typed_config")),
    ("sandbox", ("c2jax.sandbox",)),
    ("kernels", ("pallas_kernels",)),
    ("model", ("c2jax.model",)),
    ("parallel", ("c2jax.parallel",)),
    ("optim", ("c2jax.optim",)),
    ("algorithms", ("c2jax.pretrain", "c2jax.rl")),
    ("data", ("c2jax.data",)),
    ("envs: tasks, token tasks, tools", ("c2jax.envs.tasks", "c2jax.envs.token_tasks", "c2jax.envs.tools")),
    ("envs: chat, grading", ("c2jax.envs.chat", "c2jax.envs.grading")),
    ("envs: core", ("c2jax.envs.core",)),
    ("envs: teachers", ("c2jax.envs.teachers",)),
    ("envs", ("c2jax.envs",)),
    ("envs: service", ("c2jax.envs.service",)),
    ("rollouts", ("c2jax.rollouts",)),
    ("actors", ("c2jax.actors",)),
    ("eval", ("c2jax.eval",)),
    ("services", ("c2jax.services",)),
    ("configs", ("configs",)),
    ("entry points", ("experiments", "tools")),
)


# Leaves import nothing of the project outside themselves, not even the base below them (checked apart from LAYERS):
# the sandbox, so that the security boundary provably depends on no other code.
LEAVES = ("c2jax.sandbox",)


def module_name(path: pathlib.Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts.pop()
  return ".".join(parts)


def read_sources() -> dict[str, tuple[str, bool]]:
  """{module name: (source, is_package)} of every module under TREES."""
  out = {}
  for tree in TREES:
    for path in sorted((ROOT / tree).rglob("*.py")):
      rel = path.relative_to(ROOT).as_posix()
      if any(rel.startswith(e) for e in EXCLUDED):
        continue
      out[module_name(path)] = (path.read_text(encoding="utf-8"), path.name == "__init__.py")
  return out


def _string_prefix(node: ast.AST) -> str | None:
  """The module name of an import_module argument: a constant, or the constant head of an f-string or a sum."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return node.value
  if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
    return str(node.values[0].value).rstrip(".") or None
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
    return _string_prefix(node.left)
  return None


def imported_names(module: str, source: str, is_package: bool) -> list[tuple[str, int]]:
  """Every module name `source` imports (as written, absolute), with its line."""
  names = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names += [(a.name, node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
      # `from package import name`: the submodule `name` when there is one (`resolve` falls back to the package).
      names += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    elif isinstance(node, ast.Call) and node.args:
      func = node.func
      called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
      if called in ("import_module", "__import__"):
        prefix = _string_prefix(node.args[0])
        if prefix:
          names.append((prefix, node.lineno))
  return names


def layer_of(module: str) -> tuple[int, str] | None:
  """(layer index, package) by the longest declared package that is `module` or contains it."""
  best = None
  for index, (_, packages) in enumerate(LAYERS):
    for package in packages:
      if module == package or module.startswith(package + "."):
        if best is None or len(package) > len(best[1]):
          best = (index, package)
  return best


@dataclasses.dataclass(frozen=True)
class Graph:
  edges: dict[str, dict[str, int]]  # module -> {imported module: line}


def import_graph(sources: dict[str, tuple[str, bool]]) -> Graph:
  """Edges between the modules of `sources` (imports of anything else, e.g. jax, are not edges)."""

  def resolve(name: str) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
      candidate = ".".join(parts[:i])
      if candidate in sources:
        return candidate
    return None

  edges = {}
  for module, (source, is_package) in sources.items():
    out = {}
    for name, line in imported_names(module, source, is_package):
      target = resolve(name)
      if target is not None and target != module:
        out.setdefault(target, line)
    edges[module] = out
  return Graph(edges)


def layer_violations(graph: Graph) -> list[str]:
  problems = []
  for module, targets in sorted(graph.edges.items()):
    own = layer_of(module)
    if own is None:
      problems.append(f"{module} is in no layer of LAYERS: add its package to the table and to docs/design/layers.md.")
      continue
    for target, line in sorted(targets.items()):
      theirs = layer_of(target)
      if theirs is None or theirs[1] == own[1]:
        continue
      if theirs[0] >= own[0]:
        problems.append(f"{module} (line {line}, layer {LAYERS[own[0]][0]}) imports {target} (layer "
                        f"{LAYERS[theirs[0]][0]}): a module may import only its own package and lower layers.")
  return problems


def _within(name: str, package: str) -> bool:
  return name == package or name.startswith(package + ".")


def outside_imports(sources: dict[str, tuple[str, bool]], package: str) -> list[str]:
  """Every import by a module of `package` of a module of the project (TREES) outside `package`.

  Read from the imported names themselves, not the graph's edges: a name that resolves to no module here (a typo, a
  module since moved) still counts.
  """
  problems = []
  for module, (source, is_package) in sorted(sources.items()):
    if not _within(module, package):
      continue
    for name, line in imported_names(module, source, is_package):
      if name.split(".")[0] in TREES and not _within(name, package):
        problems.append(f"{module} (line {line}) imports {name}: {package} is a leaf and imports nothing of the "
                        "project outside itself.")
  return problems


def cycles(graph: Graph) -> list[list[str]]:
  """Strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []
  counter = [0]

  def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on_stack.add(v)
    for w in graph.edges.get(v, {}):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph.edges):
    if v not in index:
      visit(v)
  return sorted(found)


def check(sources: dict[str, tuple[str, bool]]) -> list[str]:
  graph = import_graph(sources)
  return layer_violations(graph) + [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]


def _planted(sources, module: str, line: str, *, in_function: bool = False) -> dict:
  source, is_package = sources[module]
  code = f"\n\ndef _planted():\n  {line}\n" if in_function else f"\n{line}\n"
  return {**sources, module: (source + code, is_package)}


class LayeringTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.sources = read_sources()

  def test_every_import_keeps_to_the_layer_order_and_there_are_no_cycles(self):
    problems = check(self.sources)
    self.assertEmpty(problems, "\n".join(problems))

  def test_every_declared_package_exists(self):
    # A renamed package must not leave a stale row that silently matches nothing.
    for _, packages in LAYERS:
      for package in packages:
        self.assertTrue(any(m == package or m.startswith(package + ".") for m in self.sources),
                        f"LAYERS names {package}, which holds no module here.")

  def test_a_planted_upward_import_fails(self):
    planted = _planted(self.sources, "c2jax.model.mla", "from c2jax.services import rl_loop")
    upward = [p for p in check(planted) if not p.startswith("import cycle:")]
    self.assertLen(upward, 1)
    self.assertIn("c2jax.model.mla (line", upward[0])
    self.assertIn("imports c2jax.services.rl_loop (layer services)", upward[0])

  def test_an_import_inside_a_function_counts(self):
    planted = _planted(self.sources, "c2jax.rl.update", "import c2jax.rollouts.buffer", in_function=True)
    self.assertTrue(any("c2jax.rl.update" in p and "c2jax.rollouts.buffer" in p for p in check(planted)))

  def test_an_import_module_string_counts(self):
    planted = _planted(self.sources, "c2jax.model.presets",
                       'importlib.import_module(f"configs.{name}")', in_function=True)
    self.assertTrue(any("c2jax.model.presets" in p and "configs" in p for p in check(planted)))

  def test_peers_in_one_layer_may_not_import_each_other(self):
    planted = _planted(self.sources, "c2jax.rl.kl", "from c2jax.pretrain import step")
    self.assertTrue(any("c2jax.rl.kl" in p and "c2jax.pretrain.step" in p for p in check(planted)))

  def test_the_sandbox_imports_nothing_of_the_project_outside_itself(self):
    for package in LEAVES:
      self.assertTrue(any(_within(m, package) for m in self.sources), f"{package} holds no module here.")
      problems = outside_imports(self.sources, package)
      self.assertEmpty(problems, "\n".join(problems))

  def test_a_planted_import_in_the_sandbox_fails(self):
    planted = _planted(self.sources, "c2jax.sandbox.sandbox", "from c2jax.envs.tasks import coding_tasks",
                       in_function=True)
    problems = outside_imports(planted, "c2jax.sandbox")
    self.assertLen(problems, 1)
    self.assertIn("c2jax.sandbox.sandbox (line", problems[0])
    self.assertIn("imports c2jax.envs.tasks.coding_tasks", problems[0])
    self.assertTrue(any("c2jax.sandbox.sandbox" in p and "c2jax.envs.tasks.coding_tasks" in p for p in check(planted)))
    # Nor the base, which the layer order alone allows (it is below), and a relative import counts.
    planted = _planted(self.sources, "c2jax.sandbox.cgroup", "from .. import registry")
    problems = outside_imports(planted, "c2jax.sandbox")
    self.assertLen(problems, 1)
    self.assertIn("c2jax.sandbox.cgroup (line", problems[0])
    self.assertIn("imports c2jax.registry:", problems[0])

  @pytest.mark.slow
  def test_a_planted_upward_import_between_envs_sub_layers_fails(self):
    # The lowest envs layer may not import the environment core above it.
    planted = _planted(self.sources, "c2jax.envs.tasks.coding_tasks", "from c2jax.envs.core import env",
                       in_function=True)
    upward = [p for p in check(planted) if not p.startswith("import cycle:")]
    self.assertLen(upward, 1)
    self.assertIn("c2jax.envs.tasks.coding_tasks (line", upward[0])
    self.assertIn("imports c2jax.envs.core.env (layer envs: core)", upward[0])
    # Nor the package's own modules, the top of envs.
    planted = _planted(self.sources, "c2jax.envs.grading.grading", "from c2jax.envs import coding_rl",
                       in_function=True)
    self.assertTrue(any("c2jax.envs.grading.grading" in p and "c2jax.envs.coding_rl (layer envs)" in p
                        for p in check(planted)))
    # Peers of one envs layer import neither each other.
    planted = _planted(self.sources, "c2jax.envs.tools.protocol", "from c2jax.envs.tasks import coding_tasks",
                       in_function=True)
    self.assertTrue(any("c2jax.envs.tools.protocol" in p and "c2jax.envs.tasks.coding_tasks" in p
                        for p in check(planted)))

  def test_a_planted_cycle_within_a_package_fails(self):
    # mla imports rope; rope importing mla closes a cycle that no layer rule sees (both are in model).
    planted = _planted(self.sources, "c2jax.model.rope", "from c2jax.model import mla", in_function=True)
    problems = check(planted)
    self.assertTrue(any(p.startswith("import cycle:") and "c2jax.model.mla" in p and "c2jax.model.rope" in p
                        for p in problems), problems)


if __name__ == "__main__":
  absltest.main()
