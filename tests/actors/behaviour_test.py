"""The agent's behaviour measured from trajectories (c2jax/actors/behaviour.py): each metric and its denominator on
hand-written episodes laid out as the agent loop lays out its ledger (byte tokens, so every count is exact), chains
of segments as one episode, and one real episode forced through the agent loop with sandboxed tools."""

import dataclasses
import functools
import math

from absl.testing import absltest, parameterized
import numpy as np
import pytest

from c2jax.actors import behaviour
from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode
from c2jax.actors.behaviour import EpisodeBehaviour, Outcome
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import EpisodeEnd, Segment, Source, Trajectory
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.chat import self_summary
from c2jax.envs.core.agent_env import CodingAgentEnv
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.core.env import EnvConfig, first_observation
from c2jax.envs.tools.protocol import HelpDetail, ToolCall, ToolName, render
from tests import tiny

TOK = ByteTokenizer()
TESTS = "python3 -m unittest -q"


def _call(name: str, **args) -> str:
  return render(ToolCall(ToolName(name), args))


def _block(tool: str, body: str, kind: str = "result") -> str:
  """One call's answer as CodingEnv.step writes it."""
  return f'<{kind} tool="{tool}">\n{body}\n</{kind}>'


def _segment(pieces) -> Segment:
  """A segment of (text, source, turn) pieces: the first prompt opens with BOS, model turns and summaries end with
  EOS (as sampled turns do), the rest is the text's bytes."""
  ids, source, turn = [], [], []
  for text, src, t in pieces:
    x = TOK.encode(text, bos=src is Source.PROMPT and not ids, eos=src in (Source.MODEL, Source.SUMMARY))
    ids += list(x)
    source += [int(src)] * len(x)
    turn += [t] * len(x)
  n = len(ids)
  return Segment(tokens=np.asarray(ids, np.int32), source=np.asarray(source, np.int8),
                 turn=np.asarray(turn, np.int32), logprobs=np.zeros(n, np.float32), versions=np.zeros(n, np.int32),
                 expert_ids=np.zeros((1, n, 2), np.int32), drift=0)


def _trajectory(segments, end: EpisodeEnd = EpisodeEnd.FINISHED) -> Trajectory:
  last = segments[-1]
  turns = len({(i, int(t)) for i, s in enumerate(segments) for t in s.turn[np.isin(s.source, (1, 5))]})
  return Trajectory(**{f.name: getattr(last, f.name) for f in dataclasses.fields(Segment)}, turns=turns, end=end,
                    earlier=tuple(segments[:-1]))


def _pieces(exchanges, first_turn: int = 0):
  """Turns as the agent loop appends them: the model's text, then its observation and the budget notice with the
  same index; an observation of None is the episode's last turn (the loop appends none)."""
  out = []
  for t, (text, observation) in enumerate(exchanges, first_turn):
    out.append((text, Source.MODEL, t))
    if observation is not None:
      out += [(observation, Source.OBSERVATION, t), (f"\n[turn {t + 1} of 8]", Source.NOTICE, t)]
  return out


def _episode(exchanges, end: EpisodeEnd = EpisodeEnd.FINISHED, prompt: str = "Fix util.py.") -> Trajectory:
  return _trajectory([_segment([(prompt, Source.PROMPT, 0)] + _pieces(exchanges))], end)


def _model_tokens(*texts: str) -> int:
  return sum(len(t.encode()) + 1 for t in texts)  # + EOS


READ = _call("read_file", path="spec.md")
WRITE = _call("write_file", path="util.py", content="def add(a, b):\n    return a - b\n")
RUN = _call("run", command=TESTS)
EDIT = _call("edit", path="util.py", search="a - b", replace="a + b")
FINISH = _call("finish")
FAILED = _block("run", "exit code 1\n--- stderr ---\nFAIL: test_add\nFAILED (failures=1)")
PASSED = _block("run", "exit code 0\n--- stderr ---\nRan 1 test\n\nOK")

GOOD = [(READ, _block("read_file", "add(a, b) returns the sum.")),
        (WRITE, _block("write_file", "wrote util.py (2 lines).")),
        (RUN, FAILED),
        (EDIT, _block("edit", "edited util.py at line 2 (-1 +1 lines).")),
        (RUN, PASSED),
        (FINISH, None)]
BLIND = [(WRITE + "\n" + FINISH, None)]
READER = [(READ, _block("read_file", "nothing to do")), (FINISH, None)]  # finishes without an edit or a test


