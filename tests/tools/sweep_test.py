"""tools/sweep.py: sweep files and their override keys, run commands, resume, and the results table from fake run
directories (no RL run: a real 2-cell sweep costs ~2 min of compiles and start-up on 2 cores, over this suite's
budget; tools/sweep.py was run by hand at that size)."""

import csv
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

from absl.testing import absltest
from absl.testing import parameterized
import chex
import ml_collections

from c2jax.services import rl_run_config
from configs import from_json
from configs import rl_char_class
from tools import sweep as sweep_lib

_REPO = pathlib.Path(__file__).resolve().parents[2]
_SWEEPS = sorted(p for p in (_REPO / "configs" / "sweeps").glob("*.py") if p.name != "__init__.py")

# A stand-in for rl_main: writes result.json and two steps of metrics.jsonl, or fails for cell "broken"; every start
# appends the run's workdir to starts.txt (next to this script).
_FAKE_RUN = textwrap.dedent("""
    import json, os, pathlib, sys
    workdir = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--workdir=")))
    with open(pathlib.Path(__file__).parent / "starts.txt", "a") as f:
      f.write(str(workdir) + "\\n")
    if workdir.parent.name == "broken":
      print("boom", file=sys.stderr)
      sys.exit(3)
    seed = int(workdir.name.split("_")[1])
    (workdir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1 * s + seed}) + "\\n"
                                                   for s in (1, 2)))
    (workdir / "result.json").write_text(json.dumps({"pass_at_1_after": 0.5 + seed}))
""")

# A stand-in for rl_main that runs until SIGINT, then exits 130 as rl_main does after checkpointing.
_FAKE_LONG_RUN = textwrap.dedent("""
    import os, pathlib, signal, sys, time
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
    with open(pathlib.Path(__file__).parent / "starts.txt", "a") as f:
      f.write(f"{os.getpid()}\\n")
    time.sleep(60)
""")

# The sweep driver of the interrupt test: executes the toy sweep with the long fake run and prints the statuses.
_DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    from configs import rl_char_class
    from tools import sweep as sweep_lib
    sweep = sweep_lib.Sweep(name="toy", description="", cells={{"a": {{}}}}, seeds=(0, 1), metrics=())
    runs = sweep_lib.plan_runs(sweep, rl_char_class.get_config(), {workdir!r})
    out = sweep_lib.execute(runs, parallel=2, progress=False, poll_s=0.05,
                            command=lambda run: [sys.executable, {script!r}])
    print(json.dumps({{k: v.value for k, v in out.items()}}))
