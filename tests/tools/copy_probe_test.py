"""tools/copy_probe.py: the three implementations train on one stream with one optimizer.

c2jax and transformers' DeepseekV3 start from the same weights and take the same AdamW steps (c2jax's schedule in
both, no balancing rule), so their curves agree to float32 noise; the Llama trains; the CLI prints a JSON last line
and plots what it recorded.
"""

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.data.copy_stream import WIDE_ALPHABET, CopyRows, CopyStream, Part
from c2jax.model import params as params_lib

from tools import copy_probe

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Few steps, a short stream; the optimizer's schedule warms up in 2 steps so that the steps move the weights.
_SETTINGS = copy_probe.ProbeSettings(steps=3, eval_every=1, batch_size=2, seq_len=128, eval_rows=4, warmup_steps=2,
                                     schedule_steps=10, bias_update_rate=0.0)




def _cli_argv(results: str) -> list[str]:
  """The CLI's c2jax run with _SETTINGS as flags, its line appended to `results`."""
  s = _SETTINGS
  return [sys.executable, "tools/copy_probe.py", f"--steps={s.steps}", f"--eval_every={s.eval_every}",
          f"--batch_size={s.batch_size}", f"--seq_len={s.seq_len}", f"--eval_rows={s.eval_rows}",
          f"--warmup_steps={s.warmup_steps}", f"--schedule_steps={s.schedule_steps}",
          f"--bias_update_rate={s.bias_update_rate}", f"--results={results}", "--label=smoke",
          '--extra_overrides={"vocab_size": 260}']


@functools.cache
def _cli_run() -> tuple[str, dict]:
  """The CLI's c2jax run of _SETTINGS, once for the tests that read it: the CLI's own test, and the c2jax curve that
  transformers' DeepseekV3 must follow (the CLI's run is `run_probe`'s, which its line's settings show; one run of
  c2jax saves compiling its step in this process too). Returns (the results file, the JSON last line)."""
  tmp = tempfile.mkdtemp()
  results = os.path.join(tmp, "runs.jsonl")
  out = subprocess.run(_cli_argv(results), cwd=_REPO, capture_output=True, text=True, check=True).stdout
  return results, json.loads(out.strip().splitlines()[-1])