def _facts(traj, task=None) -> EpisodeBehaviour:
  return behaviour.episode_behaviour(traj, TOK, task)


class EpisodeBehaviourTest(parameterized.TestCase):

  def test_reads_writes_tests_fails_edits_passes_finishes(self):
    b = _facts(_episode(GOOD))
    self.assertEqual(b, EpisodeBehaviour(
        turns=6, summaries=0, segments=1, tokens=_model_tokens(*(t for t, _ in GOOD)), calls=6, malformed_calls=0,
        incomplete_turns=0, edits=2, looks=1, test_runs=2, passing_test_runs=1, failing_test_runs=1,
        relevant_files=(), read_before_edit=True, finished=True, tests_before_finish=True, recovered=True,
        end=EpisodeEnd.FINISHED))
    m = behaviour.summarize([b])
    self.assertEqual(m["behaviour/read_before_edit"], 1.0)
    self.assertEqual(m["behaviour/tests_before_finish"], 1.0)
    self.assertEqual(m["behaviour/recovery_after_failing_tests"], 1.0)
    self.assertEqual(m["behaviour/malformed_call_rate"], 0.0)
    self.assertEqual(m["behaviour/turns_per_episode"], 6.0)

  def test_writes_blind_and_finishes(self):
    b = _facts(_episode(BLIND))
    self.assertEqual((b.turns, b.edits, b.calls, b.finished), (1, 1, 2, True))
    self.assertIs(b.read_before_edit, False)
    self.assertIs(b.tests_before_finish, False)
    self.assertIsNone(b.recovered)  # no failing test run: not applicable
    m = behaviour.summarize([b])
    self.assertEqual(m["behaviour/read_before_edit"], 0.0)
    self.assertEqual(m["behaviour/tests_before_finish"], 0.0)
    self.assertTrue(math.isnan(m["behaviour/recovery_after_failing_tests"]))
    self.assertEqual(m["behaviour/episodes_with_failing_tests"], 0.0)

  def test_malformed_and_cut_off_calls_are_counted(self):
    unknown_tool = '<tool name="read_file"><arg name="path">a.py</arg></tool>\n<tool name="open"/>'
    cut_off = '<tool name="write_file"><arg name="path">a.py</arg><arg name="content">def f('
    b = _facts(_episode([(unknown_tool, _block("read_file", "x = 1") + "\n<error>malformed ...</error>"),
                         (cut_off, None)], end=EpisodeEnd.TOKEN_BUDGET))
    self.assertEqual((b.calls, b.malformed_calls, b.incomplete_turns), (3, 2, 1))
    self.assertEqual((b.edits, b.finished, b.cut), (0, False, True))
    m = behaviour.summarize([b])
    self.assertAlmostEqual(m["behaviour/malformed_call_rate"], 2 / 3)
    self.assertEqual(m["behaviour/calls_per_episode"], 3.0)
    self.assertEqual(m["behaviour/cut_fraction"], 1.0)
    self.assertTrue(math.isnan(m["behaviour/tests_before_finish"]))  # a cut episode never finished
    self.assertEqual(m["behaviour/episodes_finished"], 0.0)

  def test_a_two_segment_chain_is_one_episode(self):
    # Segment 1: read, a failing test run, the summary request and the summary (its tool call is never run);
    # segment 2: the task again, the summary framed, then edit, a passing test run, finish.
    summary = "read spec.md; tests fail. " + _call("write_file", path="x.py", content="x")
    first = _segment([("Fix util.py.", Source.PROMPT, 0)] + _pieces([GOOD[0], GOOD[2]])
                     + [(self_summary.request(64), Source.SUMMARY_REQUEST, 1), (summary, Source.SUMMARY, 2)])
    second = _segment([("Fix util.py.", Source.PROMPT, 2), (self_summary.resume(summary), Source.RESUME, 2)]
                      + _pieces([GOOD[3], GOOD[4], GOOD[5]], first_turn=3))
    traj = _trajectory([first, second])
    model_turns, summaries = behaviour.turns(traj, TOK)
    self.assertEqual([t.index for t in model_turns], [0, 1, 3, 4, 5])
    self.assertEqual(summaries, 1)
    b = _facts(traj)
    self.assertEqual((b.turns, b.summaries, b.segments, b.edits, b.test_runs), (5, 1, 2, 1, 2))
    self.assertEqual(b.tokens, _model_tokens(READ, RUN, summary, EDIT, RUN, FINISH))
    self.assertEqual((b.read_before_edit, b.tests_before_finish, b.recovered), (True, True, True))
    self.assertEqual(behaviour.summarize([b])["behaviour/episodes"], 1.0)

  def test_an_observation_carried_into_the_next_segment_answers_the_turn_before_the_summary(self):
    # The failing run's result did not fit beside the summary: it opens segment 2 with the summary's index (2).
    first = _segment([("Fix util.py.", Source.PROMPT, 0)] + _pieces([GOOD[0]])
                     + [(RUN, Source.MODEL, 1), (self_summary.request(64), Source.SUMMARY_REQUEST, 1),
                        ("tests ran", Source.SUMMARY, 2)])
    second = _segment([("Fix util.py.", Source.PROMPT, 2), (self_summary.resume("tests ran"), Source.RESUME, 2),
                       (FAILED, Source.OBSERVATION, 2), ("\n[turn 2 of 8]", Source.NOTICE, 2)]
                      + _pieces([GOOD[3], GOOD[4], GOOD[5]], first_turn=3))
    traj = _trajectory([first, second])
    model_turns, _ = behaviour.turns(traj, TOK)
    self.assertEqual(model_turns[1].index, 1)
    self.assertEqual(model_turns[1].observation, FAILED)
    self.assertEqual(behaviour.run_status(model_turns[1].calls[0]), behaviour.RunStatus.FAILING)
    b = _facts(traj)
    self.assertEqual((b.failing_test_runs, b.passing_test_runs, b.recovered), (1, 1, True))

  @parameterized.named_parameters(
      ("read_and_write", [(READ + "\n" + WRITE, _block("read_file", "s") + "\n" + _block("write_file", "w")),
                          (FINISH, None)], "read_before_edit", False),
      ("tests_and_finish", [(WRITE, _block("write_file", "w")), (RUN + "\n" + FINISH, None)],
       "tests_before_finish", False),
      ("failing_then_passing", [(RUN + "\n" + RUN, FAILED + "\n" + PASSED), (FINISH, None)], "recovered", False),
      ("passing_a_turn_later", [(RUN, FAILED), (RUN, PASSED), (FINISH, None)], "recovered", True))
  def test_before_means_an_earlier_turn(self, exchanges, fact, want):
    # All calls of a turn are written before any runs: a result counts from the next turn on.
    self.assertIs(getattr(_facts(_episode(exchanges)), fact), want)

  def test_outcomes_come_from_the_result_blocks(self):
    missing = _block("read_file", "spec.md: No such file or directory.", kind="error")
    b = _facts(_episode([(READ, missing), (WRITE, _block("write_file", "w")), (FINISH, None)]))
    self.assertEqual((b.looks, b.read_before_edit), (0, False))  # a failed read showed nothing
    for look in (_call("grep", pattern="def add", path="."), _call("search_code", query="the add function")):
      name = look.split('"')[1]
      b = _facts(_episode([(look, _block(name, "util.py:1:def add(a, b):")), (WRITE, None)], EpisodeEnd.TURN_BUDGET))
      self.assertEqual((b.looks, b.read_before_edit), (1, True))
    # Blocks match the calls in order by name: a call without one (here not run) is unknown, the next still matches.
    turn = READ + "\n" + _call("read_file", path="b.md") + "\n" + RUN
    model_turns, _ = behaviour.turns(_episode([(turn, _block("read_file", "s") + "\n" + FAILED), (FINISH, None)]),
                                     TOK)
    self.assertEqual([c.outcome for c in model_turns[0].calls], [Outcome.OK, Outcome.UNKNOWN, Outcome.OK])
    self.assertEqual(model_turns[0].calls[2].result, "exit code 1\n--- stderr ---\nFAIL: test_add\nFAILED (failures=1)")
    self.assertEqual(model_turns[1].calls[0].outcome, Outcome.UNKNOWN)  # the last turn: no observation

  def test_run_status(self):
    timed_out = _block("run", "timed out after 30.0 s\n--- stdout ---\n...")
    tool_error = _block("run", "ValueError: bad", kind="error")
    for observation, want in ((FAILED, "failing"), (PASSED, "passing"), (timed_out, "failing"),
                              (tool_error, "unknown"), (_block("run", "exit code 0 (output truncated)"), "passing")):
      model_turns, _ = behaviour.turns(_episode([(RUN, observation), (FINISH, None)]), TOK)
      self.assertEqual(behaviour.run_status(model_turns[0].calls[0]).value, want, observation)
    b = _facts(_episode([(RUN, _block("run", "ValueError: bad", kind="error")), (RUN, None)], EpisodeEnd.TURN_BUDGET))
    self.assertEqual((b.test_runs, b.failing_test_runs, b.passing_test_runs, b.recovered), (2, 0, 0, None))

  def test_calls_after_finish_are_not_run(self):
    b = _facts(_episode([(FINISH + "\n" + WRITE, None)]))
    self.assertEqual((b.calls, b.edits, b.finished, b.read_before_edit), (2, 0, True, None))

  def test_relevant_files_from_the_task(self):
    task = CodingTask(task_id="t", prompt="Fix pkg/a.py.", files={"pkg/a.py": "x = 1\n", "README.md": "hi\n"},
                      hidden_tests={"hidden_tests/test_a.py": "import unittest\n"},
                      metadata={"relevant_files": "pkg/a.py, ./pkg/b.py"})
    self.assertEqual(behaviour.relevant_files(task), ("pkg/a.py", "pkg/b.py"))
    write = _call("write_file", path="pkg/a.py", content="x = 2\n")

    def facts(look, tool, task):
      return _facts(_episode([(look, _block(tool, "...")), (write, _block("write_file", "w")), (FINISH, None)]),
                    task)

    readme = _call("read_file", path="README.md")
    self.assertIs(facts(readme, "read_file", task).read_before_edit, False)  # not a relevant file
    self.assertIs(facts(readme, "read_file", None).read_before_edit, True)  # any look, without the task
    self.assertIs(facts(_call("read_file", path="/work/pkg/b.py"), "read_file", task).read_before_edit, True)
    grep = _call("grep", pattern="x", path="pkg/a.py")
    self.assertIs(facts(grep, "grep", task).read_before_edit, False)  # declared files: only their reads count
    self.assertEqual(facts(grep, "grep", task).relevant_files, ("pkg/a.py", "pkg/b.py"))
    plain = dataclasses.replace(task, metadata={"suite": "x"})
    self.assertEqual(behaviour.relevant_files(plain), ())
    self.assertIs(facts(grep, "grep", plain).read_before_edit, True)

  @parameterized.parameters(
      ("python3 -m unittest -q", True), ("python -m pytest -x tests", True), ("pytest", True),
      ("cd pkg && python3 -m unittest discover -s tests", True), ("python3 test_util.py", True),
      ("python3 -I tests/util_test.py -v", True), ("py.test -q", True),
      ("ls -R", False), ("python3 -m py_compile util.py", False), ("cat test_util.py", False),
      ("echo unittests", False), ("grep -r pytest_plugins .", False), ("python3 util.py", False))
  def test_is_test_command(self, command, want):
    self.assertEqual(behaviour.is_test_command(command), want)


