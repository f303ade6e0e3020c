"""The latent-KV-cache decoder equals the full forward: prefill + token-by-token decode, prompts of different
lengths, several tokens at once (speculative verification), and the MTP modules' cached path."""

import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model import decode
from c2jax.model.params import init_params
from c2jax.model.transformer import forward
from tests import tiny

B, T = 3, 12
CFG = tiny.MODEL_MTP  # one dense, one MoE layer, one MTP module


class DecodeTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = jax.jit(init_params, static_argnums=0)(CFG, jax.random.key(0))
    cls.tokens = jax.random.randint(jax.random.key(1), (B, T), 0, CFG.vocab_size)
    cls.full = jax.jit(functools.partial(forward, cfg=CFG))(cls.params, cls.tokens)
    cls.extend = staticmethod(jax.jit(functools.partial(decode.extend, cfg=CFG)))

  def test_cache_stores_only_latents(self):
    cache = decode.init_cache(CFG, B, T)
    chex.assert_shape(cache.moe.c_kv, (CFG.n_moe_layers, B, T, CFG.kv_lora_rank))
    chex.assert_shape(cache.dense.k_rope, (CFG.n_dense_layers, B, T, CFG.qk_rope_head_dim))
    self.assertEqual(cache.max_len, T)

  def test_prefill_then_decode_equals_forward(self):
    # Rows with prompts of 3, 5 and 8 tokens: each row prefills its own prompt (the rest of the prompt buffer is
    # padding written into slots it overwrites later), then decodes the remaining positions one at a time.
    lengths = np.array([3, 5, 8])
    p = int(lengths.max())
    cache = decode.init_cache(CFG, B, T)
    prompt = jnp.where(jnp.arange(p)[None] < lengths[:, None], self.tokens[:, :p], 0)
    out = self.extend(self.params, cache, prompt, jnp.broadcast_to(jnp.arange(p), (B, p)))
    logits = np.zeros((B, T, CFG.vocab_size), np.float32)
    ids = np.zeros((CFG.n_moe_layers, B, T, CFG.num_experts_per_tok), np.int32)
    for b, n in enumerate(lengths):
      logits[b, :n] = out.logits[b, :n]
      ids[:, b, :n] = out.expert_ids[:, b, :n]
    cache = out.cache
    pos = jnp.asarray(lengths)
    for _ in range(T - lengths.min()):
      tok = jnp.take_along_axis(self.tokens, jnp.minimum(pos, T - 1)[:, None], axis=1)
      step = self.extend(self.params, cache, tok, pos[:, None])
      cache = step.cache
      for b in range(B):
        if pos[b] < T:
          logits[b, pos[b]] = step.logits[b, 0]
          ids[:, b, pos[b]] = step.expert_ids[:, b, 0]
      pos = pos + 1
    np.testing.assert_allclose(logits, self.full.logits, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(ids, self.full.expert_ids)

  def test_several_tokens_at_once(self):
    # Verification of speculative drafts feeds k + 1 tokens per step.
    cache = decode.init_cache(CFG, B, T)
    out = self.extend(self.params, cache, self.tokens[:, :4], jnp.broadcast_to(jnp.arange(4), (B, 4)))
    out2 = self.extend(self.params, out.cache, self.tokens[:, 4:8], jnp.broadcast_to(jnp.arange(4, 8), (B, 4)))
    np.testing.assert_allclose(out2.logits, self.full.logits[:, 4:8], rtol=0, atol=2e-5)
    np.testing.assert_allclose(out2.hidden, self.full.hidden[:, 4:8], rtol=0, atol=2e-5)

  def test_mtp_cached_equals_mtp_forward(self):
    # Module 1 at position i sees h_i and token i + 1, and predicts token i + 2.
    cache = decode.init_cache(CFG, B, T)
    out = self.extend(self.params, cache, self.tokens, jnp.broadcast_to(jnp.arange(T), (B, T)))
    fn = jax.jit(functools.partial(decode.extend_mtp, cfg=CFG))
    nxt = jnp.pad(self.tokens[:, 1:], ((0, 0), (0, 1)))[None]
    half = T // 2
    first = fn(self.params, out.cache, out.hidden[:, :half], nxt[:, :, :half],
               jnp.broadcast_to(jnp.arange(half), (B, half)))
    second = fn(self.params, first.cache, out.hidden[:, half:], nxt[:, :, half:],
                jnp.broadcast_to(jnp.arange(half, T), (B, T - half)))
    got = np.concatenate([first.logits, second.logits], axis=2)
    np.testing.assert_allclose(got[:, :, :T - 1], self.full.mtp_logits[:, :, :T - 1], rtol=0, atol=2e-5)


if __name__ == "__main__":
  absltest.main()
