"""Self-summary chains from the actor's rows to the update (report section 4): the rows `episode_group` writes for
chains of 1, 2 and 3 segments, collated, give every segment its chain's reward and the advantage of the estimator
stated in `c2jax.rl.update` (each chain counted once in its group's baseline, the token normalizer a constant), and
the masked-vs-trained switch changes the gradient by exactly the summary tokens' part of it.
"""

import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.actors.actor import episode_group
from c2jax.actors.ledger import EpisodeEnd, Segment, Source, SummaryTokens, Trajectory
from c2jax.model.losses import token_log_probs
from c2jax.model.transformer import forward
from c2jax.rl.config import RLConfig
from c2jax.rl.update import prepare, rl_gradients
from c2jax.rollouts.buffer import Group
from c2jax.services.collate import groups_to_batch
from tests import tiny

MODEL = tiny.MODEL
T = 24
P, R, S = Source.PROMPT, Source.RESUME, Source.SUMMARY
M, O, Q = Source.MODEL, Source.OBSERVATION, Source.SUMMARY_REQUEST
# Segment layouts: the first segment of a chain that summarizes, a middle one, a last one, a chain of one segment.
FIRST = [P] * 4 + [M] * 3 + [O] * 2 + [Q] * 2 + [S] * 4
MIDDLE = [P] * 4 + [R] * 3 + [M] * 2 + [O] * 2 + [Q] * 2 + [S] * 3
LAST = [P] * 4 + [R] * 3 + [M] * 5
ALONE = [P] * 4 + [M] * 3 + [O] * 3 + [M] * 6


@functools.cache
def _forward():
  return tiny.jit(forward, cfg=MODEL, with_mtp=False)


def _segment(sources, rng, params) -> Segment:
  n = len(sources)
  tokens = rng.integers(0, MODEL.vocab_size, n).astype(np.int32)
  out = _forward()(params, tokens[None])
  lp = np.zeros(n, np.float32)
  lp[1:] = np.asarray(token_log_probs(out.logits[:, :-1], tokens[None, 1:]))[0]
  source = np.asarray(sources, np.int8)
  action = np.isin(source, (M, S))
  return Segment(tokens=tokens, source=source, turn=np.zeros(n, np.int32), logprobs=np.where(action, lp, 0.0),
                 versions=np.zeros(n, np.int32), expert_ids=np.asarray(out.expert_ids)[:, 0], drift=0)


def _chain(layouts, reward, rng, params) -> Trajectory:
  segs = [_segment(s, rng, params) for s in layouts]
  last = segs[-1]
  return Trajectory(**{k: getattr(last, k) for k in ("tokens", "source", "turn", "logprobs", "versions",
                                                     "expert_ids", "drift")},
                    turns=3, end=EpisodeEnd.FINISHED, reward_terms={"outcome": reward}, earlier=tuple(segs[:-1]))


def _batch(summary_tokens: SummaryTokens, params) -> dict:
  """Two groups: (chain of 1 segment r=1, chain of 2 r=0, chain of 3 r=1), (chain of 2 r=1, chain of 1 r=0)."""
  rng = np.random.default_rng(0)
  groups = [[_chain([ALONE], 1.0, rng, params), _chain([FIRST, LAST], 0.0, rng, params),
             _chain([FIRST, MIDDLE, LAST], 1.0, rng, params)],
            [_chain([FIRST, LAST], 1.0, rng, params), _chain([ALONE], 0.0, rng, params)]]
  data = [episode_group(g, seq_len=T, reward_terms=("outcome",), summary_tokens=summary_tokens) for g in groups]
  return groups_to_batch([Group(data=d, meta={}) for d in data], rows=16)


class SummaryChainTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = tiny.params(MODEL)
    cls.cfg = RLConfig(model=MODEL, kl_coef=0.0, advantage="dr_grpo", aggregation="token_sum_constant")

  def test_rows_chain_ids_and_segments(self):
    batch = _batch(SummaryTokens.TRAINED, self.params)
    np.testing.assert_array_equal(batch["group_id"][:11], [0] * 6 + [1] * 3 + [-1] * 2)
    np.testing.assert_array_equal(batch["chain_id"][:9], [0, 1, 1, 2, 2, 2, 3, 3, 4])
    np.testing.assert_array_equal(batch["reward_terms"]["outcome"][:9], [1, 0, 0, 1, 1, 1, 1, 1, 0])

  def test_every_segment_gets_its_chains_advantage_with_the_chain_counted_once(self):
    batch = _batch(SummaryTokens.TRAINED, self.params)
    prep = jax.jit(functools.partial(prepare, cfg=self.cfg))(batch, None)
    # The estimator of c2jax.rl.update: A_c = R_c - mean over the group's chains (not its rows) of R.
    want = np.zeros(16, np.float32)
    want[:6] = np.array([1, 0, 0, 1, 1, 1]) - 2 / 3  # group 0: chains 1, 0, 1 (a row mean would be 4 / 6)
    want[6:9] = np.array([1, 1, 0]) - 1 / 2  # group 1: chains 1, 0 (a row mean would be 2 / 3)
    np.testing.assert_allclose(prep.advantage, want, rtol=0, atol=1e-6)
    # The normalizer: w = m / C with C = B x T, the same for every token of every segment.
    mask = np.asarray(batch["loss_mask"]).copy()
    mask[:, 0] = 0
    np.testing.assert_allclose(prep.weight, mask / (16 * T), rtol=1e-6)

  @pytest.mark.slow
  def test_masked_summaries_change_the_gradient_by_exactly_their_tokens(self):
    trained = _batch(SummaryTokens.TRAINED, self.params)
    masked = _batch(SummaryTokens.MASKED, self.params)
    for f in ("tokens", "behaviour_logprobs", "group_id", "chain_id", "expert_ids"):
      np.testing.assert_array_equal(trained[f], masked[f])
    diff = trained["loss_mask"] - masked["loss_mask"]
    self.assertGreater(diff.sum(), 0)
    only_summaries = {**trained, "loss_mask": diff}
    is_summary = diff > 0
    # Only summary positions differ between the two masks.
    np.testing.assert_array_equal(trained["loss_mask"][~is_summary], masked["loss_mask"][~is_summary])
    grads = tiny.jit(rl_gradients, cfg=self.cfg)
    g = lambda b: grads(self.params, None, jnp.int32(0), b)[0]
    g_trained, g_masked, g_summaries = g(trained), g(masked), g(only_summaries)
    # On policy (ratio 1, nothing clipped) with a constant normalizer the loss is linear in the token mask: the
    # masked run's gradient is the trained one without the summary tokens' part, every other token's unchanged.
    scale = max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_trained))
    for a, b, c in zip(jax.tree.leaves(g_trained), jax.tree.leaves(g_masked), jax.tree.leaves(g_summaries)):
      np.testing.assert_allclose(np.asarray(a) - np.asarray(b), np.asarray(c), rtol=0, atol=1e-5 * scale)
    self.assertGreater(max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(g_summaries)), 1e-3 * scale)


if __name__ == "__main__":
  absltest.main()
