"""Every entry point refuses a config key that does not exist, and a bad value, in one sentence (exit code 2) that
names the key and what it allows: no traceback, nothing started. So does an actor given a damaged data path (its
buffer's run_config.json, the weight store's LATEST). The refusals run in processes forked from one that has imported
jax and the config modules (`tests/experiments/preloaded.py`); `--config_help` runs each entry point as a shell
would start it."""

import functools
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import pytest

from c2jax.envs.teachers import scripted_policies
from tests.experiments import preloaded

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(_ROOT)}

# (name, argv before the bad flag)
_ENTRY_POINTS = {
    "rl_main": [str(_ROOT / "experiments" / "rl_main.py"), "--workdir=/nonexistent/rl"],
    "pretrain_main": [str(_ROOT / "experiments" / "pretrain_main.py"), "--workdir=/nonexistent/pretrain"],
    "eval_main": [str(_ROOT / "experiments" / "eval_main.py"), "--workdir=/nonexistent/eval"],
    "actor_main": [str(_ROOT / "experiments" / "actor_main.py"), "--buffer=/nonexistent/b", "--weights=/nonexistent/w",
                   f"--config={_ROOT / 'configs' / 'rl_char_class.py'}"],
    "actor_process": ["-m", "c2jax.services.actor_process", "--buffer=/nonexistent/b", "--weights=/nonexistent/w",
                      f"--config={_ROOT / 'configs' / 'rl_tiny.py'}"],
}

# (entry point, bad flag, what the one line must say)
_CASES = [
    ("rl_main", "--config.trainer.bogus_key=1",
     "--config.trainer.bogus_key: trainer has no key 'bogus_key'; its keys are checkpoint_every, cpus,"),
    ("rl_main", "--config.trainer.steps=many", "--config.trainer.steps=many: the field is an integer (it holds 30)"),
    ("rl_main", "--config.actors.weight_updates=sometimes",
     "actors.weight_updates='sometimes' is not one of 'in_flight', 'between_calls'"),
    ("pretrain_main", "--config.phases.bulk.stpes=3", "phases.bulk has no key 'stpes'; its keys are batch_size,"),
    ("pretrain_main", "--config.phases.bulk.decay=exponential",
     "phases.bulk.decay='exponential' is not one of 'cosine', 'linear'"),
    ("eval_main", "--config.polcy=empty", "the config has no key 'polcy'; its keys are checkpoint, env,"),
    ("eval_main", "--config.policy=oracle",
     f"policy='oracle' is not 'checkpoint' or a scripted policy ({', '.join(scripted_policies.POLICIES)})"),
    ("actor_main", "--config.actors.nm=3", "actors has no key 'nm'; its keys are admission_recheck_s,"),
    ("actor_main", "--config.eval.best_of=99", "eval: best_of=99 must lie in [1, samples=8]"),
    ("actor_process", "--config.sft.teacher.flawed=9",
     "sft.teacher: copies=4 must be >= 1 and flawed=9 in [0, copies]"),
    ("actor_process", "--config.sft.bogus=1", "sft has no key 'bogus'; its keys are base_checkpoint, batch_size,"),
]


@functools.cache
def _run_config_json() -> str:
  """configs/rl_char_class.py's run config as rl_main stores it in the buffer (once: a test of a damaged LATEST
  needs an intact run config beside it)."""
  from c2jax.services import cli, rl_run_config
  return rl_run_config.to_json(rl_run_config.parse(cli._load_config_file(str(_ROOT / "configs" / "rl_char_class.py"))))


