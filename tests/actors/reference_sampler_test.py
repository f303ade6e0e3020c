"""The reference sampler against the trainer's forward: log-probs, routing, truncation, stopping, batching, errors.

Shapes: B=4 rows, P=6 prompt buffer, N=6 new tokens, T=12. Temperature, top_k and top_p are traced inside the
sampler, so the file compiles it four times only (B=4, B=1, with stop tokens, and the 1-step statistical batch);
`_run` caches results shared by several tests.
"""

import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np
from scipy import special
from scipy import stats

from c2jax.actors import reference_sampler as rs
from c2jax.model import losses
from c2jax.model.params import init_params
from c2jax.model.transformer import forward
from c2jax.model import presets

B, P, N = 4, 6, 6
PROMPT_LENGTHS = np.array([6, 2, 4, 1], np.int32)  # mixed lengths, both ends of [1, P] included
SEED = 1234


@functools.cache
def _model():
  cfg = dataclasses.replace(presets.tiny(), n_layers=2, num_mtp_layers=0)
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(0))
  # A fresh init gives near-uniform next-token distributions (logit std ~0.16), under which top-k / top-p keep
  # almost the whole vocab and a statistical test has no power; a larger head gives logit std ~2.5.
  params["lm_head"] = params["lm_head"] * 16.0
  return cfg, params


@functools.cache
def _prompts():
  cfg, _ = _model()
  toks = np.asarray(jax.random.randint(jax.random.key(1), (B, P), 1, cfg.vocab_size), np.int32)
  # Garbage past each prompt's end must be ignored by the sampler.
  return np.where(np.arange(P)[None] < PROMPT_LENGTHS[:, None], toks, 7).astype(np.int32)


@functools.cache
def _forward_fn():
  cfg, _ = _model()
  return jax.jit(lambda p, t: forward(p, t, cfg=cfg, with_mtp=False))


def _forward(tokens):
  """(logits [B, T, V], expert_ids [Lm, B, T, K]) of the trainer's forward, as numpy."""
  _, params = _model()
  out = _forward_fn()(params, jnp.asarray(tokens))
  return np.asarray(out.logits), np.asarray(out.expert_ids)


@functools.cache
def _run(sampling: rs.SamplingConfig, row: int | None = None) -> rs.Samples:
  """The batch sampled with key(SEED); `row`: that row alone, with the per-row key the batch gave it."""
  cfg, params = _model()
  key = jax.random.key(SEED)
  prompts, lengths = _prompts(), PROMPT_LENGTHS
  if row is not None:
    prompts, lengths = prompts[row:row + 1], lengths[row:row + 1]
    key = jax.random.fold_in(key, row)[None]  # [1] per-row keys
  out = rs.sample(params, jnp.asarray(prompts), jnp.asarray(lengths), key, cfg=cfg, sampling=sampling)
  return jax.tree.map(np.asarray, out)


def _generated(s: rs.Samples) -> np.ndarray:
  """[B, T] bool: the generated positions implied by prompt lengths and lengths."""
  t = np.arange(s.tokens.shape[1])[None]
  return (t >= PROMPT_LENGTHS[:, None]) & (t < (PROMPT_LENGTHS + s.lengths)[:, None])


def _log_softmax(x):
  return x - special.logsumexp(x, axis=-1, keepdims=True)


