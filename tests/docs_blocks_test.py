"""Every fenced block of README.md and the docs runs as written, is validated as written, or is marked as needing
what it needs.

Blocks are read from README.md and every page under docs/ (usage, design, experiments, ...); docs/walkthrough.md's
one block is run by tests/services/walkthrough_test.py, command for command, and is only checked to be that one here.

- `python` blocks run for real, in one process, a doc's blocks one after the other in one namespace (as a reader
  pastes them), in an empty directory where `runs/demo/rl/model` holds a tiny checkpoint as `make demo` leaves one.
- `bash` commands of the entry points are validated as written, not run (each is exercised by its own tests:
  `_COVERED_BY`): the script exists and defines every flag given; `--config=path[:mode]` loads by the entry points'
  own loader (`cli._load_config_file`), every `--config.*` override names a field and parses as its type
  (`cli.override_error`, what the entry points refuse with), and the overridden config parses as the entry point's
  typed run config; every input path is one that an earlier command of the same doc or `make demo` writes. `make`
  commands name a target of the Makefile, and `make test` / `make demo` do what README says they do.
- `json` blocks parse, and a task record loads as a one-line tasks file does; an unlabelled fence is a figure or a
  tree and holds no command.

A block that needs what a fresh clone on a CPU lacks (a real release, a GPU, a running server, the user's own files)
carries `<!-- needs: what -->` on the line before its fence, and its doc says the offline way to try it; its commands
are still checked for scripts and flags, but not run and not held to the input-path rule.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
_NEEDS = re.compile(r"<!--\s*needs:\s*(.+?)\s*-->\s*$")
_LANGS = ("bash", "python", "json", "")
_PYTHON = ".venv/bin/python"
# Flags every absl entry point has (absl.app, absl.logging).
_ABSL_FLAGS = {"help", "helpfull", "helpshort", "helpxml", "flagfile", "undefok", "verbosity", "v", "logtostderr",
               "alsologtostderr", "log_dir", "stderrthreshold", "showprefixforinfo", "only_check_args"}
# Flags whose value is a path the command reads (the rest of a command's paths are outputs or options).
_INPUT_FLAGS = {"hf_dir", "checkpoint", "input_ids", "tokenizer", "tasks", "weights", "logdir", "plot",
                "config.checkpoint", "config.sft.base_checkpoint", "config.init_checkpoint", "config.tokenizer",
                "config.task.tokenizer"}
_INPUT_FLAGS_OF = {"tools/fit_loglinear.py": {"workdir"}}
_OUTPUT_FLAGS = {"workdir", "out_dir", "output", "results", "json_out"}
# The typed run config each entry point parses its --config into (module, function).
_PARSE_OF = {"experiments/rl_main.py": "c2jax.services.rl_run_config",
             "experiments/pretrain_main.py": "c2jax.services.pretrain_run_config",
             "experiments/eval_main.py": "c2jax.eval.suite_eval",
             "tools/sweep.py": "c2jax.services.rl_run_config"}
# Where each entry point the docs name is exercised (so that this test only validates its commands): a test running
# the script, or its module's code in process ("in process"), or nothing on a CPU clone (said so).
_COVERED_BY = {
    "experiments/rl_main.py": "tests/services/walkthrough_test.py, tests/experiments/entry_points_test.py",
    "experiments/pretrain_main.py": "tests/services/pretrain_loop_test.py (in process), "
                                    "tests/experiments/entry_points_test.py (--config_help, refusals)",
    "experiments/eval_main.py": "tests/services/walkthrough_test.py, tests/eval/complementary_test.py (its service)",
    "experiments/serve_main.py": "tests/services/openai_server_test.py",
    "tools/convert_hf.py": "tests/services/walkthrough_test.py",
    "tools/logits.py": "tests/model/hf_parity_test.py",
    "tools/validate_tasks.py": "tests/tools/validate_tasks_test.py (in process)",
    "tools/copy_probe.py": "tests/tools/copy_probe_test.py",
    "tools/perplexity_vs_reward.py": "tests/tools/perplexity_vs_reward_test.py (in process)",
    "tools/plan.py": "tests/parallel/plan_test.py (c2jax.parallel.plan, in process)",
    "tools/fit_loglinear.py": "tests/services/loglinear_test.py (c2jax.services.loglinear, in process)",
    "tools/sweep.py": "tests/tools/sweep_test.py (fake runs)",
    "tools/gpu_check.sh": "tests/tools/gpu_check_install_test.py (--cpu_smoke); the GPU stages need a GPU",
}


@dataclasses.dataclass(frozen=True)
class Block:
  doc: str        # path relative to the repository root
  line: int       # 1-based line of the opening fence
  lang: str       # the fence's info string's first word ("" for none)
  text: str
  needs: str      # what the block needs that a fresh clone on a CPU lacks ("" for nothing)

  @property
  def where(self) -> str:
    return f"{self.doc}:{self.line}"


def blocks(doc: str) -> list[Block]:
  """The fenced blocks of `doc` (relative to the root), each with the `<!-- needs: ... -->` marker of the line before
  its fence."""
  text = (ROOT / doc).read_text(encoding="utf-8")
  out = []
  for m in _FENCE.finditer(text):
    line = text.count("\n", 0, m.start()) + 1
    before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
    needs = _NEEDS.search(before)
    out.append(Block(doc, line, m.group(1), m.group(2), needs.group(1) if needs else ""))
  return out


def docs() -> list[str]:
  """The docs whose blocks this test runs or validates: README.md and every page under docs/ but the walkthrough."""
  pages = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
  return ["README.md"] + [p for p in pages if p != "docs/walkthrough.md"]


def commands(block_text: str) -> list[list[str]]:
  """The commands of a bash block as argv lists: continuations joined, comments and `export` lines dropped, leading
  VAR=value assignments dropped."""
  out = []
  for line in block_text.replace("\\\n", " ").splitlines():
    line = line.strip()
    if not line or line.startswith("#") or line.startswith("export "):
      continue
    argv = shlex.split(line, comments=True)
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
      argv = argv[1:]
    if argv:
      out.append(argv)
  return out


def _module_file(name: str) -> pathlib.Path | None:
  path = ROOT / name.replace(".", "/")
  for candidate in (path.with_suffix(".py"), path / "__init__.py"):
    if candidate.is_file():
      return candidate
  return None


@functools.cache
def defined_flags(script: str) -> frozenset[str]:
  """The absl flags `script` defines, itself or in the repository's modules it imports (transitively), found in their
  source: `flags.DEFINE_*("name", ...)` and `define_config_file` (the `config` flag)."""
  seen: set[pathlib.Path] = set()
  todo = [ROOT / script]
  names = set(_ABSL_FLAGS)
  while todo:
    path = todo.pop()
    if path in seen:
      continue
    seen.add(path)
    source = path.read_text(encoding="utf-8")
    names |= set(re.findall(r"DEFINE_\w+\(\s*\"(\w+)\"", source))
    if "define_config_file(" in source or "DEFINE_config_file(" in source:
      names.add("config")
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
      elif isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
      else:
        continue
      for name in modules:
        if name.split(".")[0] in ("c2jax", "tools", "pallas_kernels", "configs"):
          found = _module_file(name)
          if found:
            todo.append(found)
  return frozenset(names)


def _flag_items(argv: list[str]) -> list[tuple[str, str | None]]:
  """(name, value or None) of every --flag of argv."""
  return [(a[2:].partition("=")[0], a.partition("=")[2] if "=" in a else None) for a in argv if a.startswith("--")]


@functools.cache
def make_targets() -> dict[str, str]:
  """{target: its recipe and prerequisites line} of the Makefile."""
  text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
  targets = {}
  for m in re.finditer(r"^([\w-]+):([^=\n]*)\n((?:\t.*\n?)*)", text, re.M):
    targets[m.group(1)] = m.group(2) + "\n" + m.group(3)
  return targets


def demo_commands() -> list[list[str]]:
  """`make demo`'s commands as argv lists, $(PY) as .venv/bin/python."""
  recipe = make_targets()["demo"].split("\n", 1)[1]
  return [shlex.split(line.strip().replace("$(PY)", _PYTHON)) for line in recipe.splitlines() if line.strip()]


