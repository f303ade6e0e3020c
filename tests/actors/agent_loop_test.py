"""The agent loop on the slot engine: exactness against the trainer's forward and against one episode at a time,
the ledger (drift 0, masks), budgets, forced turns, in-flight weight swaps across turns, real sandboxed tools and a
data/expert mesh.

Every test shares one engine configuration (4 slots, 1280 positions, chunks 16/64/256, forced turns up to 256), so
the engine compiles once per bucket.
"""

import dataclasses
import functools
import time
from unittest import mock

from absl.testing import absltest
import chex
import jax
import numpy as np
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, ForcedTurns, overlap_fraction
from c2jax.actors.engine import EngineConfig, Shapes
from c2jax.actors.ledger import EpisodeEnd, Source
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.core.agent_env import OneTurnEnv, TurnResult
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.token_tasks.char_class import CharClassSuite
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.core import env as env_lib
from c2jax.envs.teachers.scripted_policies import ExplorerPolicy
from c2jax.model.params import init_params
from c2jax.parallel import layout as layout_lib
from c2jax.parallel.mesh import MeshConfig, make_mesh
from tests import tiny

TOK = ByteTokenizer()
MODEL = tiny.BYTES
ENGINE = tiny.ENGINE
SAMPLING = tiny.ENGINE_SAMPLING
AGENT = AgentConfig(max_turns=6, max_turn_tokens=12, max_episode_tokens=60, chunk_steps=4, tool_workers=3)
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # jax's event per executable made (compiled or read)
_ENGINE_PROGRAMS = {f"jit({f})" for f in ("_append_rows", "_append", "_decode_rows", "_decode", "_force_rows",
                                            "_force")}


class EchoEnv:
  """A scripted environment: each turn's observation names the turn and its length; finishes after `turns`."""

  def __init__(self, turns: int, observation_bytes: int = 0):
    self.turns, self.t, self.observation_bytes = turns, 0, observation_bytes
    self.closed = False
    self.texts = []

  def reset(self):
    time.sleep(0.005)

  def step(self, ids, text):
    self.t += 1
    self.texts.append((np.asarray(ids).copy(), text))
    time.sleep(0.01)
    pad = "x" * self.observation_bytes
    return TurnResult(observation=f"<obs {self.t}: {len(ids)}{pad}>", notice=f"\n[turn {self.t}]",
                      done=self.t >= self.turns, reason="finish")

  def reward(self):
    return {"outcome": float(self.t)}

  def close(self):
    self.closed = True


def _episodes(n=6, turns=lambda i: 2 + i % 3, **env_kw):
  return [Episode(prompt=TOK.encode(f"task {i} " * (i + 1), bos=True, eos=False),
                  make_env=functools.partial(EchoEnv, turns(i), **env_kw), key=jax.random.key(100 + i))
          for i in range(n)]


@functools.cache
def _runner(agent: AgentConfig = AGENT) -> AgentRunner:
  return AgentRunner(MODEL, ENGINE, SAMPLING, agent, TOK)


def _forward_logprobs(params, tokens):
  return tiny.trainer_logprobs(MODEL, params, tokens)


class AgentLoopTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = tiny.params(MODEL)
    cls.batched = _runner().run(_episodes(), weights=lambda: (cls.params, 3))

  @pytest.mark.slow
  def test_trajectories_equal_the_trainer_forward(self):
    # Log-probs to float32 rounding and identical routing at every position, prompt, turns and observations alike,
    # though the episodes shared slots, chunks and decode steps; the last position's routing comes from the final
    # feed.
    for traj in self.batched:
      lp, ids = _forward_logprobs(self.params, traj.tokens)
      model = traj.source == Source.MODEL
      np.testing.assert_allclose(traj.logprobs[model], lp[model], rtol=0, atol=2e-5)
      np.testing.assert_array_equal(traj.expert_ids, ids)
      np.testing.assert_array_equal(traj.versions[model], 3)
      self.assertEqual(traj.drift, 0)
      self.assertGreaterEqual(traj.turns, 2)
    self.assertEqual(_runner().stats.reprefill_fraction, 0.0)

  def test_ledger_marks_every_position_and_rows_mask_only_model_tokens(self):
    traj = self.batched[2]  # 4 turns
    kinds = [(src, turn) for _, _, src, turn in traj.boundaries()]
    self.assertEqual(kinds[:5], [(Source.PROMPT, 0), (Source.MODEL, 0), (Source.OBSERVATION, 0), (Source.NOTICE, 0),
                                 (Source.MODEL, 1)])
    self.assertEqual(kinds[-1], (Source.MODEL, traj.turns - 1))
    for start, end, src, turn in traj.boundaries():
      text = TOK.decode(traj.tokens[start:end])
      if src is Source.OBSERVATION:
        self.assertTrue(text.startswith(f"<obs {turn + 1}: "), text)
      if src is Source.NOTICE:
        self.assertEqual(text, f"\n[turn {turn + 1}]")
    row = traj.row(ENGINE.context)
    n = len(traj.tokens)
    np.testing.assert_array_equal(row["loss_mask"][:n], traj.source == Source.MODEL)
    np.testing.assert_array_equal(row["loss_mask"][n:], 0)
    np.testing.assert_array_equal(row["behaviour_logprobs"][row["loss_mask"] == 0], 0)
    np.testing.assert_array_equal(row["policy_version"][row["loss_mask"] == 0], 0)
    np.testing.assert_array_equal(row["tokens"][:n], traj.tokens)
    chex.assert_shape(row["expert_ids"], (MODEL.n_moe_layers, ENGINE.context, MODEL.num_experts_per_tok))
    with self.assertRaisesRegex(ValueError, "does not fit"):
      traj.row(n - 1)

  def test_continuous_batching_equals_each_episode_alone(self):
    for i in (0, 3, 5):  # episode 5 ran in a slot freed by an earlier one
      alone = _runner().run(_episodes()[i:i + 1], weights=lambda: (self.params, 3))[0]
      np.testing.assert_array_equal(alone.tokens, self.batched[i].tokens)
      np.testing.assert_array_equal(alone.source, self.batched[i].source)
      np.testing.assert_allclose(alone.logprobs, self.batched[i].logprobs, rtol=0, atol=2e-5)
      np.testing.assert_array_equal(alone.expert_ids, self.batched[i].expert_ids)

  @pytest.mark.slow
  def test_full_shapes_give_the_same_trajectories(self):
    # Shapes.FULL: every call on all slots over the whole context (fewer programs) changes nothing an episode sees.
    runner = AgentRunner(MODEL, dataclasses.replace(ENGINE, shapes=Shapes.FULL), SAMPLING, AGENT, TOK)
    for want, got in zip(self.batched, runner.run(_episodes(), weights=lambda: (self.params, 3))):
      np.testing.assert_array_equal(got.tokens, want.tokens)
      np.testing.assert_array_equal(got.source, want.source)
      np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=2e-5)
      np.testing.assert_array_equal(got.expert_ids, want.expert_ids)
    self.assertEqual(ENGINE.window(300), 512)
    self.assertEqual(runner.engine.window(300), ENGINE.context)

  @pytest.mark.slow
  def test_compiled_programs_are_every_program_a_run_calls_and_change_no_slot(self):
    # Fewer row buckets change only how many idle slots pad a call; `compile_programs` compiles every program of
    # the engine's bounded set, after which a run compiles none of the engine's, and leaves the slots as they were
    # (the trajectories are those of the run above).
    engine = EngineConfig(slots=4, context=256, chunk_sizes=(64,), row_buckets=(2,))
    self.assertEqual([engine.rows(n) for n in range(1, 5)], [2, 2, 4, 4])
    self.assertEqual(ENGINE.row_counts(), (1, 2))  # the default: powers of two below the slots
    runner = AgentRunner(MODEL, engine, SAMPLING, AGENT, TOK)
    compiled = []
    listen = lambda event, seconds, **kw: compiled.append(kw.get("fun_name")) if event == _BACKEND_COMPILE else None
    jax.monitoring.register_event_duration_secs_listener(listen)
    self.addCleanup(jax._src.monitoring.unregister_event_duration_listener, listen)
    self.assertEqual(runner.compile_programs(self.params), 4)  # (2 rows, all 4) x one window x (an append, a decode)
    self.assertContainsSubset(_ENGINE_PROGRAMS - {"jit(_force_rows)", "jit(_force)"}, set(compiled))
    compiled.clear()
    got = runner.run(_episodes(), weights=lambda: (self.params, 3))
    self.assertEmpty([name for name in compiled if name in _ENGINE_PROGRAMS], compiled)
    for want, traj in zip(self.batched, got):
      np.testing.assert_array_equal(traj.tokens, want.tokens)
      np.testing.assert_array_equal(traj.source, want.source)
      np.testing.assert_allclose(traj.logprobs, want.logprobs, rtol=0, atol=2e-5)
      np.testing.assert_array_equal(traj.expert_ids, want.expert_ids)
    self.assertEqual(dataclasses.replace(engine, slots=2).row_counts(), ())  # a bucket of S or more is all S
    with self.assertRaisesRegex(ValueError, "row_buckets"):
      EngineConfig(slots=4, row_buckets=(2, 0))

  @pytest.mark.slow
  def test_in_flight_swaps_keep_every_cache_and_stamp_versions(self):
    # New weights arrive after a few device calls: every slot keeps its cache (the positions before the swap keep
    # the old weights' log-probs), tokens drawn after it carry the new version, and nothing is prefilled again.
    new = jax.device_get(jax.jit(init_params, static_argnums=0)(MODEL, jax.random.key(7)))
    calls = {"n": 0}

    def weights():
      calls["n"] += 1
      return (self.params, 0) if calls["n"] <= 6 else (new, 1)

    runner = _runner()
    before = runner.stats.weight_swaps
    out = runner.run(_episodes(), weights=weights)
    self.assertEqual(runner.stats.weight_swaps - before, 1)
    both = 0
    for traj in out:
      model = traj.source == Source.MODEL
      v = traj.versions[model]
      self.assertTrue(np.all(np.diff(v) >= 0), v)  # versions never go back along a trajectory
      if v.min() == 0 and v.max() == 1:
        both += 1
        first_new = int(np.flatnonzero(model & (traj.versions == 1))[0])
        lp_old, _ = _forward_logprobs(self.params, traj.tokens[:first_new])
        old = model[:first_new]
        np.testing.assert_allclose(traj.logprobs[:first_new][old], lp_old[old], rtol=0, atol=2e-5)
      self.assertEqual(traj.drift, 0)
    self.assertGreaterEqual(both, 1)  # some episode has turns under both versions

  @pytest.mark.slow
  def test_budgets_end_episodes_as_cut(self):
    never = lambda i: 100  # EchoEnv that never finishes
    turns = _runner(AgentConfig(max_turns=3, max_turn_tokens=8, max_episode_tokens=1000, chunk_steps=4))
    for traj in turns.run(_episodes(2, turns=never), weights=lambda: (self.params, 0)):
      self.assertEqual((traj.end, traj.turns), (EpisodeEnd.TURN_BUDGET, 3))
      self.assertTrue(traj.cut)
    tokens = _runner(AgentConfig(max_turns=50, max_turn_tokens=8, max_episode_tokens=20, chunk_steps=4))
    for traj in tokens.run(_episodes(2, turns=never), weights=lambda: (self.params, 0)):
      self.assertEqual(traj.end, EpisodeEnd.TOKEN_BUDGET)
      self.assertLessEqual(traj.model_tokens, 20)
      self.assertTrue(np.all([e - s <= 8 for s, e, src, _ in traj.boundaries() if src is Source.MODEL]))
    # An observation that would overflow the slot's context ends the episode, and nothing past the context exists.
    context = tokens.run(_episodes(1, turns=never, observation_bytes=600), weights=lambda: (self.params, 0))[0]
    self.assertEqual(context.end, EpisodeEnd.CONTEXT)
    self.assertLessEqual(len(context.tokens), ENGINE.context)
    # A last turn cut by its token budget is a cut, even when the environment calls the episode finished.
    cut = _runner().run(_episodes(1, turns=lambda i: 1), weights=lambda: (self.params, 0))[0]
    stopped = TOK.decode(cut.tokens[-1:]) == ">" or cut.tokens[-1] == TOK.eos_id
    self.assertEqual(cut.end, EpisodeEnd.FINISHED if stopped else EpisodeEnd.TOKEN_BUDGET)

  def test_forced_turns_take_the_scripts_tokens_with_the_models_logprobs(self):
    script = lambda turn, observations: f"turn {turn} saw {len(observations)}" if turn < 2 else None
    eps = [Episode(prompt=TOK.encode("scripted", bos=True, eos=False), make_env=functools.partial(EchoEnv, 3),
                   key=1, script=script)]
    runner = _runner(AgentConfig(max_turns=6, max_turn_tokens=40, max_episode_tokens=200, chunk_steps=4))
    traj = runner.run(eps, weights=lambda: (self.params, 0))[0]
    turns = [(s, e) for s, e, src, _ in traj.boundaries() if src is Source.MODEL]
    self.assertLen(turns, 3)
    for k, (s, e) in enumerate(turns[:2]):
      np.testing.assert_array_equal(traj.tokens[s:e], TOK.encode(f"turn {k} saw {k + 1}", bos=False, eos=True))
    lp, _ = _forward_logprobs(self.params, traj.tokens)
    model = traj.source == Source.MODEL
    np.testing.assert_allclose(traj.logprobs[model], lp[model], rtol=0, atol=2e-5)
    self.assertEqual(traj.end, EpisodeEnd.FINISHED if traj.tokens[-1] in SAMPLING.stop_tokens else
                     EpisodeEnd.TOKEN_BUDGET)

  def test_prefilled_forced_turns_equal_decoded_ones(self):
    # Forced turns of 1, 2, 17 (over the smallest bucket), 90 (over the middle one) and 300 bytes (over the largest
    # bucket, and over the turn budget: cut there), one per episode and turn, around a sampled turn (whose draws
    # must not move: the draw count advances by the forced tokens either way), 4 episodes in the 4 slots.
    lengths = (1, 2, 17, 90, 300)

    def script(i, turn, observations):
      if turn == 1:
        return None  # sampled
      return ("abcdefghij" * 40)[:lengths[(i + turn) % len(lengths)] - 1]  # plus the EOS

    def run(mode):
      agent = AgentConfig(max_turns=3, max_turn_tokens=200, max_episode_tokens=1000, chunk_steps=16,
                          forced_turns=mode)
      eps = [Episode(prompt=TOK.encode(f"task {i} " * (i + 1), bos=True, eos=False),
                     make_env=functools.partial(EchoEnv, 3), key=jax.random.key(7 + i),
                     script=functools.partial(script, i)) for i in range(4)]
      runner = AgentRunner(MODEL, ENGINE, SAMPLING, agent, TOK)
      return runner.run(eps, weights=lambda: (self.params, 5)), runner.stats

    prefilled, p_stats = run(ForcedTurns.PREFILL)
    decoded, d_stats = run(ForcedTurns.DECODE)
    self.assertGreater(p_stats.forces, 0)
    self.assertEqual(d_stats.forces, 0)
    self.assertLess(p_stats.decodes, d_stats.decodes)  # the sampled turns alone decode
    cut = 0
    for p, d in zip(prefilled, decoded):
      np.testing.assert_array_equal(p.tokens, d.tokens)
      np.testing.assert_array_equal(p.source, d.source)
      np.testing.assert_array_equal(p.turn, d.turn)
      np.testing.assert_array_equal(p.versions, d.versions)
      np.testing.assert_array_equal(p.expert_ids, d.expert_ids)
      np.testing.assert_allclose(p.logprobs, d.logprobs, rtol=0, atol=2e-5)
      self.assertEqual((p.end, p.turns, p.drift, dict(p.reward_terms)), (d.end, d.turns, d.drift, dict(d.reward_terms)))
      turns = [(s, e) for s, e, src, _ in p.boundaries() if src is Source.MODEL]
      cut += any(e - s == 200 for s, e in turns)
    self.assertGreater(cut, 0)  # a 300-byte script met its 200-token budget
    # (The trainer's forward scores prefilled forced tokens as the engine did: the test above, by default PREFILL.)

  def test_the_one_turn_case_is_the_suites_verifier(self):
    suite = CharClassSuite(seed=0)
    tasks = [suite.task("train", i) for i in range(3)]
    eps = [Episode(prompt=t.prompt, make_env=functools.partial(OneTurnEnv, suite, t), key=i)
           for i, t in enumerate(tasks)]
    out = _runner().run(eps, weights=lambda: (self.params, 0))
    for task, traj in zip(tasks, out):
      self.assertEqual(traj.turns, 1)
      generated = traj.tokens[traj.source == Source.MODEL]
      self.assertEqual(dict(traj.reward_terms), dict(suite.reward(task, generated)))

  def test_tools_run_while_other_slots_decode(self):
    self.assertEqual(overlap_fraction([(0.0, 2.0), (3.0, 4.0)], [(1.0, 3.5), (1.5, 2.5)]), 1.5 / 3.0)
    self.assertEqual(overlap_fraction([], [(0.0, 1.0)]), 0.0)
    # Slow tools on their own threads: the loop keeps decoding the other slots meanwhile.

    class Slow(EchoEnv):

      def step(self, ids, text):
        time.sleep(0.2)
        return super().step(ids, text)

    eps = [Episode(prompt=TOK.encode(f"slow {i}", bos=True, eos=False), make_env=functools.partial(Slow, 2), key=i)
           for i in range(4)]
    runner = _runner()
    n = len(runner.stats.tool_intervals)
    runner.run(eps, weights=lambda: (self.params, 0))
    spans = runner.stats.tool_intervals[n:]
    self.assertGreater(overlap_fraction(spans, runner.stats.decode_intervals), 0.0)

  @pytest.mark.slow
  def test_real_tools_in_a_sandbox(self):
    # The explorer script forced through the engine on tiny_functions: look, write, check, finish in 4-7 turns,
    # each tool's result an observation; the hidden tests grade what it left.
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    suite = CodingTaskSuite(coding_suite="tiny_functions", instructions="none", max_turns=6)
    policy = ExplorerPolicy()
    eps = []
    for i in range(3):
      task = suite.task("heldout", i)
      coding = suite.coding_task(task)
      eps.append(Episode(prompt=task.prompt, make_env=functools.partial(suite.agent_env, task), key=i,
                         script=lambda turn, obs, coding=coding: policy.act(coding, obs)))
    runner = _runner(AgentConfig(max_turns=8, max_turn_tokens=256, max_episode_tokens=1100, chunk_steps=16))
    turns = set()
    for traj in runner.run(eps, weights=lambda: (self.params, 0)):
      self.assertEqual(traj.end, EpisodeEnd.FINISHED)
      self.assertBetween(traj.turns, 4, 7)
      turns.add(traj.turns)
      self.assertEqual(traj.reward_terms["outcome"], 1.0)
      observations = "".join(TOK.decode(traj.tokens[s:e]) for s, e, src, _ in traj.boundaries()
                             if src is Source.OBSERVATION)
      self.assertIn('<result tool="read_file">', observations)
      self.assertIn('<result tool="write_file">', observations)
      self.assertIn("compiled", observations)
      self.assertEqual(traj.drift, 0)
    self.assertGreater(len(turns), 1)  # episodes of different lengths

  @pytest.mark.mesh
  def test_a_data_expert_mesh_gives_the_same_trajectories(self):
    # Slots over data-parallel replicas x expert-sharded weights on 4 devices: the trajectories of one device.
    mesh = make_mesh(MeshConfig(data=2, expert=2), jax.devices()[:4])
    layout = layout_lib.make_layout(MODEL, mesh)
    params = jax.device_put(self.params, layout_lib.param_shardings(MODEL, mesh))
    runner = AgentRunner(MODEL, ENGINE, SAMPLING, AGENT, TOK, layout=layout)
    for want, got in zip(self.batched[:4], runner.run(_episodes()[:4], weights=lambda: (params, 3))):
      np.testing.assert_array_equal(got.tokens, want.tokens)
      np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=2e-5)
      np.testing.assert_array_equal(got.expert_ids, want.expert_ids)
    with self.assertRaisesRegex(ValueError, "not divisible"):
      AgentRunner(MODEL, EngineConfig(slots=3, context=64), SAMPLING, AGENT, TOK, layout=layout)

  def test_refuses_prompts_that_do_not_fit(self):
    with self.assertRaisesRegex(ValueError, "1279 tokens"):
      _runner().run([Episode(prompt=[1] * ENGINE.context, make_env=lambda: EchoEnv(1))],
                    weights=lambda: (self.params, 0))
    with self.assertRaisesRegex(ValueError, "max_turns=0"):
      AgentConfig(max_turns=0)


