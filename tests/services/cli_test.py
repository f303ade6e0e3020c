"""What every entry point writes and prints about its run config and its outputs: the resolved config beside the
outputs reads back as the same typed config; the `--config_help` text names each field with its value, its default
where they differ and its doc; the closing list of outputs names only what exists. (Each entry point's wiring runs in
a real process in tests/experiments/entry_points_test.py.)"""

import json
import os
import pathlib
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.eval import suite_eval
from c2jax.services import cli
from c2jax.services import pretrain_run_config
from c2jax.services import rl_run_config

_ROOT = pathlib.Path(__file__).resolve().parents[2]


class CliTest(parameterized.TestCase):

  def _tmp(self) -> str:
    path = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, path, ignore_errors=True)
    return path

  @parameterized.named_parameters(
      ("rl", rl_run_config.parse, "rl_tiny.py"),
      ("pretrain", pretrain_run_config.parse, "pretrain_tiny.py"),
      ("eval", suite_eval.parse, "eval_realistic.py"),
  )
  def test_the_resolved_config_round_trips(self, parse, config):
    cfg = parse(cli._load_config_file(str(_ROOT / "configs" / config)))
    path = cli.write_config(cfg, os.path.join(self._tmp(), "new"))
    self.assertEqual(os.path.basename(path), "config.json")
    with open(path, encoding="utf-8") as f:
      self.assertEqual(parse(json.load(f)), cfg)

  def test_config_help_lines(self):
    cfg = rl_run_config.parse(cli._load_config_file(str(_ROOT / "configs" / "rl_tiny.py")))
    lines = cli.config_help(cfg, str(_ROOT / "configs" / "rl_tiny.py")).splitlines()
    self.assertIn("RLRunConfig: every field as --config.<key>=<value>", lines[0])
    steps = next(line for line in lines if line.startswith("  --config.trainer.steps="))
    self.assertEqual(steps, f"  --config.trainer.steps={cfg.trainer.steps} (default 40)  updates to train.")
    seed = next(line for line in lines if line.startswith("  --config.seed="))
    self.assertEqual(seed, "  --config.seed=0  seeds the init, the actors' task draws and sampling, and the "
                     "evaluation.")  # its default: no "(default ...)"

  def test_outputs_names_what_exists(self):
    work = self._tmp()
    os.makedirs(os.path.join(work, "tb"))
    text = cli.outputs(work, (("TensorBoard", "tb", "tensorboard --logdir={path}"), ("model", "model", "")))
    self.assertEqual(text.splitlines(), [f"outputs in {work}:",
                                         f"  TensorBoard  {work}/tb  (tensorboard --logdir={work}/tb)"])


if __name__ == "__main__":
  absltest.main()