def _outputs(argv: list[str]) -> list[str]:
  script = argv[1] if len(argv) > 1 else ""
  return [v for k, v in _flag_items(argv) if k in _OUTPUT_FLAGS and k not in _INPUT_FLAGS_OF.get(script, ()) and v]


def _inputs(argv: list[str]) -> list[str]:
  script = argv[1] if len(argv) > 1 else ""
  wanted = _INPUT_FLAGS | _INPUT_FLAGS_OF.get(script, set())
  return [v for k, v in _flag_items(argv) if k in wanted and v and ("/" in v or "." in v)]


def _written_by(path: str, outputs: list[str]) -> bool:
  path = path.rstrip("/")
  return any(path == o.rstrip("/") or path.startswith(o.rstrip("/") + "/") for o in outputs)


def command_problems(argv: list[str], block: Block, outputs: list[str]) -> list[str]:
  """What does not hold of one command as written (static: files, flags, input paths); appends its outputs."""
  where = f"{block.where}: {shlex.join(argv)[:100]}"
  if argv[0] == "make":
    targets = make_targets()
    return [f"{where}: the Makefile has no target {t!r}" for t in argv[1:] if t not in targets]
  if argv[0] == "bash":
    return [] if (ROOT / argv[1]).is_file() else [f"{where}: {argv[1]} does not exist"]
  problems = []
  if argv[0] == ".venv/bin/tensorboard":
    if "tensorboard" not in (ROOT / "setup.py").read_text(encoding="utf-8"):
      problems.append(f"{where}: setup.py installs no tensorboard")
  elif argv[0] != _PYTHON:
    return [f"{where}: a command runs {_PYTHON} (what make creates), `make` or `bash`, not {argv[0]}"]
  else:
    script = argv[1]
    if not (ROOT / script).is_file():
      return [f"{where}: {script} does not exist"]
    names = defined_flags(script)
    for name, value in _flag_items(argv[2:]):
      base = name.split(".", 1)[0]
      if base not in names and not (base.startswith("no") and base[2:] in names):
        problems.append(f"{where}: {script} defines no flag --{base}")
      if name == "config" and value:
        if not (ROOT / value.partition(":")[0]).is_file():
          problems.append(f"{where}: --config={value}: no such file")
  if not block.needs:
    problems += [f"{where}: reads {p}, which no earlier command of {block.doc} nor `make demo` writes; write it "
                 "first or mark the block <!-- needs: ... -->" for p in _inputs(argv) if not _written_by(p, outputs)]
  outputs += _outputs(argv)
  return problems