class EnvErrorIsolationTest(absltest.TestCase):
  """Real coding episodes in the sandbox, some of whose policies also write a hostile file that makes the host raise
  while grading it or running its tools (as CPython 3.11's AST race did: "SystemError: AST constructor recursion
  depth mismatch"): each such episode ends with ENV_ERROR and reward 0; the run and the other episodes go on."""

  # The host's faults, one hostile episode each (its file evil_<k>.py), all in one run beside three sound episodes:
  # a fault in the grading (the episode's reward) or in a tool (the check after a write). The error's type takes no
  # path of its own (the loop catches any Exception there); each type is still raised by the host.
  FAULTS = (("grade", SystemError("AST constructor recursion depth mismatch (before=18, after=15)")),
            ("grade", MemoryError()),
            ("grade", RecursionError("maximum recursion depth exceeded")),
            ("step", RecursionError("maximum recursion depth exceeded during ast construction")),
            ("step", ValueError("source code string cannot contain null bytes")))

  @pytest.mark.slow
  def test_hostile_episodes_fail_alone(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    hostile = "x=" + "[" * 30 + "0" + "]" * 30 + "\n"  # what it holds matters not: the host's fault is injected
    grade = env_lib.grading.grade

    def fault(where, names):
      for k, (at, error) in enumerate(self.FAULTS):
        if at == where and f"evil_{k}.py" in names:
          raise error

    def fragile_grade(task, files, **kw):  # the host's grading of a workdir holding a hostile file raises
      fault("grade", files)
      return grade(task, files, **kw)

    over_limit = env_lib.CodingEnv._workdir_over_limit

    def fragile_over_limit(env):  # the host's check after a write raises on a hostile file
      fault("step", env._sandbox.list_files())
      return over_limit(env)

    suite = CodingTaskSuite(coding_suite="tiny_functions", instructions="none", max_turns=6)
    policy = ExplorerPolicy()
    eps, envs = [], []

    def make_env(task):
      envs.append(suite.agent_env(task))
      return envs[-1]

    hostile_at = {}  # episode -> fault
    for i in range(3 + len(self.FAULTS)):
      task = suite.task("heldout", i % 3)
      coding = suite.coding_task(task)
      if i >= 3:  # its solution turn also writes a hostile file
        hostile_at[i] = i - 3
        coding = dataclasses.replace(coding, solution={**coding.solution, f"evil_{i - 3}.py": hostile})
      eps.append(Episode(prompt=task.prompt, make_env=functools.partial(make_env, task), key=i,
                         script=lambda turn, obs, coding=coding: policy.act(coding, obs)))
    runner = AgentRunner(MODEL, ENGINE, SAMPLING, AgentConfig(max_turns=8, max_turn_tokens=256,
                                                              max_episode_tokens=1100, chunk_steps=16), TOK)
    with mock.patch.object(env_lib.grading, "grade", fragile_grade), \
        mock.patch.object(env_lib.CodingEnv, "_workdir_over_limit", fragile_over_limit):
      trajectories = runner.run(eps, weights=lambda: (tiny.params(MODEL), 0))
    self.assertLen(trajectories, len(eps))
    for i, traj in enumerate(trajectories):
      with self.subTest(episode=i, fault=self.FAULTS[hostile_at[i]][0] if i in hostile_at else None):
        if i in hostile_at:
          self.assertEqual(traj.end, EpisodeEnd.ENV_ERROR)
          self.assertEqual(dict(traj.reward_terms), {"outcome": 0.0, "env_error": 1.0})
          self.assertTrue(traj.cut)
        else:
          self.assertEqual(traj.end, EpisodeEnd.FINISHED)
          self.assertEqual(traj.reward_terms["outcome"], 1.0)
    self.assertEqual(runner.stats.env_errors, len(self.FAULTS))
    self.assertTrue(all(e.env._sandbox is None for e in envs))  # every environment was closed


if __name__ == "__main__":
  absltest.main()