class SummarizeTest(absltest.TestCase):

  def test_denominators(self):
    cut = _episode([(READ, _block("read_file", "s")), (RUN, None)], end=EpisodeEnd.TURN_BUDGET)
    b = [_facts(_episode(e)) for e in (GOOD, BLIND, READER)] + [_facts(cut)]
    m = behaviour.summarize(b)
    self.assertEqual(m["behaviour/episodes"], 4.0)
    self.assertEqual(m["behaviour/episodes_with_edit"], 2.0)  # GOOD and BLIND
    self.assertEqual(m["behaviour/edit_fraction"], 0.5)
    self.assertEqual(m["behaviour/read_before_edit"], 0.5)
    self.assertEqual(m["behaviour/episodes_finished"], 3.0)  # the cut one never called finish
    self.assertAlmostEqual(m["behaviour/tests_before_finish"], 1 / 3)
    self.assertEqual(m["behaviour/episodes_with_failing_tests"], 1.0)
    self.assertEqual(m["behaviour/recovery_after_failing_tests"], 1.0)
    self.assertEqual(m["behaviour/turns_per_episode"], (6 + 1 + 2 + 2) / 4)
    self.assertEqual(m["behaviour/cut_fraction"], 0.25)
    self.assertEqual(m["behaviour/tokens_per_episode"], np.mean([x.tokens for x in b]))

  def test_no_edits_no_tests_no_calls(self):
    m = behaviour.summarize([_facts(_episode([("I am not sure what to do.", None)], EpisodeEnd.TURN_BUDGET))])
    for name in ("behaviour/read_before_edit", "behaviour/tests_before_finish",
                 "behaviour/recovery_after_failing_tests", "behaviour/malformed_call_rate"):
      self.assertTrue(math.isnan(m[name]), name)
    self.assertEqual((m["behaviour/episodes_with_edit"], m["behaviour/calls_per_episode"]), (0.0, 0.0))
    self.assertEqual(m["behaviour/edit_fraction"], 0.0)

  def test_every_name_even_without_episodes(self):
    m = behaviour.summarize([])
    self.assertEqual(tuple(m), behaviour.METRICS)
    self.assertEqual(m["behaviour/episodes"], 0.0)
    self.assertTrue(all(math.isnan(v) for k, v in m.items() if k != "behaviour/episodes"
                        and not k.startswith("behaviour/episodes_")))


