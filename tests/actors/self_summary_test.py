"""Self-summaries in the agent loop: segment boundaries and ledgers, the summary request and the new segment's
prompt, exactness of every segment against the trainer's forward (the rewound slot's kept prefix included), an
observation carried over when it does not fit beside a summary, the budgets that cut a chain, and slot
independence (report section 4).

Scripted turns (forced through the engine) give the episodes a known shape; the engine and model are the agent
loop tests' (tests/tiny.py), so the programs compile once for both files.
"""

import functools

from absl.testing import absltest
import jax
import numpy as np
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, SummaryConfig
from c2jax.actors.ledger import EpisodeEnd, Source, SummaryTokens
from c2jax.envs.chat import self_summary
from tests import tiny
from tests.actors.agent_loop_test import ENGINE, MODEL, SAMPLING, TOK, EchoEnv

SUMMARY = SummaryConfig(trigger_tokens=300, max_tokens=48, max_segments=4)
AGENT = AgentConfig(max_turns=8, max_turn_tokens=16, max_episode_tokens=1000, chunk_steps=4, tool_workers=2,
                    summary=SUMMARY)


def _script(turn, observations):
  """Tool turns "call <turn>", and a summary naming how many observations the segment held."""
  if self_summary.is_request(observations[-1]):
    return f"summary after turn {turn}: {len(observations)} observations"
  return f"call {turn}"


def _episodes(n=3, turns=6, observation_bytes=60, script=_script):
  return [Episode(prompt=TOK.encode(f"task {i} " * (i + 2), bos=True, eos=False),
                  make_env=functools.partial(EchoEnv, turns, observation_bytes=observation_bytes),
                  key=jax.random.key(200 + i), script=script)
          for i in range(n)]


@functools.cache
def _runner(agent: AgentConfig = AGENT) -> AgentRunner:
  return AgentRunner(MODEL, ENGINE, SAMPLING, agent, TOK)


def _forward(params, tokens):
  return tiny.trainer_logprobs(MODEL, params, tokens)


def _runs(segment):
  return [(src, TOK.decode(segment.tokens[s:e])) for s, e, src, _ in segment.boundaries()]


