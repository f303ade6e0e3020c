"""The KV-cached sampler against the reference sampler and the trainer's forward; chunked decoding with weight
swaps; MTP speculative decoding (identical under greedy, distribution-preserving under sampling)."""

import dataclasses
import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats
import pytest

from c2jax.actors import reference_sampler
from c2jax.actors import sampler
from c2jax.actors.sampling import SamplingConfig
from c2jax.model.losses import token_log_probs
from c2jax.model.params import init_params
from c2jax.model.transformer import forward
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import MeshConfig, make_mesh
from tests import tiny

CFG = tiny.MODEL_MTP  # one dense, one MoE layer, one MTP module
B, P, N = 4, 6, 6
LENGTHS = np.array([6, 2, 4, 1], np.int32)


@functools.cache
def _params(scale: float = 4.0):
  """Random params with a sharper head (a fresh init is nearly uniform, which makes every test weak)."""
  params = jax.jit(init_params, static_argnums=0)(CFG, jax.random.key(0))
  return {**params, "lm_head": params["lm_head"] * scale}


def _prompts(b=B, seed=0):
  rng = np.random.default_rng(seed)
  return rng.integers(3, CFG.vocab_size, (b, P)).astype(np.int32)


def _stop_config():
  """Greedy with a stop token (row 0's third greedy token) and a stop sequence (row 1's second and third)."""
  greedy = jax.device_get(sampler.generate(_params(), _prompts(), LENGTHS, jax.random.key(0), cfg=CFG,
                                           sampling=SamplingConfig(max_new_tokens=N, temperature=0.0))).samples
  stop = int(greedy.tokens[0, LENGTHS[0] + 2])
  sequence = tuple(int(x) for x in greedy.tokens[1, LENGTHS[1] + 1:LENGTHS[1] + 3])
  return SamplingConfig(max_new_tokens=N, temperature=0.0, stop_tokens=(stop,), stop_sequences=(sequence,))