# A task short enough that its episode fits a 1024-position slot: its repository has its own test (t.py), the hidden
# one wants f() == 1 too.
TASK = CodingTask(task_id="behaviour/f", prompt="Make f return 1.",
                  files={"a.py": "def f():\n    return 0\n",
                         "t.py": "import unittest\nfrom a import f\n\n\nclass T(unittest.TestCase):\n\n"
                                 "  def test_f(self):\n    self.assertEqual(f(), 1)\n"},
                  hidden_tests={"hidden_tests/test_a.py": "import unittest\nfrom a import f\n\n\nclass T(unittest."
                                "TestCase):\n\n  def test_f(self):\n    self.assertEqual(f(), 1)\n"},
                  solution={"a.py": "def f():\n    return 1\n"})
ENV = EnvConfig(max_turns=6, instructions=HelpDetail.NONE)
OWN_TESTS = "python3 -m unittest -q t 2>/dev/null"
SCRIPT = [
    _call("read_file", path="a.py"),
    _call("run", command=OWN_TESTS),
    _call("edit", path="a.py", search="return 0", replace="return 1") + "\n" + _call("run", command=OWN_TESTS),
    FINISH,
]


@functools.cache
def _runner() -> AgentRunner:
  # One layer (dense) and one slot with one append bucket: the fewest programs to compile; the forced turns and
  # the ledger are what is under test, not the model.
  model = tiny.BYTES.replace(n_layers=1)
  engine = EngineConfig(slots=1, context=1024, chunk_sizes=(256,), max_forced=256)
  agent = AgentConfig(max_turns=6, max_turn_tokens=256, max_episode_tokens=1000, chunk_steps=32, tool_workers=1)
  return AgentRunner(model, engine, tiny.ENGINE_SAMPLING, agent, TOK)