def config_checks() -> list[dict]:
  """The --config commands of every unmarked bash block and of `make demo`: {where, script, spec, argv}."""
  out = []
  cmds = [(Block("Makefile", 0, "bash", "", ""), argv) for argv in demo_commands()]
  for doc in docs():
    for block in blocks(doc):
      if block.lang == "bash":
        cmds += [(block, argv) for argv in commands(block.text)]
  for block, argv in cmds:
    if argv[0] == _PYTHON and argv[1] in _PARSE_OF:
      spec = next((v for k, v in _flag_items(argv) if k == "config"), None)
      if spec:
        out.append({"where": block.where, "script": argv[1], "spec": spec, "argv": argv[2:]})
  return out


def task_records() -> list[dict]:
  """The json blocks that are coding-task records (`format` and `task_id` keys): {where, record}."""
  out = []
  for doc in docs():
    for b in blocks(doc):
      if b.lang == "json":
        record = json.loads(b.text)
        if isinstance(record, dict) and {"format", "task_id"} <= set(record):
          out.append({"where": b.where, "record": record})
  return out


def python_programs() -> list[dict]:
  """Each doc's unmarked python blocks, in order: {doc, blocks: [(line, text)]}."""
  out = []
  for doc in docs():
    runnable = [(b.line, b.text) for b in blocks(doc) if b.lang == "python" and not b.needs]
    if runnable:
      out.append({"doc": doc, "blocks": runnable})
  return out


def _run_programs(programs: list[dict]) -> list[str]:
  """Runs each doc's python blocks in one namespace, stopping at a doc's first failing block; its problems."""
  import traceback
  problems = []
  for program in programs:
    namespace: dict = {"__name__": "__doc_snippets__"}
    for line, text in program["blocks"]:
      start = time.process_time()
      try:
        exec(compile(text, f"{program['doc']}:{line}", "exec"), namespace)
      except Exception:  # noqa: BLE001  (reported with its traceback's last lines)
        problems.append(f"{program['doc']}:{line}: " + " | ".join(traceback.format_exc().strip().splitlines()[-3:]))
        break
      finally:
        print(f"{program['doc']}:{line}: {time.process_time() - start:.1f} CPU-s", file=sys.stderr)
  return problems


def _load_task_records(tasks: list[dict]) -> list[str]:
  """Loads each task record as the doc says to give it: one line of a tasks file; its problems."""
  from c2jax.envs.tasks import user_tasks
  problems = []
  for i, task in enumerate(tasks):
    path = pathlib.Path(f"runs/task_record_{i}.jsonl")
    path.write_text(json.dumps(task["record"]) + "\n")
    try:
      user_tasks.load_tasks(str(path))
    except Exception as e:  # noqa: BLE001
      problems.append(f"{task['where']}: the task record does not load: {type(e).__name__}: {e}")
  return problems


