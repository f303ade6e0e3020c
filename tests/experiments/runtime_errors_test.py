"""Every entry point refuses what the user can fix at run time in one line (exit code 2, no traceback) that names the
input and the fix, before starting anything: a config file that does not exist, a checkpoint path that does not
exist or is no checkpoint, an HF directory that is none, an output directory that holds a checkpoint, a Kimi model
directory with its tiktoken tokenizer but no tokenizer.json. Ctrl-C in the middle of an evaluation stops it with one
line saying what was kept (exit code 130).

The checks themselves (`c2jax.model.checkpoint.check_checkpoint`, `cli.config_file_error`, ...) are tested in
process; each entry point's wiring in a real process.
"""

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import pytest

from c2jax.data.tokenizer import HFTokenizer
from c2jax.input_errors import ExistingOutput, MismatchedInput, MissingInput
from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_convert
from c2jax.model.params import abstract_params
from c2jax.services import cli
from c2jax.services import rl_job
from c2jax.services import rl_run_config
from configs import rl_tiny
from tests import tiny
from tests.experiments import preloaded

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(_ROOT)}
_NOWHERE = "/nonexistent/c2jax-input"


def _with(cfg, **changes):
  return dataclasses.replace(cfg, **changes)


def _tmp(test) -> pathlib.Path:
  """A new directory, removed after the test (not create_tempdir: pytest does not parse absl's flags)."""
  path = tempfile.mkdtemp(prefix="c2jax-runtime-errors-")
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return pathlib.Path(path)


def _saved_checkpoint(directory: pathlib.Path, model=tiny.MODEL) -> str:
  """A finished checkpoint of `model` (zeros: only its files matter here)."""
  zeros = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract_params(model))
  ckpt_lib.save_checkpoint(str(directory), zeros, model)
  return str(directory)


class ChecksTest(absltest.TestCase):
  """The checks, in process."""

  def test_a_checkpoint_path_that_does_not_exist_or_is_none(self):
    with self.assertRaisesRegex(MissingInput, rf"^init_checkpoint: {_NOWHERE} does not exist; a c2jax model "
                                              r"checkpoint is a directory: a pretraining run's"):
      ckpt_lib.check_checkpoint(_NOWHERE, "init_checkpoint")
    empty = _tmp(self)
    with self.assertRaisesRegex(MissingInput, rf"^sft.base_checkpoint: {empty} is not a c2jax checkpoint: "
                                              r"model_config.json is missing"):
      ckpt_lib.check_checkpoint(str(empty), "sft.base_checkpoint")
    # Still the built-in errors that callers catch.
    self.assertTrue(issubclass(MissingInput, FileNotFoundError) and issubclass(MissingInput, ValueError))

  def test_a_checkpoint_of_another_model_is_named_by_its_fields(self):
    path = _saved_checkpoint(_tmp(self) / "ckpt")
    self.assertEqual(ckpt_lib.check_checkpoint(path, "init_checkpoint", tiny.MODEL), tiny.MODEL)
    other = tiny.MODEL.replace(n_layers=tiny.MODEL.n_layers + 1)
    with self.assertRaisesRegex(MismatchedInput, rf"^init_checkpoint='{path}' holds another architecture than the "
                                                 rf"run's model: n_layers={tiny.MODEL.n_layers} \(the run: "):
      ckpt_lib.check_checkpoint(path, "init_checkpoint", other)

  def test_the_rl_job_checks_its_checkpoints_before_anything_starts(self):
    cfg = rl_run_config.parse(rl_tiny.get_config())
    workdir = _tmp(self) / "run"
    with self.assertRaisesRegex(MissingInput, rf"^sft.base_checkpoint: {_NOWHERE} does not exist"):
      rl_job.run(_with(cfg, sft=_with(cfg.sft, base_checkpoint=_NOWHERE)), str(workdir))
    with self.assertRaisesRegex(MissingInput, rf"^init_checkpoint: {_NOWHERE} does not exist"):
      rl_job.run(_with(cfg, init_checkpoint=_NOWHERE), str(workdir))
    self.assertFalse(workdir.exists())  # nothing was started, not even the run's directory

  def test_an_output_that_holds_a_checkpoint_is_refused_before_any_tensor_is_read(self):
    out = _saved_checkpoint(_tmp(self) / "out")
    with self.assertRaisesRegex(ExistingOutput, rf"^--out_dir={out} already holds a checkpoint"):
      hf_convert.convert_hf_checkpoint(_NOWHERE, out, progress=False)  # the --hf_dir is not even looked at
    with self.assertRaisesRegex(MissingInput, rf"^--hf_dir={_NOWHERE} is not a directory"):
      hf_convert.convert_hf_checkpoint(_NOWHERE, str(_tmp(self) / "new"), progress=False)

  def test_a_kimi_directory_without_tokenizer_json_says_how_to_write_one(self):
    d = _tmp(self)
    (d / "tiktoken.model").write_text("")
    with self.assertRaisesRegex(MissingInput, rf"^{d} holds tiktoken.model \(Kimi's tiktoken tokenizer\) but no "
                                              r"tokenizer.json, .*TikTokenConverter"):
      HFTokenizer(str(d))

  def test_a_config_file_that_does_not_exist(self):
    self.assertIsNone(cli.config_file_error(["prog", f"--config={_ROOT / 'configs' / 'rl_tiny.py'}"]))
    self.assertIsNone(cli.config_file_error(["prog", "--workdir=x"]))  # the default file
    self.assertEqual(cli.config_file_error(["prog", "--config", "configs/nope.py:arg"]),
                     f"--config=configs/nope.py:arg: configs/nope.py is not a file; name a config file (a relative "
                     f"path is read from {os.getcwd()}).")