class RealEpisodeTest(absltest.TestCase):

  @pytest.mark.slow
  def test_a_scripted_episode_through_the_agent_loop(self):
    # Real tools in the sandbox: read, run the tests (they fail), fix and run them again (they pass), finish.
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    runner = _runner()
    prompt = TOK.encode(first_observation(TASK, ENV, sorted(TASK.files)), bos=True, eos=False)
    episode = Episode(prompt=prompt, make_env=lambda: CodingAgentEnv(TASK, ENV), key=0,
                      script=lambda turn, observations: SCRIPT[turn])
    (traj,) = runner.run([episode], weights=lambda: (tiny.params(runner.model), 0))
    self.assertEqual(traj.end, EpisodeEnd.FINISHED)
    self.assertEqual(traj.reward_terms["outcome"], 1.0)
    model_turns, _ = behaviour.turns(traj, TOK)
    self.assertEqual([t.text for t in model_turns], SCRIPT)
    self.assertEqual(behaviour.run_status(model_turns[1].calls[0]), behaviour.RunStatus.FAILING)
    self.assertEqual(behaviour.run_status(model_turns[2].calls[1]), behaviour.RunStatus.PASSING)
    b = _facts(traj, TASK)
    self.assertEqual(b, EpisodeBehaviour(
        turns=4, summaries=0, segments=1, tokens=_model_tokens(*SCRIPT), calls=5, malformed_calls=0,
        incomplete_turns=0, edits=1, looks=1, test_runs=2, passing_test_runs=1, failing_test_runs=1,
        relevant_files=(), read_before_edit=True, finished=True, tests_before_finish=True, recovered=True,
        end=EpisodeEnd.FINISHED))


if __name__ == "__main__":
  absltest.main()
