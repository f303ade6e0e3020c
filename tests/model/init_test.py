"""The random init, family by family: initializer_range everywhere HF uses it, 1/sqrt(fan_in) for the latent columns
of MLA's down-projections (an RMSNorm follows them; docs/experiments/copying.md), ones for norms, zeros for biases;
and the function at init is the one the all-initializer_range draw gives (the norms cancel the latents' scale)."""

from absl.testing import absltest, parameterized
import jax
import numpy as np

from c2jax.model import params as params_lib
from c2jax.model import transformer
from c2jax.model.presets import model_config

_CFG = model_config("tiny", {"d_model": 256, "kv_lora_rank": 64, "q_lora_rank": 96, "qk_rope_head_dim": 16,
                             "num_mtp_layers": 0, "vocab_size": 300})


class InitTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = jax.device_get(params_lib.init_params(_CFG, jax.random.key(0)))

  def test_std_per_family(self):
    d, lkv, r = _CFG.d_model, _CFG.kv_lora_rank, _CFG.qk_rope_head_dim
    for group in ("dense_layers", "moe_layers"):
      attn = self.params[group]["attn"]
      self.assertAlmostEqual(attn["q_a"].std(), d ** -0.5, delta=0.05 * d ** -0.5)
      self.assertAlmostEqual(attn["kv_a"][..., :lkv].std(), d ** -0.5, delta=0.05 * d ** -0.5)
      self.assertEqual(attn["kv_a"].shape[-1], lkv + r)
      # The rope key is not normed: it keeps the HF scale, as do the up-projections and the output.
      for name, w in (("kv_a rope", attn["kv_a"][..., lkv:]), ("q_b", attn["q_b"]), ("kv_b", attn["kv_b"]),
                      ("o", attn["o"])):
        self.assertAlmostEqual(w.std(), 0.02, delta=0.002, msg=name)
      np.testing.assert_array_equal(attn["q_a_norm"], 1.0)
      np.testing.assert_array_equal(attn["kv_a_norm"], 1.0)
    moe = self.params["moe_layers"]["moe"]
    for name, w in (("embed", self.params["embed"]), ("lm_head", self.params["lm_head"]),
                    ("router", moe["router"]), ("experts", moe["experts"]["gate"]),
                    ("mlp", self.params["dense_layers"]["mlp"]["down"])):
      self.assertAlmostEqual(w.std(), 0.02, delta=0.002, msg=name)
    np.testing.assert_array_equal(moe["router_bias"], 0.0)

  def test_function_at_init_is_the_initializer_range_draws(self):
    # Rescaling the latent columns to initializer_range gives the same logits: the norms see only their direction.
    params = jax.tree.map(np.array, self.params)
    scale = 0.02 * _CFG.d_model ** 0.5
    for group in ("dense_layers", "moe_layers"):
      attn = params[group]["attn"]
      attn["q_a"] *= scale
      attn["kv_a"][..., :_CFG.kv_lora_rank] *= scale
    tokens = np.random.default_rng(0).integers(0, _CFG.vocab_size, (2, 32)).astype(np.int32)
    run = jax.jit(lambda p: transformer.forward(p, tokens, cfg=_CFG).logits)
    np.testing.assert_allclose(run(params), run(self.params), rtol=1e-4, atol=1e-4)

  @parameterized.parameters(-1, 9)
  def test_normed_outputs_in_range(self, n):
    with self.assertRaisesRegex(ValueError, "normed_outputs"):
      params_lib.ParamSpec((4, 8), ("embed", "q_lora"), normed_outputs=n)


if __name__ == "__main__":
  absltest.main()