def _allowed_set(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
  """Independent numpy nucleus/top-k: logits [V] -> [V] bool, by sorting indices (not thresholds)."""
  x = logits.astype(np.float64) / temperature
  order = np.argsort(-x, kind="stable")
  keep = np.zeros(x.shape, bool)
  keep[order[:top_k] if top_k else order] = True
  probs = np.exp(_log_softmax(np.where(keep, x, -np.inf)))
  if top_p < 1:
    sorted_probs = probs[order]
    n_keep = int(np.searchsorted(np.cumsum(sorted_probs), top_p) + 1)  # smallest prefix with mass >= top_p
    keep = np.zeros(x.shape, bool)
    keep[order[:n_keep]] = True
  return keep


class ReferenceSamplerTest(parameterized.TestCase):

  def _check_layout(self, s: rs.Samples):
    """Prompts kept, generated span contiguous and masked, pad after, logprobs 0 off the mask."""
    gen = _generated(s)
    chex.assert_trees_all_equal(s.loss_mask, gen.astype(np.float32))
    in_prompt = np.arange(P + N)[None] < PROMPT_LENGTHS[:, None]
    np.testing.assert_array_equal(s.tokens[:, :P][in_prompt[:, :P]], _prompts()[in_prompt[:, :P]])
    self.assertTrue(np.all(s.tokens[~(in_prompt | gen)] == 0), "pad_id must fill every row past its end")
    self.assertTrue(np.all(s.logprobs[~gen] == 0.0))
    self.assertTrue(np.all(s.logprobs[gen] <= 0.0))

  def test_logprobs_and_expert_ids_match_trainer_forward(self):
    s = _run(rs.SamplingConfig(max_new_tokens=N))
    chex.assert_shape(s.tokens, (B, P + N))
    self.assertEqual(s.tokens.dtype, np.int32)
    self._check_layout(s)
    np.testing.assert_array_equal(s.lengths, N)
    np.testing.assert_array_equal(s.stopped, False)
    logits, expert_ids = _forward(s.tokens)
    trainer_lp = np.asarray(losses.token_log_probs(jnp.asarray(logits[:, :-1]), jnp.asarray(s.tokens[:, 1:])))
    gen = _generated(s)
    np.testing.assert_allclose(s.logprobs[:, 1:][gen[:, 1:]], trainer_lp[gen[:, 1:]], rtol=0, atol=1e-5)
    cfg, _ = _model()
    chex.assert_shape(s.expert_ids, (cfg.n_moe_layers, B, P + N, cfg.num_experts_per_tok))
    for b in range(B):
      end = PROMPT_LENGTHS[b] + s.lengths[b]
      np.testing.assert_array_equal(s.expert_ids[:, b, :end], expert_ids[:, b, :end])

  def test_temperature_scales_logprobs(self):
    temperature = 0.7
    s = _run(rs.SamplingConfig(max_new_tokens=N, temperature=temperature))
    self._check_layout(s)
    logits, _ = _forward(s.tokens)
    want = np.take_along_axis(_log_softmax(logits[:, :-1].astype(np.float64) / temperature),
                              s.tokens[:, 1:, None], axis=-1)[..., 0]
    gen = _generated(s)[:, 1:]
    np.testing.assert_allclose(s.logprobs[:, 1:][gen], want[gen], rtol=0, atol=1e-5)

  @parameterized.named_parameters(("greedy", 0.0), ("sampled", 1.0))
  def test_rows_independent_of_batch(self, temperature):
    sampling = rs.SamplingConfig(max_new_tokens=N, temperature=temperature)
    batch = _run(sampling)
    for b in range(B):
      alone = _run(sampling, row=b)
      np.testing.assert_array_equal(alone.tokens[0], batch.tokens[b], err_msg=f"row {b}")
      np.testing.assert_array_equal(alone.logprobs[0], batch.logprobs[b], err_msg=f"row {b}")
      np.testing.assert_array_equal(alone.lengths[0], batch.lengths[b])

  def test_greedy_equals_hand_argmax_loop_and_top_k_1(self):
    greedy = _run(rs.SamplingConfig(max_new_tokens=N, temperature=0.0))
    self._check_layout(greedy)
    buf = np.zeros((B, P + N), np.int32)
    buf[:, :P] = np.where(np.arange(P)[None] < PROMPT_LENGTHS[:, None], _prompts(), 0)
    want_lp = np.zeros((B, P + N), np.float32)
    for i in range(N):
      logits, _ = _forward(buf)
      for b in range(B):
        pos = PROMPT_LENGTHS[b] + i
        buf[b, pos] = np.argmax(logits[b, pos - 1])
        want_lp[b, pos] = _log_softmax(logits[b, pos - 1].astype(np.float64))[buf[b, pos]]
    np.testing.assert_array_equal(greedy.tokens, buf)
    # Greedy reports the untempered model log-prob (documented), not the point mass's 0.
    np.testing.assert_allclose(greedy.logprobs, want_lp, rtol=0, atol=1e-5)
    # top_k=1 samples the argmax too, but its (renormalized, one-token) distribution gives log-prob 0.
    top1 = _run(rs.SamplingConfig(max_new_tokens=N, top_k=1))
    np.testing.assert_array_equal(top1.tokens, greedy.tokens)
    np.testing.assert_array_equal(top1.logprobs, 0.0)

  @parameterized.named_parameters(
      ("top_k", 1.0, 8, 1.0),
      ("top_p", 1.0, 0, 0.8),
      ("top_k_top_p_tempered", 1.5, 20, 0.9),
  )
  def test_truncation(self, temperature, top_k, top_p):
    s = _run(rs.SamplingConfig(max_new_tokens=N, temperature=temperature, top_k=top_k, top_p=top_p))
    self._check_layout(s)
    logits, _ = _forward(s.tokens)
    sizes = []
    for b in range(B):
      for t in np.flatnonzero(_generated(s)[b]):
        allowed = _allowed_set(logits[b, t - 1], temperature, top_k, top_p)
        sizes.append(allowed.sum())
        self.assertTrue(allowed[s.tokens[b, t]], f"row {b} position {t}: token outside the allowed set")
        x = logits[b, t - 1].astype(np.float64) / temperature
        want = x[s.tokens[b, t]] - special.logsumexp(x[allowed])
        self.assertAlmostEqual(float(s.logprobs[b, t]), want, delta=1e-5)
    # The check has teeth only if the cut bites: allowed sets are neither the vocab nor a single token.
    self.assertLess(np.mean(sizes), 0.5 * _model()[0].vocab_size)
    self.assertGreater(np.max(sizes), 1)

  def test_stop_tokens(self):
    greedy = _run(rs.SamplingConfig(max_new_tokens=N, temperature=0.0))
    gen_tokens = [greedy.tokens[b, PROMPT_LENGTHS[b]:PROMPT_LENGTHS[b] + N] for b in range(B)]
    # A stop token that some rows emit and some do not, taken from the greedy run (which it does not change);
    # preferably one emitted mid-row, so that a kept prefix, the stop token and padding all follow.
    candidates = [int(gen_tokens[b][i]) for i in (*range(2, N), 0, 1) for b in range(B)]
    stop = next(c for c in candidates if 0 < sum(c in g for g in gen_tokens) < B)
    never = next(v for v in range(1, 512) if all(v not in g for g in gen_tokens))
    pad_id = 511 if all(511 not in g for g in gen_tokens) else never
    s = _run(rs.SamplingConfig(max_new_tokens=N, temperature=0.0, stop_tokens=(never, stop), pad_id=pad_id))
    for b in range(B):
      hits = np.flatnonzero(gen_tokens[b] == stop)
      length = int(hits[0]) + 1 if hits.size else N
      self.assertEqual(s.lengths[b], length, f"row {b}")
      self.assertEqual(bool(s.stopped[b]), bool(hits.size), f"row {b}")
      end = PROMPT_LENGTHS[b] + length
      np.testing.assert_array_equal(s.tokens[b, :end], greedy.tokens[b, :end])
      np.testing.assert_array_equal(s.tokens[b, end:], pad_id)
      np.testing.assert_array_equal(s.loss_mask[b, end:], 0.0)
      np.testing.assert_array_equal(s.loss_mask[b, PROMPT_LENGTHS[b]:end], 1.0)
      np.testing.assert_array_equal(s.logprobs[b, end:], 0.0)
      np.testing.assert_array_equal(s.logprobs[b, :end], greedy.logprobs[b, :end])

  def test_bad_inputs(self):
    for kwargs, msg in [({"max_new_tokens": 0}, "max_new_tokens"), ({"temperature": -0.5}, "temperature"),
                        ({"top_k": -1}, "top_k"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p")]:
      with self.assertRaisesRegex(ValueError, msg):
        rs.SamplingConfig(**{"max_new_tokens": N, **kwargs})
    cfg, params = _model()
    sampling = rs.SamplingConfig(max_new_tokens=N)
    prompts, key = jnp.asarray(_prompts()), jax.random.key(0)
    call = functools.partial(rs.sample, params, cfg=cfg, sampling=sampling)
    for bad in ([0, 2, 3, 1], [7, 2, 3, 1]):
      with self.assertRaisesRegex(ValueError, r"prompt_lengths must lie in \[1, P=6\]"):
        call(prompts, jnp.asarray(bad), key)
    with self.assertRaisesRegex(ValueError, "prompt_lengths has shape"):
      call(prompts, jnp.asarray([1, 2]), key)
    with self.assertRaisesRegex(ValueError, "prompts has shape"):
      call(prompts[0], jnp.asarray([1]), key)
    with self.assertRaisesRegex(ValueError, "prompts has dtype"):
      call(prompts.astype(jnp.float32), jnp.asarray(PROMPT_LENGTHS), key)
    with self.assertRaisesRegex(ValueError, "key has shape"):
      call(prompts, jnp.asarray(PROMPT_LENGTHS), jax.random.split(key, 3))

  def test_jittable_with_static_configs(self):
    cfg, params = _model()
    sampling = rs.SamplingConfig(max_new_tokens=N, top_p=0.9, stop_tokens=(3,))
    fn = jax.jit(rs.sample, static_argnames=("cfg", "sampling"))
    # Tracing (not compiling: that would cost seconds) checks that no Python control flow touches traced values.
    out = jax.eval_shape(functools.partial(fn, cfg=cfg, sampling=sampling), params, jnp.asarray(_prompts()),
                         jnp.asarray(PROMPT_LENGTHS), jax.random.key(0))
    chex.assert_shape(out.tokens, (B, P + N))
    self.assertEqual(out.stopped.dtype, jnp.bool_)
    self.assertEqual(out.logprobs.dtype, jnp.float32)
    self.assertEqual(out.expert_ids.dtype, jnp.int32)

  def test_first_token_distribution(self):
    """Chi-square goodness of fit of 2048 first tokens to softmax(logits / T); fixed seed, so deterministic."""
    cfg, params = _model()
    temperature, n = 0.8, 2048
    prompt = np.broadcast_to(_prompts()[0], (n, P))
    s = rs.sample(params, jnp.asarray(prompt), jnp.full((n,), P, jnp.int32), jax.random.key(SEED), cfg=cfg,
                  sampling=rs.SamplingConfig(max_new_tokens=1, temperature=temperature))
    drawn = np.asarray(s.tokens[:, P])
    # Row 0 of the test batch holds the same full-length prompt: reuse the [B, T] forward program.
    logits, _ = _forward(np.pad(_prompts(), ((0, 0), (0, N))))
    counts = np.bincount(drawn, minlength=cfg.vocab_size)

    def p_value(probs):
      # Tokens with expected count < 5 are pooled into one bin, as the chi-square approximation needs.
      expected = n * probs
      big = expected >= 5
      obs = np.append(counts[big], counts[~big].sum())
      exp = np.append(expected[big], expected[~big].sum())
      return stats.chisquare(obs, exp).pvalue

    want = np.exp(_log_softmax(logits[0, P - 1].astype(np.float64) / temperature))
    self.assertGreater(p_value(want), 1e-3)  # a correct sampler fails this at this seed with probability 1e-3
    # Power: the untempered distribution is rejected by the same test.
    untempered = np.exp(_log_softmax(logits[0, P - 1].astype(np.float64)))
    self.assertLess(p_value(untempered), 1e-6)


if __name__ == "__main__":
  absltest.main()