""")


def _sweep(**kw) -> sweep_lib.Sweep:
  d = dict(name="toy", description="A toy sweep.", cells={"a": {"rl.advantage": "grpo"}, "b": {"rl.kl_coef": 0.0}},
           seeds=(0, 1), metrics=("pass_at_1_after", "reward/mean@last"))
  d.update(kw)
  return sweep_lib.Sweep(**d)


class SweepFilesTest(parameterized.TestCase):

  @parameterized.named_parameters((p.stem, p) for p in _SWEEPS)
  def test_loads_and_every_override_is_a_valid_field(self, path):
    sweep = sweep_lib.load_sweep(path)
    self.assertEqual(sweep.name, path.stem)
    self.assertGreaterEqual(len(sweep.cells), 2)
    self.assertNotEmpty(sweep.description)
    base = sweep_lib.load_config(str(_REPO / sweep.config))  # the config the sweep is written for
    runs = sweep_lib.plan_runs(sweep, base, tempfile.mkdtemp(), seeds=(0,))
    self.assertLen(runs, len(sweep.cells))
    configs = [ml_collections.ConfigDict(json.loads(r.config)) for r in runs]
    for c in configs:
      # The values too, not only the keys: each cell's run config must resolve (plan_runs checks it as well).
      self.assertIsNotNone(rl_run_config.parse(c).actor_config)
    # Each cell differs from every other (an override equal to the default would make two cells one).
    self.assertLen({json.dumps(c.to_dict(), sort_keys=True) for c in configs}, len(configs))


class SweepTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.tmp = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

  def test_load_sweep_file_and_errors(self):
    path = self.tmp / "s.py"
    path.write_text("def get_sweep():\n  return {'name': 'n', 'description': 'd', 'cells': {'x': {'seed': 1}}, "
                    "'seeds': [0, 2], 'metrics': ['reward_last', 'length/incorrect@delta']}\n")
    s = sweep_lib.load_sweep(path)
    self.assertEqual(s.seeds, (0, 2))
    self.assertEqual(s.curves, ("reward/mean",))
    path.write_text("def get_sweep():\n  return {'name': 'n', 'description': 'd', 'cells': {'x y': {}}, "
                    "'seeds': [0], 'metrics': []}\n")
    with self.assertRaisesRegex(ValueError, "directory names"):
      sweep_lib.load_sweep(path)
    path.write_text("def get_sweep():\n  return {'name': 'n', 'description': 'd', 'cells': {'x': {}}, "
                    "'seeds': [0], 'metrics': ['reward/mean@median']}\n")
    with self.assertRaisesRegex(ValueError, "agg in first"):
      sweep_lib.load_sweep(path)

  def test_overrides_are_checked_against_the_config(self):
    base = rl_char_class.get_config()
    c = sweep_lib.apply_overrides(base, {"rl.kl_coef": 0, "actors.stop_tokens": (258,), "eval.process": "false",
                                         "trainer.steps": 3})
    self.assertEqual((c.rl.kl_coef, c.actors.stop_tokens, c.eval.process, c.trainer.steps), (0.0, (258,), False, 3))
    self.assertEqual(base.trainer.steps, rl_char_class.get_config().trainer.steps)  # the base is not modified
    with self.assertRaisesRegex(ValueError, "has no field 'advantag'"):
      sweep_lib.apply_overrides(base, {"rl.advantag": "grpo"})
    with self.assertRaisesRegex(ValueError, "has no section 'rll'"):
      sweep_lib.apply_overrides(base, {"rll.advantage": "grpo"})
    with self.assertRaisesRegex(ValueError, "does not fit"):
      sweep_lib.apply_overrides(base, {"trainer.steps": 2.5})
    # --set values are strings, read in their field's type.
    sets = sweep_lib.parse_set(["trainer.steps=3", "rl.advantage=grpo", "eval.process=False",
                                "actors.stop_tokens=[258, 10]", "rl.kl_coef=1e-2", "mesh=fsdp:2"])
    self.assertEqual(sets["trainer.steps"], "3")
    c = sweep_lib.apply_overrides(base, sets)
    self.assertEqual((c.trainer.steps, c.rl.advantage, c.eval.process, c.actors.stop_tokens, c.rl.kl_coef, c.mesh),
                     (3, "grpo", False, (258, 10), 0.01, "fsdp:2"))
    with self.assertRaisesRegex(ValueError, "key=value"):
      sweep_lib.parse_set(["trainer.steps"])
    with self.assertRaisesRegex(ValueError, "not a Python literal"):
      sweep_lib.apply_overrides(base, {"trainer.steps": "three"})
    with self.assertRaisesRegex(ValueError, "holds a string"):
      sweep_lib.apply_overrides(base, {"rl.advantage": 3})

  def test_run_commands_and_configs(self):
    runs = sweep_lib.plan_runs(_sweep(), rl_char_class.get_config(), self.tmp, seeds=(3, 4),
                               common={"trainer.steps": 2})
    self.assertEqual([r.name for r in runs], ["a/seed_3", "a/seed_4", "b/seed_3", "b/seed_4"])
    r = runs[1]
    self.assertEqual(r.workdir, self.tmp / "a" / "seed_4")
    argv = r.command("python")
    self.assertEqual(argv[:2], ["python", str(_REPO / "experiments" / "rl_main.py")])
    self.assertEqual(argv[2:], [f"--config={_REPO / 'configs' / 'from_json.py'}:{r.workdir / 'sweep_config.json'}",
                                f"--workdir={r.workdir}"])
    # What rl_main will read: the base config with --set, the cell's overrides, the seed and a shared cache.
    r.workdir.mkdir(parents=True)
    (r.workdir / "sweep_config.json").write_text(r.config)
    c = from_json.get_config(str(r.workdir / "sweep_config.json"))
    self.assertEqual((c.rl.advantage, c.seed, c.trainer.steps, c.compilation_cache),
                     ("grpo", 4, 2, str(self.tmp / "jax_cache")))
    self.assertEqual(ml_collections.ConfigDict(json.loads(runs[2].config)).rl.kl_coef, 0.0)
    with self.assertRaisesRegex(ValueError, "would override what cell 'a' ablates"):
      sweep_lib.plan_runs(_sweep(), rl_char_class.get_config(), self.tmp, common={"rl.advantage": "dr_grpo"})

  def test_parallelism_counts_the_processes_of_a_run(self):
    runs = sweep_lib.plan_runs(_sweep(), rl_char_class.get_config(), self.tmp)
    self.assertEqual(sweep_lib.processes_per_run(runs[0].config), 4)  # trainer + 2 actors + evaluator
    self.assertEqual(sweep_lib.default_parallel(runs, cores=2), 1)
    self.assertEqual(sweep_lib.default_parallel(runs, cores=16), 4)
    runs = sweep_lib.plan_runs(_sweep(), rl_char_class.get_config(), self.tmp,
                               common={"actors.num": 1, "eval.process": False})
    self.assertEqual(sweep_lib.default_parallel(runs, cores=16), 8)

  def test_metric_values(self):
    history = [{"step": s, "x": float(s)} for s in range(1, 21)]
    result = {"pass_at_1_after": 0.25, "flag": True}
    self.assertEqual(sweep_lib.metric_value("pass_at_1_after", result, history), 0.25)
    self.assertTrue(math.isnan(sweep_lib.metric_value("flag", result, history)))
    self.assertEqual(sweep_lib.metric_value("x@first", result, history), 3.0)  # steps 1..5
    self.assertEqual(sweep_lib.metric_value("x@last", result, history), 18.0)  # steps 16..20
    self.assertEqual(sweep_lib.metric_value("x@delta", result, history), 15.0)
    self.assertEqual(sweep_lib.metric_value("x@mean", result, history), 10.5)
    self.assertEqual(sweep_lib.metric_value("x@max", result, history), 20.0)
    self.assertEqual(sweep_lib.metric_value("x@delta", result, history[:3]), 2.0)  # a window of 1 step each
    self.assertTrue(math.isnan(sweep_lib.metric_value("y@last", result, history)))

  def test_read_history_keeps_the_last_record_of_a_step(self):
    path = self.tmp / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 2, "x": 3}\n{"step": 3, "x"')
    self.assertEqual(sweep_lib.read_history(path), [{"step": 1, "x": 1}, {"step": 2, "x": 3}])

  def test_heldout_curves_are_the_evaluations_by_version(self):
    sweep = _sweep(cells={"a": {}}, curves=("reward/mean", "heldout/pass@1"))
    runs = sweep_lib.plan_runs(sweep, rl_char_class.get_config(), self.tmp / "sweep")
    for run, offset in zip(runs, (0.0, 0.2)):
      run.workdir.mkdir(parents=True)
      # before (version 0) and after (version 30) in eval.jsonl; the evaluator's versions 10 and 20, a cut line.
      (run.workdir / "eval.jsonl").write_text(
          json.dumps({"when": "before", "pass@1": 0.5 + offset, "version": 0}) + "\n"
          + json.dumps({"when": "after", "pass@1": 0.8 + offset, "version": 30}) + "\n")
      (run.workdir / "eval_during.jsonl").write_text(
          json.dumps({"version": 10, "pass@1": 0.6 + offset}) + "\n" + json.dumps({"version": 20, "pass@1": 0.7})
          + "\n" + '{"version": 30, "pass')
      (run.workdir / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": offset}) + "\n")
    self.assertEqual([h["version"] for h in sweep_lib.read_heldout(runs[0].workdir)], [0, 10, 20, 30])
    results = sweep_lib.collect(runs, sweep.metrics)
    points = sweep_lib.curve_points("heldout/pass@1", results)
    self.assertEqual(sorted(points), [0, 10, 20, 30])
    chex.assert_trees_all_close(points[10], [0.6, 0.8])
    chex.assert_trees_all_close(points[20], [0.7, 0.7])
    self.assertEqual(sweep_lib.curve_points("reward/mean", results), {1: [0.0, 0.2]})  # the step log, by step
    md = sweep_lib.write_report(sweep, results, self.tmp / "sweep")["md"].read_text()
    self.assertIn("Held-out `pass@1` by weights version", md)
    self.assertIn("- `a/seed_0`: v0: 0.5, v10: 0.6, v20: 0.7, v30: 0.8\n- `a/seed_1`: v0: 0.7, v10: 0.8, v20: 0.7, "
                  "v30: 1\n", md)

  def test_execute_resumes_reports_failures_and_refuses_changed_configs(self):
    script = self.tmp / "fake_rl_main.py"
    script.write_text(_FAKE_RUN)
    sweep = _sweep(cells={"a": {"rl.advantage": "grpo"}, "broken": {"rl.kl_coef": 0.0}})
    runs = sweep_lib.plan_runs(sweep, rl_char_class.get_config(), self.tmp / "sweep")
    fake = lambda run: [sys.executable, str(script), f"--workdir={run.workdir}"]
    statuses = sweep_lib.execute(runs, parallel=2, command=fake, progress=False, poll_s=0.05, env=dict(os.environ))
    self.assertEqual(statuses, {"a/seed_0": sweep_lib.Status.DONE, "a/seed_1": sweep_lib.Status.DONE,
                                "broken/seed_0": sweep_lib.Status.FAILED, "broken/seed_1": sweep_lib.Status.FAILED})
    self.assertIn("boom", (runs[2].workdir / "sweep.log").read_text())
    # Again: finished runs are skipped, failed ones start again (with the same command).
    sweep_lib.execute(runs, parallel=2, command=fake, progress=False, poll_s=0.05, env=dict(os.environ))
    starts = (self.tmp / "starts.txt").read_text().split()
    self.assertCountEqual(starts, [str(r.workdir) for r in runs] + [str(r.workdir) for r in runs[2:]])

    results = sweep_lib.collect(runs, sweep.metrics)
    paths = sweep_lib.write_report(sweep, results, self.tmp / "sweep", base="configs/rl_char_class.py", parallel=2)
    md = paths["md"].read_text()
    # Cell a: pass_at_1_after 0.5 and 1.5 (seeds 0, 1); reward/mean@last = step 2's 0.2 + seed.
    self.assertIn("| a | 2/2 | 1 ± 0.7071 [0.5, 1.5] | 0.7 ± 0.7071 [0.2, 1.2] |", md)
    self.assertIn("| broken | 0/2, 2 failed | n/a | n/a |", md)
    self.assertIn(f"- `broken/seed_1`: failed (exit 3), log `{runs[3].workdir / 'sweep.log'}`", md)
    with open(paths["csv"], newline="") as f:
      rows = list(csv.DictReader(f))
    self.assertLen(rows, 4)
    self.assertEqual((rows[1]["cell"], rows[1]["seed"], rows[1]["status"], float(rows[1]["pass_at_1_after"])),
                     ("a", "1", "done", 1.5))
    self.assertEqual((rows[2]["status"], rows[2]["returncode"]), ("failed", "3"))
    for key in ("png", "curves"):
      self.assertGreater(paths[key].stat().st_size, 1000)

    changed = sweep_lib.plan_runs(sweep, rl_char_class.get_config(), self.tmp / "sweep", common={"trainer.steps": 7})
    with self.assertRaisesRegex(ValueError, "started with another config"):
      sweep_lib.execute(changed, parallel=1, command=fake, progress=False)

  def _start_driver(self) -> tuple[subprocess.Popen, list[int]]:
    """The interrupt driver with its two fake runs started; returns it and the runs' pids."""
    script = self.tmp / "fake_long_run.py"
    script.write_text(_FAKE_LONG_RUN)
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER.format(repo=str(_REPO), workdir=str(self.tmp / "sweep"), script=str(script))],
        stdout=subprocess.PIPE, text=True, start_new_session=True)  # signals go to the driver alone
    self.addCleanup(driver.kill)
    deadline = time.time() + 60
    while time.time() < deadline and len(_read(self.tmp / "starts.txt").split()) < 2:
      time.sleep(0.05)
    pids = [int(p) for p in _read(self.tmp / "starts.txt").split()]
    self.addCleanup(_stop, pids)  # should a test fail, no fake run outlives it
    self.assertLen(pids, 2)
    return driver, pids

  def test_a_signal_stops_the_running_runs_which_then_read_interrupted(self):
    driver, _ = self._start_driver()
    driver.send_signal(signal.SIGTERM)
    out, _ = driver.communicate(timeout=60)
    self.assertEqual(json.loads(out.splitlines()[-1]), {"a/seed_0": "interrupted", "a/seed_1": "interrupted"})

  def test_runs_stop_when_the_sweep_is_killed(self):
    driver, pids = self._start_driver()
    driver.kill()
    driver.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in pids):
      time.sleep(0.05)
    self.assertFalse(any(_alive(p) for p in pids))


def _stop(pids: list[int]) -> None:
  for pid in pids:
    if _alive(pid):
      os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie (exited, not yet reaped by its new parent) counts as stopped.
  stat = pathlib.Path(f"/proc/{pid}/stat")
  return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _read(path: pathlib.Path) -> str:
  return path.read_text() if path.exists() else ""


if __name__ == "__main__":
  absltest.main()