@pytest.mark.slow  # every test runs whole summarizing episodes through the agent loop
class SelfSummaryTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = tiny.params(MODEL)
    cls.trajs = _runner().run(_episodes(), weights=lambda: (cls.params, 2))

  def test_segments_have_their_own_ledgers_and_equal_the_trainer_forward(self):
    for i, traj in enumerate(self.trajs):
      prompt = TOK.encode(f"task {i} " * (i + 2), bos=True, eos=False)
      self.assertGreaterEqual(traj.compactions, 1)
      self.assertLen(traj.segments, traj.compactions + 1)
      for seg in traj.segments:
        np.testing.assert_array_equal(seg.tokens[:len(prompt)], prompt)  # every segment opens with the task
        self.assertEqual(seg.prompt_length, len(prompt))
        self.assertEqual(seg.drift, 0)
        self.assertLessEqual(len(seg.tokens), ENGINE.context)
        # Exact log-probs and routing on every position: the rewound slot's kept prefix and the new segment's
        # positions attend only to this segment.
        lp, ids = _forward(self.params, seg.tokens)
        action = np.isin(seg.source, (Source.MODEL, Source.SUMMARY))
        np.testing.assert_allclose(seg.logprobs[action], lp[action], rtol=0, atol=2e-5)
        np.testing.assert_array_equal(seg.expert_ids, ids)
        np.testing.assert_array_equal(seg.versions[action], 2)
      # The environment went on across segments: 6 tool turns in all, its counter never reset.
      self.assertEqual((traj.end, traj.reward_terms["outcome"]), (EpisodeEnd.FINISHED, 6.0))
      self.assertEqual(traj.turns, 6 + traj.compactions)
    self.assertEqual(_runner().stats.reprefill_fraction, 0.0)  # a later segment's prompt is never fed again

  def test_summary_request_and_the_next_segments_prompt(self):
    traj = self.trajs[0]
    for k, seg in enumerate(traj.segments[:-1]):
      runs = _runs(seg)
      (req_src, request), (sum_src, summary) = runs[-2], runs[-1]
      self.assertEqual((req_src, sum_src), (Source.SUMMARY_REQUEST, Source.SUMMARY))
      self.assertEqual(request, self_summary.request(SUMMARY.max_tokens))
      self.assertTrue(summary.startswith("summary after turn "), summary)
      self.assertEqual(runs[-3][0], Source.NOTICE)  # the last observation fit: it came before the request
      # The next segment: the task, then this summary framed, then the next turn.
      nxt = _runs(traj.segments[k + 1])
      self.assertEqual([src for src, _ in nxt[:3]], [Source.PROMPT, Source.RESUME, Source.MODEL])
      self.assertEqual(nxt[1][1], self_summary.resume(summary.removesuffix(TOK.decode([TOK.eos_id]))))
    # The segment's trigger: it reached trigger_tokens after its last observation.
    first = traj.segments[0]
    before_request = int(np.flatnonzero(first.source == Source.SUMMARY_REQUEST)[0])
    self.assertGreaterEqual(before_request, SUMMARY.trigger_tokens)
    self.assertEqual(first.summary_tokens, np.sum(first.source == Source.SUMMARY))

  def test_rows_are_per_segment_and_masked_summaries_leave_only_the_loss_mask(self):
    traj = self.trajs[1]
    trained, masked = traj.rows(ENGINE.context), traj.rows(ENGINE.context, SummaryTokens.MASKED)
    self.assertLen(trained, len(traj.segments))
    for seg, t, m in zip(traj.segments, trained, masked):
      n = len(seg.tokens)
      is_summary = seg.source == Source.SUMMARY
      np.testing.assert_array_equal(t["loss_mask"][:n], np.isin(seg.source, (Source.MODEL, Source.SUMMARY)))
      np.testing.assert_array_equal(m["loss_mask"][:n], t["loss_mask"][:n] * ~is_summary)
      for f in ("tokens", "behaviour_logprobs", "policy_version", "source", "turn", "expert_ids"):
        np.testing.assert_array_equal(t[f], m[f])

  def test_an_observation_that_does_not_fit_beside_a_summary_opens_the_next_segment(self):
    # 500-byte observations: after two turns the next one would leave no room for the request and a summary.
    runner = _runner(AgentConfig(max_turns=8, max_turn_tokens=16, max_episode_tokens=1000, chunk_steps=4,
                                 summary=SummaryConfig(trigger_tokens=1200, max_tokens=48, max_segments=4)))
    traj = runner.run(_episodes(1, turns=4, observation_bytes=500), weights=lambda: (self.params, 0))[0]
    self.assertGreaterEqual(traj.compactions, 1)
    runs = _runs(traj.segments[0])
    self.assertEqual([src for src, _ in runs[-3:]], [Source.MODEL, Source.SUMMARY_REQUEST, Source.SUMMARY])
    nxt = _runs(traj.segments[1])
    self.assertEqual([src for src, _ in nxt[:4]], [Source.PROMPT, Source.RESUME, Source.OBSERVATION, Source.NOTICE])
    # It is the observation answering the last turn of the segment before (EchoEnv numbers them).
    tool_turns = sum(src is Source.MODEL for src, _ in runs)
    self.assertTrue(nxt[2][1].startswith(f"<obs {tool_turns}: "), nxt[2][1][:20])
    self.assertEqual(traj.end, EpisodeEnd.FINISHED)
    for seg in traj.segments:
      lp, _ = _forward(self.params, seg.tokens)
      action = np.isin(seg.source, (Source.MODEL, Source.SUMMARY))
      np.testing.assert_allclose(seg.logprobs[action], lp[action], rtol=0, atol=2e-5)

  def test_budgets_cut_a_chain(self):
    never = 100  # EchoEnv that never finishes
    # A summary that does not end within max_tokens ends the episode as cut, with no new segment.
    wordy = lambda turn, obs: "x" * 80 if self_summary.is_request(obs[-1]) else f"call {turn}"
    overrun = _runner().run(_episodes(1, turns=never, script=wordy), weights=lambda: (self.params, 0))[0]
    self.assertEqual((overrun.end, overrun.compactions), (EpisodeEnd.SUMMARY_BUDGET, 0))
    self.assertTrue(overrun.cut)
    self.assertEqual(overrun.summary_tokens, SUMMARY.max_tokens)
    # The context filling again in the last of max_segments segments ends it.
    two = _runner(AgentConfig(max_turns=50, max_turn_tokens=16, max_episode_tokens=5000, chunk_steps=4,
                              summary=SummaryConfig(trigger_tokens=300, max_tokens=48, max_segments=2)))
    limit = two.run(_episodes(1, turns=never), weights=lambda: (self.params, 0))[0]
    self.assertEqual((limit.end, limit.compactions), (EpisodeEnd.SEGMENT_LIMIT, 1))
    # Without summaries (the truncation baseline) the same episode is cut when its context is full.
    off = _runner(AgentConfig(max_turns=50, max_turn_tokens=16, max_episode_tokens=5000, chunk_steps=4))
    cut = off.run(_episodes(1, turns=never), weights=lambda: (self.params, 0))[0]
    self.assertEqual((cut.end, cut.compactions), (EpisodeEnd.CONTEXT, 0))
    self.assertGreater(len(cut.tokens), SUMMARY.trigger_tokens)
    # A prompt that leaves no room for a summary is refused in one sentence.
    huge = [Episode(prompt=[1] * (ENGINE.context - 100), make_env=lambda: EchoEnv(1), key=0)]
    with self.assertRaisesRegex(ValueError, "kept for a summary"):
      _runner().run(huge, weights=lambda: (self.params, 0))

  def test_sampled_summaries_do_not_depend_on_the_slot(self):
    # Tool turns forced, summaries sampled: a chain drawn in a shared slot equals the same chain alone, segment by
    # segment (the rewind keeps the episode's key and draw count).
    script = lambda turn, obs: None if self_summary.is_request(obs[-1]) else f"call {turn}"
    eps = _episodes(3, turns=5, script=script)
    batched = _runner().run(eps, weights=lambda: (self.params, 0))
    for i in (0, 2):
      alone = _runner().run(eps[i:i + 1], weights=lambda: (self.params, 0))[0]
      self.assertEqual(alone.end, batched[i].end)
      self.assertLen(alone.segments, len(batched[i].segments))
      for a, b in zip(alone.segments, batched[i].segments):
        np.testing.assert_array_equal(a.tokens, b.tokens)
        np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=2e-5)
    self.assertTrue(any(t.summary_tokens for t in batched))


if __name__ == "__main__":
  absltest.main()