@pytest.mark.e2e
class EntryPointsTest(parameterized.TestCase):
  """Each entry point's refusal in a real process (forked from one that has imported jax and the config modules,
  `tests/experiments/preloaded.py`): one line on stderr, exit code 2, nothing written."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix="c2jax-runtime-errors-"))
    cls.checkpoint = _saved_checkpoint(cls.tmp / "ckpt")
    cls.launcher = preloaded.Launcher(_ENV, preloaded.ENTRY_POINT_IMPORTS)

  @classmethod
  def tearDownClass(cls):
    cls.launcher.close()
    shutil.rmtree(cls.tmp, ignore_errors=True)
    super().tearDownClass()

  def _refused(self, argv, message, workdir=None):
    proc = self.launcher.run(argv, cwd=str(_ROOT), timeout=300)
    self.assertEqual(proc.returncode, 2, proc.stderr[-3000:])
    lines = proc.stderr.strip().splitlines()
    self.assertLen(lines, 1, proc.stderr[-3000:])
    self.assertIn(message, lines[0])
    self.assertNotIn("Traceback", proc.stderr)
    if workdir is not None:
      self.assertFalse(os.path.exists(workdir), "the run started")

  @parameterized.named_parameters(
      ("rl_main", "experiments/rl_main.py", "configs/rl_tyni.py", "configs/rl_tyni.py"),
      ("pretrain_main", "experiments/pretrain_main.py", "configs/pretrain_tny.py:rl_tiny", "configs/pretrain_tny.py"),
      ("eval_main", "experiments/eval_main.py", "eval_realistic.py", "eval_realistic.py"))
  def test_a_config_file_that_does_not_exist(self, entry, spec, path):
    work = str(self.tmp / f"config-{os.path.basename(entry)}")
    self._refused([entry, f"--config={spec}", f"--workdir={work}"],
                  f"--config={spec}: {path} is not a file; name a config file such as configs/", work)

  def test_rl_main_a_base_checkpoint_that_does_not_exist(self):
    work = str(self.tmp / "rl-base")
    self._refused(["experiments/rl_main.py", f"--workdir={work}", f"--config.sft.base_checkpoint={_NOWHERE}"],
                  f"rl_main.py: sft.base_checkpoint: {_NOWHERE} does not exist; a c2jax model checkpoint is a "
                  "directory", work)

  def test_rl_main_an_init_checkpoint_that_is_no_checkpoint(self):
    work, empty = str(self.tmp / "rl-init"), self.tmp / "empty"
    empty.mkdir(exist_ok=True)
    self._refused(["experiments/rl_main.py", f"--workdir={work}", f"--config.init_checkpoint={empty}"],
                  f"init_checkpoint: {empty} is not a c2jax checkpoint: model_config.json is missing", work)

  def test_pretrain_main_an_init_checkpoint_that_does_not_exist(self):
    work = str(self.tmp / "pretrain-init")
    self._refused(["experiments/pretrain_main.py", f"--workdir={work}", f"--config.init_checkpoint={_NOWHERE}"],
                  f"init_checkpoint: {_NOWHERE} does not exist", work)

  def test_eval_main_a_checkpoint_that_does_not_exist(self):
    work = str(self.tmp / "eval-ckpt")
    self._refused(["experiments/eval_main.py", f"--workdir={work}", "--config.policy=checkpoint",
                   f"--config.checkpoint={_NOWHERE}"], f"checkpoint: {_NOWHERE} does not exist", work)

  def test_convert_hf_an_hf_dir_that_is_none_and_an_out_dir_that_holds_a_checkpoint(self):
    self._refused(["tools/convert_hf.py", f"--hf_dir={_NOWHERE}", f"--out_dir={self.tmp / 'converted'}"],
                  f"convert_hf.py: --hf_dir={_NOWHERE} is not a directory", str(self.tmp / "converted"))
    self._refused(["tools/convert_hf.py", f"--hf_dir={_NOWHERE}", f"--out_dir={self.checkpoint}"],
                  f"--out_dir={self.checkpoint} already holds a checkpoint")

  def test_export_hf_a_checkpoint_that_does_not_exist(self):
    out = str(self.tmp / "exported")
    self._refused(["tools/export_hf.py", f"--checkpoint={_NOWHERE}", f"--out_dir={out}"],
                  f"export_hf.py: checkpoint {_NOWHERE} does not exist", out)

  def test_ctrl_c_in_the_middle_of_an_evaluation(self):
    work = self.tmp / "eval-interrupted"
    proc = subprocess.Popen([sys.executable, "experiments/eval_main.py", "--config=configs/eval_realistic.py",
                             "--config.policy=reference", "--config.samples=8", f"--workdir={work}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV, cwd=str(_ROOT),
                            # As from a terminal: a pytest-xdist worker ignores SIGINT, and its children would inherit
                            # that (Python then installs no KeyboardInterrupt handler).
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    self.addCleanup(proc.kill)
    # The evaluation's progress bar is on: its episodes are running.
    err = ""
    deadline = time.time() + 240
    while "evaluate realistic (heldout):" not in err and time.time() < deadline and proc.poll() is None:
      err += os.read(proc.stderr.fileno(), 4096).decode(errors="replace")
    self.assertIn("evaluate realistic (heldout):", err)
    proc.send_signal(signal.SIGINT)
    out, rest = proc.communicate(timeout=120)
    err += rest
    self.assertEqual(proc.returncode, 130, err[-3000:])
    self.assertNotIn("Traceback", err)
    # (tqdm may close its bar after the line: the line is there, not necessarily last.)
    self.assertIn(f"eval_main.py: interrupted; no report was written to {work}, only its config.json (the report "
                  "is written when the evaluation ends).\n", err)
    self.assertFalse((work / "report.json").exists())
    self.assertEqual(sorted(os.listdir(work)), ["config.json"])


if __name__ == "__main__":
  absltest.main()