class SamplerTest(absltest.TestCase):

  def _both(self, sampling, prompts=None, lengths=LENGTHS, key=7, **kw):
    prompts = _prompts() if prompts is None else prompts
    fast = sampler.generate(_params(), prompts, lengths, jax.random.key(key), cfg=CFG, sampling=sampling, **kw)
    ref = reference_sampler.sample(_params(), prompts, lengths, jax.random.key(key), cfg=CFG, sampling=sampling)
    return jax.device_get(fast), jax.device_get(ref)

  def _assert_same(self, fast, ref):
    np.testing.assert_array_equal(fast.samples.tokens, ref.tokens)
    np.testing.assert_array_equal(fast.samples.loss_mask, ref.loss_mask)
    np.testing.assert_array_equal(fast.samples.lengths, ref.lengths)
    np.testing.assert_array_equal(fast.samples.stopped, ref.stopped)
    np.testing.assert_allclose(fast.samples.logprobs, ref.logprobs, rtol=0, atol=2e-5)
    ends = LENGTHS + ref.lengths
    for b, end in enumerate(ends):
      np.testing.assert_array_equal(fast.samples.expert_ids[:, b, :end], ref.expert_ids[:, b, :end])

  @pytest.mark.slow
  def test_matches_reference_sampler_token_for_token(self):
    # Cached decode equals the uncached full-sequence forward, token by token: same tokens from the same keys,
    # log-probs to float32 rounding, identical routing; prompts of different lengths in one batch.
    for sampling in (SamplingConfig(max_new_tokens=N, temperature=1.0),
                     SamplingConfig(max_new_tokens=N, temperature=0.0)):
      fast, ref = self._both(sampling)
      self._assert_same(fast, ref)

  def test_logprobs_and_routing_equal_the_trainer_forward(self):
    fast = jax.device_get(sampler.generate(_params(), _prompts(), LENGTHS, jax.random.key(3), cfg=CFG,
                                           sampling=SamplingConfig(max_new_tokens=N)))
    s = fast.samples
    out = jax.jit(functools.partial(forward, cfg=CFG, with_mtp=False))(_params(), s.tokens)
    lp = np.zeros_like(s.logprobs)
    lp[:, 1:] = token_log_probs(out.logits[:, :-1], s.tokens[:, 1:])
    np.testing.assert_allclose(s.logprobs, lp * s.loss_mask, rtol=0, atol=2e-5)  # float32 on CPU
    for b in range(B):
      end = LENGTHS[b] + s.lengths[b]
      np.testing.assert_array_equal(s.expert_ids[:, b, :end], np.asarray(out.expert_ids)[:, b, :end])
    np.testing.assert_array_equal(fast.policy_version, 0)

  @pytest.mark.slow
  def test_rows_do_not_depend_on_the_batch(self):
    sampling = SamplingConfig(max_new_tokens=N)
    prompts = _prompts()
    batch = jax.device_get(sampler.generate(_params(), prompts, LENGTHS, jax.random.key(5), cfg=CFG,
                                            sampling=sampling)).samples
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(5), jnp.arange(B, dtype=jnp.uint32))
    for b in (1, 2):  # rows generated alone with the key the batch gave them
      alone = jax.device_get(sampler.generate(_params(), prompts[b:b + 1], LENGTHS[b:b + 1], keys[b:b + 1], cfg=CFG,
                                              sampling=sampling)).samples
      np.testing.assert_array_equal(alone.tokens[0], batch.tokens[b])
      np.testing.assert_allclose(alone.logprobs[0], batch.logprobs[b], rtol=0, atol=2e-5)

  @pytest.mark.slow
  def test_chunked_decode_keeps_the_cache_and_stamps_versions(self):
    sampling = SamplingConfig(max_new_tokens=N, stop_tokens=())
    prompts = _prompts()
    whole = jax.device_get(sampler.generate(_params(), prompts, LENGTHS, jax.random.key(9), cfg=CFG,
                                            sampling=sampling))
    state = sampler.prefill(_params(), prompts, LENGTHS, jax.random.key(9), cfg=CFG, sampling=sampling, version=3)
    state = sampler.decode(_params(), state, cfg=CFG, sampling=sampling, steps=2, version=3)
    state = sampler.decode(_params(), state, cfg=CFG, sampling=sampling, steps=N, version=4)
    chunked = jax.device_get(sampler.finish(_params(), state, cfg=CFG))
    np.testing.assert_array_equal(chunked.samples.tokens, whole.samples.tokens)
    for b in range(B):
      v = chunked.policy_version[b, LENGTHS[b]:LENGTHS[b] + N]
      np.testing.assert_array_equal(v, [3, 3, 3, 4, 4, 4])  # prefill's token + 2 steps at 3, the rest at 4
    # New weights mid-generation: the cache from the old ones is kept, later tokens follow the new weights.
    other = {**_params(), "lm_head": -_params()["lm_head"]}
    state = sampler.prefill(_params(), prompts, LENGTHS, jax.random.key(9), cfg=CFG, sampling=sampling)
    state = sampler.decode(_params(), state, cfg=CFG, sampling=sampling, steps=2)
    state = sampler.decode(other, state, cfg=CFG, sampling=sampling, steps=N, version=1)
    swapped = jax.device_get(sampler.finish(other, state, cfg=CFG)).samples
    for b in range(B):  # the prompt, prefill's token and two decode steps came from the old weights
      np.testing.assert_array_equal(swapped.tokens[b, :LENGTHS[b] + 3], whole.samples.tokens[b, :LENGTHS[b] + 3])
    self.assertFalse(np.array_equal(swapped.tokens, whole.samples.tokens))

  @pytest.mark.slow
  def test_stop_tokens_and_sequences(self):
    fast, ref = self._both(_stop_config(), key=0)
    self._assert_same(fast, ref)
    self.assertTrue(fast.samples.stopped[0] and fast.samples.stopped[1])
    self.assertLessEqual(int(fast.samples.lengths[0]), 3)
    self.assertLessEqual(int(fast.samples.lengths[1]), 3)


class DecodeWindowsTest(absltest.TestCase):

  def test_windows_step_by_32_and_stay_few_for_long_caches(self):
    self.assertEqual(sampler.decode_windows(144), [32, 64, 96, 128, 144])
    self.assertEqual(sampler.decode_windows(20), [20])
    for t in (512, 513, 4096, 32768, 100_000):
      windows = sampler.decode_windows(t)
      self.assertLessEqual(len(windows), sampler.MAX_DECODE_WINDOWS, t)
      self.assertEqual(windows[-1], t)
      self.assertEqual(windows, sorted(set(windows)))
      self.assertTrue(all(w % sampler.DECODE_WINDOW_STEP == 0 for w in windows[:-1]), t)