class CopyProbeTest(absltest.TestCase):

  @classmethod
  def tearDownClass(cls):
    if _cli_run.cache_info().currsize:
      shutil.rmtree(os.path.dirname(_cli_run()[0]), ignore_errors=True)
      _cli_run.cache_clear()
    super().tearDownClass()

  @pytest.mark.slow
  def test_deepseek_v3_in_transformers_follows_c2jax_step_for_step(self):
    cfg = copy_probe.model_config(extra={"vocab_size": 260})
    ours = _cli_run()[1]
    self.assertEqual(ours["settings"], json.loads(json.dumps(dataclasses.asdict(_SETTINGS))))
    self.assertEqual((ours["impl"], ours["extra_overrides"], ours["model_overrides"]), ("c2jax", {"vocab_size": 260},
                                                                                        None))
    theirs = copy_probe.run_probe("hf_deepseek_v3", cfg, _SETTINGS)
    self.assertEqual(ours["params"], theirs["params"])
    a = np.array([[p["first"], p["second"]] for p in ours["curve"]])
    b = np.array([[p["first"], p["second"]] for p in theirs["curve"]])
    self.assertEqual(a.shape, (4, 2))
    np.testing.assert_allclose(a, b, atol=2e-3)  # the same weights at step 0 and the same three AdamW steps
    self.assertLess(a[-1, 0], a[0, 0] - 0.5)  # the steps moved the model (from ln 260 toward the alphabet)

  def test_llama_trains(self):
    result = copy_probe.run_probe("hf_llama", copy_probe.model_config(extra={"vocab_size": 260}), _SETTINGS)
    self.assertLess(result["curve"][-1]["first"], result["curve"][0]["first"] - 0.5)
    self.assertEqual(result["below_90"], None)  # three steps do not copy

  @pytest.mark.slow
  def test_jax_llama_and_its_mla_features(self):
    cfg = copy_probe.model_config(extra={"vocab_size": 260})
    plain = copy_probe.run_probe("jax_llama", cfg, _SETTINGS)
    self.assertLess(plain["curve"][-1]["first"], plain["curve"][0]["first"] - 0.5)
    # Llama of d=128, 4 x 32 heads: a latent_kv layer trades k, v [D, N H] for kv_a [D, D], its norm [D] and
    # kv_b [D, 2 N H]; the decoupled rope widens q to N (H + H) and adds one shared rope key [D, H].
    mla = copy_probe.run_probe("jax_llama", cfg, dataclasses.replace(
        _SETTINGS, mla_features=("latent_kv", "decoupled_rope"), latent_std=0.1))
    self.assertEqual(mla["params"] - plain["params"], cfg.n_layers * (128 * 128 + 128 + 128 * 128 + 128 * 32))
    self.assertTrue(np.isfinite(mla["second"]))
    self.assertNotIn("own_first", plain["curve"][0])  # trained on the probe's alphabet: one held-out batch
    # A wider training alphabet: the 32-symbol probe is scored as before, and held-out strings of the training
    # alphabet beside it, whose first copies start near ln(vocab) as the probe's do (uniform logits at init).
    wide = copy_probe.run_probe("jax_llama", cfg, dataclasses.replace(_SETTINGS, train_alphabet_size=200))
    self.assertLen(wide["curve"], _SETTINGS.steps + 1)
    for point in wide["curve"]:
      self.assertTrue(np.isfinite([point["own_first"], point["own_second"]]).all())
    self.assertAlmostEqual(wide["curve"][0]["own_first"], np.log(260), delta=0.1)
    self.assertNotEqual(wide["curve"][-1]["own_first"], wide["curve"][-1]["first"])
    with self.assertRaisesRegex(ValueError, r"--mla_features names \['rotary'\]"):
      copy_probe.run_probe("jax_llama", cfg, dataclasses.replace(_SETTINGS, mla_features=("rotary",)))

  def test_hf_scheme_is_transformers_init_scale(self):
    cfg = copy_probe.model_config(extra={"vocab_size": 260})
    params = copy_probe.hf_scheme(params_lib.init_params(cfg, jax.random.key(0)), cfg)
    for group in ("dense_layers", "moe_layers"):
      attn = params[group]["attn"]
      for w in (attn["q_a"], attn["kv_a"], attn["q_b"]):
        self.assertAlmostEqual(float(np.std(w)), cfg.initializer_range, delta=0.1 * cfg.initializer_range)

  def test_importing_defines_no_flags(self):
    # The tool's flags exist only when it runs: tools/bench_model.py, loaded into the same test process by
    # tools/bench_sampler.py, defines --model, --steps, --seed, ... of its own.
    from absl import flags
    self.assertNotIn("mla_features", flags.FLAGS)
    self.assertNotIn("eval_rows", flags.FLAGS)

  def test_first_below(self):
    curve = [{"step": 0, "first": 3.5, "second": 3.5}, {"step": 50, "first": 3.5, "second": 3.0},
             {"step": 100, "first": 3.5, "second": 1.5}]
    self.assertEqual(copy_probe.first_below(curve, 0.9), 50)
    self.assertEqual(copy_probe.first_below(curve, 0.5), 100)
    self.assertIsNone(copy_probe.first_below(curve, 0.1))

  def test_induction_bound(self):
    a, b, c, sep = 97, 98, 99, 58
    o, f, s = Part.OTHER, Part.FIRST, Part.SECOND
    # "ab:ab": the second copy's b follows an a that occurred once, followed by b: certain.
    rows = CopyRows(tokens=np.array([[a, b, sep, a, b]]), part=np.array([[o, f, o, o, s]]))
    certain = -np.log(0.02 / 32 + 0.98) / np.log(32)
    self.assertAlmostEqual(copy_probe.induction_bound(rows), certain, places=6)
    # "abac:abac": one token of match is torn where the key recurs (a was followed by b, then c, then b again in
    # the second copy itself); two tokens are certain but have nothing to match right after the separator.
    tokens = [a, b, a, c, sep, a, b, a, c]
    rows = CopyRows(tokens=np.array([tokens]), part=np.array([[o, f, f, f, o, o, s, s, s]]))
    one = copy_probe.induction_bound(rows, 1)
    two = copy_probe.induction_bound(rows, 2)
    # match 1: b after a (nexts b, c: 1/2), a after b (a: 1), c after a (nexts b, c, b: 1/3).
    expected = np.mean([-np.log(0.02 / 32 + 0.98 * q) for q in (1 / 2, 1, 1 / 3)]) / np.log(32)
    self.assertAlmostEqual(one, expected, places=6)
    sure = -np.log(0.02 / 32 + 0.98)
    self.assertAlmostEqual(two, np.mean([np.log(32), sure, sure]) / np.log(32), places=6)
    # On the probe's held-out batch a one-token match already passes the probe's 0.5 (docs/experiments/copying.md).
    self.assertLess(copy_probe.induction_bound(CopyStream(seed=12345).batch(8), 1), 0.5)

  def test_cli_bound_of_a_training_alphabet(self):
    run = lambda *flags: subprocess.run([sys.executable, "tools/copy_probe.py", *flags], cwd=_REPO,
                                        capture_output=True, text=True, check=False)
    out = run("--bound", "--train_alphabet_size=16", "--eval_rows=4")
    self.assertEqual(out.returncode, 0, out.stderr)
    bound = json.loads(out.stdout.strip().splitlines()[-1])
    self.assertEqual(bound["match_1"], round(copy_probe.induction_bound(
        CopyStream(seed=12345, alphabet_size=16).batch(4), 1, 16), 4))
    self.assertGreater(bound["match_1"], bound["match_2"])  # 16 symbols: one token of match is often torn
    bad = run("--bound", "--train_alphabet_size=300")
    self.assertNotEqual(bad.returncode, 0)
    self.assertIn(f"--train_alphabet_size=300 must be in [2, {len(WIDE_ALPHABET)}]", bad.stderr)

  @pytest.mark.slow
  def test_cli_json_line_results_and_plot(self):
    results, line = _cli_run()
    self.assertEqual((line["label"], line["impl"], line["steps"], len(line["curve"])), ("smoke", "c2jax", 3, 4))
    self.assertEqual(json.loads(open(results, encoding="utf-8").read()), line)
    plotted = subprocess.run([sys.executable, "tools/copy_probe.py", f"--plot={results}"], cwd=_REPO,
                             capture_output=True, text=True, check=True).stdout
    png = json.loads(plotted.strip().splitlines()[-1])["png"]
    with open(png, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    bad = subprocess.run(_cli_argv(results)[:2] + ['--extra_overrides={"vocab_size": 100}'], cwd=_REPO,
                         capture_output=True, text=True, check=False)
    self.assertNotEqual(bad.returncode, 0)
    self.assertIn("vocab_size=100", bad.stderr)


if __name__ == "__main__":
  absltest.main()