def _apply_overrides(config, argv: list[str]) -> None:
  """Sets each `--config.key=value` of argv in `config`, parsed as its field's current value says."""
  from c2jax.services import cli
  for arg in argv:
    if not arg.startswith("--config.") or "=" not in arg:
      continue
    key, value = arg[len("--config."):].split("=", 1)
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node[part]
    old = node[leaf]
    if isinstance(old, (bool, int, float, tuple)):
      node[leaf] = cli._parse_like(old, value)
    elif isinstance(old, str):
      node[leaf] = value
    else:  # None, a dict: a Python or JSON literal, else the string
      try:
        node[leaf] = ast.literal_eval(value)
      except (ValueError, SyntaxError):
        node[leaf] = value


def _check_configs(checks: list[dict], root: str) -> list[str]:
  """Loads each --config command's config file (and mode) as the entry points do, checks its overrides as they
  refuse them, applies them and parses the typed run config; its problems."""
  import importlib
  from c2jax.services import cli
  problems = []
  for check in checks:
    where = f"{check['where']}: {check['script']} --config={check['spec']}"
    path, sep, mode = check["spec"].partition(":")
    try:
      config = cli._load_config_file(os.path.join(root, path) + sep + mode)
      message = cli.override_error(config, check["argv"])
      if message:
        problems.append(f"{where}: {message}")
        continue
      _apply_overrides(config, check["argv"])
      importlib.import_module(_PARSE_OF[check["script"]]).parse(config)
    except Exception as e:  # noqa: BLE001
      problems.append(f"{where}: {type(e).__name__}: {e}")
  return problems


def child(payload_path: str) -> None:
  """Runs in the test's child process (cwd: an empty directory): writes a tiny checkpoint where `make demo` leaves
  its RL model, runs each doc's python blocks in one namespace, loads each task record as a tasks file, and checks
  every --config command's config; prints one JSON line of problems."""
  from c2jax.model import checkpoint
  from tests import tiny
  payload = json.loads(pathlib.Path(payload_path).read_text())
  checkpoint.save_checkpoint(os.path.abspath("runs/demo/rl/model"), tiny.params(), tiny.MODEL)
  problems = _run_programs(payload["python"])
  problems += _load_task_records(payload["tasks"])
  problems += _check_configs(payload["configs"], payload["root"])
  print(json.dumps(problems))