@pytest.mark.e2e
class EntryPointsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.launcher = preloaded.Launcher(_ENV, preloaded.ENTRY_POINT_IMPORTS)

  @classmethod
  def tearDownClass(cls):
    cls.launcher.close()
    super().tearDownClass()

  @parameterized.named_parameters((f"{name}_{i}", name, flag, message)
                                  for i, (name, flag, message) in enumerate(_CASES))
  def test_refuses_in_one_sentence(self, name, flag, message):
    proc = self.launcher.run(_ENTRY_POINTS[name] + [flag], cwd="/", timeout=300)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    self.assertLen(lines, 1, proc.stderr[-2000:])
    self.assertIn(message, lines[0])
    self.assertNotIn("Traceback", proc.stderr)

  @parameterized.named_parameters(
      ("rl_batch", "rl_main", "fsdp:3", "mesh='fsdp:3': Batch size 16 does not split into micro_batches=1 of rows "
       "divisible by data x fsdp x expert = 3"),
      ("pretrain_batch", "pretrain_main", "fsdp:3", "mesh='fsdp:3', phase 'bulk': Batch size 8 is not divisible by "
       "data x fsdp x expert = 3"),
      ("pretrain_heads", "pretrain_main", "tensor:8", "mesh='tensor:8', phase 'bulk': 4 attention heads cannot be "
       "split over a tensor axis of 8"),
  )
  def test_refuses_a_mesh_that_cannot_take_the_run(self, name, mesh, message):
    """Found before anything trains (the RL job's SFT warm start and actors included), not as a traceback. The
    other refusals (devices, heads, micro-batches) are the same path: tests/services/rl_run_config_test.py and
    tests/parallel/layout_test.py hold them in-process."""
    workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
    argv = [_ENTRY_POINTS[name][0], f"--workdir={workdir}", f"--config.mesh={mesh}"]
    env = {**_ENV, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = self.launcher.run(argv, env=env, cwd="/", timeout=120)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    self.assertLen(lines, 1, proc.stderr[-2000:])
    self.assertIn(message, lines[0])
    self.assertNotIn("Traceback", proc.stderr)
    self.assertEqual(sorted(os.listdir(workdir)), [])  # nothing started: no checkpoint, no log, no SFT

  @parameterized.named_parameters(
      ("run_config", "run_config.json", b'{"trainer": ', "run_config.json in .* is damaged \\(Expecting value"),
      ("latest", "LATEST", b"{'version': 3}", "LATEST at .* is damaged \\(JSONDecodeError"),
      ("latest_type", "LATEST", b'{"version": "3"}', "LATEST at .* names version '3', not an int >= 0"),
  )
  def test_an_actor_refuses_a_damaged_data_path(self, name, data, message):
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    buffer, weights = os.path.join(root, "buffer"), os.path.join(root, "weights")
    os.makedirs(buffer)
    os.makedirs(weights)
    if name != "run_config.json":  # the trainer's run config, as rl_main stores it in the buffer
      with open(os.path.join(buffer, "run_config.json"), "w") as f:
        f.write(_run_config_json())
    with open(os.path.join(buffer if name == "run_config.json" else weights, name), "wb") as f:
      f.write(data)
    proc = self.launcher.run(["-m", "c2jax.services.actor_process", f"--buffer={buffer}", f"--weights={weights}",
                              "--actor_id=a0", "--wait_config_s=1", "--verbosity=-1"], cwd="/", timeout=300)
    self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    self.assertLen(lines, 1, proc.stderr[-2000:])
    self.assertRegex(lines[0], message)
    self.assertNotIn("Traceback", proc.stderr)


if __name__ == "__main__":
  absltest.main()


def _fields_of(name: str, config: str | None) -> dict:
  """{dotted key: (value, default or the NO_DEFAULT marker)} that `--config_help` must list for `config` (None: the
  defaults), from the dataclasses."""
  from c2jax import typed_config
  from c2jax.eval import suite_eval
  from c2jax.services import cli, pretrain_run_config, rl_run_config
  parse = {"rl_main": rl_run_config.parse, "pretrain_main": pretrain_run_config.parse, "eval_main": suite_eval.parse,
           "actor_process": rl_run_config.parse}[name]
  cfg = parse(cli._load_config_file(config) if config else rl_run_config.defaults())
  return {h.key: h for h in typed_config.field_help(cfg)}


@pytest.mark.e2e
class ConfigHelpTest(parameterized.TestCase):
  """`--config_help` on every entry point with a run config: each field's override, value, default where it differs,
  and doc line, generated from the dataclasses; exit code 0, nothing started."""

  @parameterized.named_parameters(
      ("rl_main", "rl_main", str(_ROOT / "configs" / "rl_tiny.py"), "trainer.steps", "updates to train."),
      ("pretrain_main", "pretrain_main", str(_ROOT / "configs" / "pretrain_tiny.py"), "phases.bulk.steps",
       "how long the phase trains, on rows of which shape."),
      ("eval_main", "eval_main", str(_ROOT / "configs" / "eval_realistic.py"), "sampling.slots",
       "episodes decoded together."),
      ("actor_process", "actor_process", None, "actors.num", "local actor processes the trainer job starts."),
  )
  def test_lists_every_field_with_its_default_and_doc(self, name, config, key, doc):
    argv = [_ENTRY_POINTS[name][0]] if name != "actor_process" else ["-m", "c2jax.services.actor_process"]
    argv += [f"--config={config}"] if config else []
    proc = subprocess.run([sys.executable] + argv + ["--config_help"], capture_output=True, text=True, env=_ENV,
                          cwd="/", timeout=300)
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    listed = {line.split("=", 1)[0].strip()[len("--config."):]: line
              for line in proc.stdout.splitlines() if line.startswith("  --config.")}
    fields = _fields_of(name, config)
    self.assertEqual(set(listed), set(fields))
    self.assertTrue(all(fields[k].doc for k in fields), [k for k in fields if not fields[k].doc])
    self.assertIn(f"  {doc}", listed[key])
    from c2jax import typed_config
    differs = [k for k, h in fields.items() if h.default is not typed_config.NO_DEFAULT and h.default != h.value]
    for k in differs:
      self.assertIn(" (default ", listed[k])
    if config:  # each tiny config sets some fields away from the dataclasses' defaults
      self.assertNotEmpty(differs)