class SpeculativeTest(absltest.TestCase):

  @pytest.mark.slow
  def test_greedy_speculative_equals_plain(self):
    # With stop tokens and sequences, so that multi-token steps are cut where plain decoding stops.
    sampling = _stop_config()
    plain = jax.device_get(sampler.generate(_params(), _prompts(), LENGTHS, jax.random.key(0), cfg=CFG,
                                            sampling=sampling))
    spec = jax.device_get(sampler.generate(_params(), _prompts(), LENGTHS, jax.random.key(0), cfg=CFG,
                                           sampling=sampling, speculative=2))
    np.testing.assert_array_equal(spec.samples.tokens, plain.samples.tokens)
    np.testing.assert_array_equal(spec.samples.lengths, plain.samples.lengths)
    np.testing.assert_array_equal(spec.samples.stopped, plain.samples.stopped)
    self.assertTrue(plain.samples.stopped[0] and plain.samples.stopped[1])
    np.testing.assert_allclose(spec.samples.logprobs, plain.samples.logprobs, rtol=0, atol=2e-5)
    for b in range(B):
      end = LENGTHS[b] + plain.samples.lengths[b]
      np.testing.assert_array_equal(spec.samples.expert_ids[:, b, :end], plain.samples.expert_ids[:, b, :end])
    self.assertGreater(int(spec.drafted), 0)
    self.assertBetween(spec.acceptance_rate, 0.0, 1.0)

  @pytest.mark.slow
  def test_sampled_speculative_preserves_the_distribution(self):
    # Many rows with one prompt: the second generated token is the first that a draft decides. Its distribution
    # must be the main model's marginal p(t2) = sum_t1 p(t1 | prompt) p(t2 | prompt, t1), whatever the (untrained,
    # so often wrong) drafter proposed: a chi-square goodness-of-fit test against the exact marginal.
    rows = 4096
    prompt = np.tile(_prompts(1, seed=3), (rows, 1))
    sampling = SamplingConfig(max_new_tokens=2, temperature=1.0)
    out = jax.device_get(sampler.generate(_params(), prompt, np.full(rows, P, np.int32), jax.random.key(11), cfg=CFG,
                                          sampling=sampling, speculative=1))
    second = out.samples.tokens[:, P + 1]
    fwd = jax.jit(functools.partial(forward, cfg=CFG, with_mtp=False))
    v = CFG.vocab_size
    p1 = np.asarray(jax.nn.softmax(fwd(_params(), jnp.asarray(prompt[:1])).logits[0, -1]), np.float64)
    every_t1 = np.concatenate([np.tile(prompt[0], (v, 1)), np.arange(v)[:, None]], axis=1).astype(np.int32)
    p2_given = np.asarray(jax.nn.softmax(fwd(_params(), jnp.asarray(every_t1)).logits[:, -1]), np.float64)
    p2 = p1 @ p2_given
    counts = np.bincount(second, minlength=v).astype(np.float64)
    expected = p2 * rows
    big = expected >= 5  # pool the tail into one cell
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    _, pvalue = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    self.assertGreater(pvalue, 1e-3)
    # The same test rejects the drafter's own distribution (what accepting every draft would give): MTP module 1
    # at the last prompt position sees t1 and predicts t2.
    mtp = jax.jit(functools.partial(forward, cfg=CFG))(_params(), jnp.asarray(every_t1)).mtp_logits
    q2 = p1 @ np.asarray(jax.nn.softmax(mtp[0, :, P - 1]), np.float64)
    exp_q = np.append(q2[big], q2[~big].sum()) * rows
    self.assertLess(stats.chisquare(obs, exp_q * obs.sum() / exp_q.sum())[1], 1e-6)
    # Both branches of the rule ran: some drafts were accepted and some rejected.
    self.assertGreater(int(out.accepted), 0)
    self.assertLess(int(out.accepted), int(out.drafted))

  def test_needs_mtp(self):
    with self.assertRaisesRegex(ValueError, "num_mtp_layers=0"):
      sampler.prefill(_params(), _prompts(), LENGTHS, jax.random.key(0), cfg=dataclasses.replace(CFG, num_mtp_layers=0),
                      sampling=SamplingConfig(max_new_tokens=2), speculative=1)


@pytest.mark.mesh
class MeshSamplerTest(absltest.TestCase):

  def test_sharded_generation_equals_one_device(self):
    # Data-parallel replicas x expert-sharded weights (the MoE runs expert-parallel) on 4 devices: same tokens,
    # log-probs and routing as on one device.
    sampling = SamplingConfig(max_new_tokens=N)
    want = jax.device_get(sampler.generate(_params(), _prompts(), LENGTHS, jax.random.key(3), cfg=CFG,
                                           sampling=sampling))
    mesh = make_mesh(MeshConfig(data=2, expert=2), jax.devices()[:4])
    layout = layout_lib.make_layout(CFG, mesh)
    params = jax.device_put(_params(), layout_lib.param_shardings(CFG, mesh))
    got = jax.device_get(sampler.generate(params, _prompts(), LENGTHS, jax.random.key(3), cfg=CFG, sampling=sampling,
                                          layout=layout))
    np.testing.assert_array_equal(got.samples.tokens, want.samples.tokens)
    np.testing.assert_allclose(got.samples.logprobs, want.samples.logprobs, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(got.samples.expert_ids, want.samples.expert_ids)

  def test_context_parallel_mesh_is_refused(self):
    layout = layout_lib.make_layout(CFG, make_mesh(MeshConfig(data=2, context=4)))
    with self.assertRaisesRegex(ValueError, "use a mesh with context=1"):
      sampler.generate(_params(), _prompts(8), np.full(8, P, np.int32), jax.random.key(0), cfg=CFG,
                       sampling=SamplingConfig(max_new_tokens=N), layout=layout)


if __name__ == "__main__":
  absltest.main()