class BlocksTest(absltest.TestCase):
  """What is checked without starting a process."""

  def test_every_fence_is_known_and_unlabelled_ones_hold_no_command(self):
    problems = []
    for doc in docs():
      for b in blocks(doc):
        if b.lang not in _LANGS:
          problems.append(f"{b.where}: fence language {b.lang!r}; use one of {_LANGS}")
        if b.lang == "" and re.search(r"^\s*(\.venv/bin/|python |make )", b.text, re.M):
          problems.append(f"{b.where}: an unlabelled fence holds a command; label it bash")
    self.assertEqual(problems, [])

  def test_every_bash_command_holds_as_written(self):
    problems = []
    for doc in docs():
      outputs = [o for argv in demo_commands() for o in _outputs(argv)]  # what `make demo` writes
      for b in blocks(doc):
        if b.lang == "bash":
          self.assertNotEmpty(commands(b.text), b.where)
          for argv in commands(b.text):
            problems += command_problems(argv, b, outputs)
    self.assertEqual(problems, [])

  def test_every_entry_point_named_is_run_by_a_test(self):
    scripts = {argv[1] for doc in docs() for b in blocks(doc) if b.lang == "bash" for argv in commands(b.text)
               if argv[0] in (_PYTHON, "bash")}
    self.assertEmpty(sorted(scripts - set(_COVERED_BY)), "entry points the docs name that _COVERED_BY does not place")
    for script, where in _COVERED_BY.items():
      for path in re.findall(r"tests/[\w/]+(?:\.py)?", where):
        self.assertTrue((ROOT / path).exists(), f"{script}: {path} does not exist")

  def test_json_blocks_parse(self):
    for doc in docs():
      for b in blocks(doc):
        if b.lang == "json":
          json.loads(b.text)

  def test_make_test_and_demo_do_what_readme_says(self):
    targets = make_targets()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    self.assertIn("make test", readme)
    self.assertIn("make demo", readme)
    prerequisites = targets["test"].split("\n", 1)[0].split()
    self.assertEqual(prerequisites[:2], ["setup", "lint"])            # installs bubblewrap ..., then lints
    self.assertIn("bubblewrap", targets["setup"])
    self.assertIn("ruff check", targets["lint"])
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    self.assertIn('install -q -e ".[test]"', makefile)
    # The demo needs c2jax alone; the suite's install (with its extras) counts as the demo's too.
    self.assertEqual(targets["demo"].split("\n", 1)[0].split(), ["$(BASE_STAMP)"])
    self.assertIn("install -q -e .\n", makefile)
    self.assertIn("touch $@ $(BASE_STAMP)", makefile)
    # Both of the suite's sessions (tests/conftest.py, XLA:CPU's emitters): the element-wise one, then the tests
    # marked fusion_emitters on XLA's default.
    self.assertIn("$(call SESSIONS,", targets["test"])
    sessions = makefile.split("\nSESSIONS = ", 1)[1].split("\n\n", 1)[0]
    self.assertIn('C2JAX_TEST_CPU_EMITTERS=elemental $(PYTEST) $(1) -m "($(2)) and not fusion_emitters"', sessions)
    self.assertIn('$(PYTEST) $(1) -m "($(2)) and fusion_emitters"', sessions)
    demo = demo_commands()
    self.assertEqual([(a[1], a[2]) for a in demo], [
        ("experiments/pretrain_main.py", "--config=configs/pretrain_tiny.py:rl_tiny"),
        ("experiments/rl_main.py", "--config=configs/rl_tiny.py")])
    for argv in demo:
      self.assertIn(argv[2].split("=", 1)[1], readme)

  def test_walkthrough_is_the_walkthrough_tests(self):
    (block,) = [b for b in blocks("docs/walkthrough.md") if b.lang]
    self.assertEqual((block.lang, block.needs), ("bash", "a real release"))
    self.assertIn("write_release('runs/tiny')", (ROOT / "docs/walkthrough.md").read_text(encoding="utf-8"))
    self.assertIn("docs/walkthrough.md", (ROOT / "tests/services/walkthrough_test.py").read_text(encoding="utf-8"))

  def test_marked_blocks_say_the_offline_way(self):
    for doc in docs():
      text = (ROOT / doc).read_text(encoding="utf-8")
      for b in blocks(doc):
        if b.needs:
          self.assertIn("offline", text.lower(), f"{b.where} needs {b.needs}; its doc does not say the offline way")

  def test_parsers(self):
    text = ("a\n<!-- needs: a GPU -->\n```bash\nX=1 .venv/bin/python t.py --a=1 \\\n  --b # c\nexport Y=2\n```\n"
            "```\nx\n```\n")
    got = _FENCE.findall(text)
    self.assertEqual([g[0] for g in got], ["bash", ""])
    self.assertEqual(commands(got[0][1]), [[".venv/bin/python", "t.py", "--a=1", "--b"]])
    self.assertEqual(_flag_items(["--a=1", "--b", "x"]), [("a", "1"), ("b", None)])
    self.assertTrue(_written_by("runs/demo/rl/model", ["runs/demo/rl"]))
    self.assertFalse(_written_by("runs/demo/rlx", ["runs/demo/rl"]))


@pytest.mark.e2e  # one child process: every python block, every --config command's config
class RunTest(absltest.TestCase):

  def test_python_blocks_run_and_configs_parse(self):
    programs, configs, tasks = python_programs(), config_checks(), task_records()
    self.assertNotEmpty(programs)
    self.assertNotEmpty(configs)
    self.assertNotEmpty(tasks)
    with tempfile.TemporaryDirectory() as work:
      payload = pathlib.Path(work) / "payload.json"
      payload.write_text(json.dumps({"python": programs, "configs": configs, "tasks": tasks, "root": str(ROOT)}))
      cwd = pathlib.Path(work) / "clone"
      cwd.mkdir()
      # The suite's XLA flags (its -O0 backend: the blocks' programs run once) with the mesh snippet's 8 devices.
      flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
      env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
                 XLA_FLAGS=" ".join(flags + ["--xla_force_host_platform_device_count=8"]))
      program = f"from tests import docs_blocks_test as t; t.child({str(payload)!r})"
      proc = subprocess.run([sys.executable, "-c", program], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600)
    self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
    self.assertEqual(json.loads(proc.stdout.strip().splitlines()[-1]), [])


if __name__ == "__main__":
  absltest.main()
