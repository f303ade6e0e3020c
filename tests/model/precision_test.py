"""The tiny model trains with each expert precision recipe (BF16, MXFP8, NVFP4 forward / MXFP8 backward).

The tiny config is cut to one dense and one MoE layer without MTP (each precision is one compile of the train
step on a 2-core CPU); the full tiny config trains in BF16 in tests/pretrain/step_test.py.
"""

import functools

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.model.config import Precision
from c2jax.optim import OptimizerConfig
from c2jax.pretrain.step import StepConfig, init_state, train_step
from tests import tiny

pytestmark = pytest.mark.fusion_emitters  # float4 containers: XLA:CPU's element-wise emitters cannot lower them

STEPS = 4


class PrecisionTrainingTest(absltest.TestCase):

  @pytest.mark.slow
  def test_each_precision_trains_and_tracks_bf16(self):
    base = tiny.MODEL
    hp = StepConfig(optim=OptimizerConfig(learning_rate=3e-3, warmup_steps=0, total_steps=20))
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, base.vocab_size)
    curves = {}
    for precision in Precision:
      cfg = base.replace(precision=precision)
      state = init_state(cfg, hp, jax.random.key(0))
      step = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp))
      losses = []
      for _ in range(STEPS):
        state, metrics = step(state, {"tokens": tokens})
        losses.append(float(metrics["loss"]))
      curves[precision] = np.array(losses)
      self.assertTrue(np.all(np.isfinite(losses)), f"{precision.value}: {losses}")
      self.assertLess(losses[-1], losses[0] - 0.3, f"{precision.value}: {losses}")
    # Quantization error is small next to what training moves: every curve stays near the BF16 one.
    for precision, curve in curves.items():
      np.testing.assert_allclose(curve, curves[Precision.BF16], atol=0.05, err_msg=precision.value)


if __name__ == "__main__":
  absltest.main()
