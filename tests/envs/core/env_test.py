"""The coding environment over the real bubblewrap sandbox: tools, budgets, errors as observations, counting of
malformed and incomplete calls, and a reward delegated to the hidden tests."""

import random
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.core import env as env_lib
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tools import web_search
from c2jax.envs.tasks.coding_tasks import Category, CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig, clip
from c2jax.envs.tools.protocol import ToolCall, ToolName, render
from tests.envs.tools.protocol_test import fuzz_text

BUGGY = "def add(a, b):\n  return a - b\n\n\ndef twice(x):\n  return x + x\n"
FIXED = BUGGY.replace("a - b", "a + b")
HIDDEN = ("import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n\n"
          "  def test_add(self):\n    self.assertEqual(add(2, 3), 5)\n\n"
          "  def test_zero(self):\n    self.assertEqual(add(0, 0), 0)\n")

TASK = CodingTask(
    task_id="calc_add", prompt="add() subtracts; make it add.", category=Category.DEBUGGING,
    files={"calc.py": BUGGY, "tests/__init__.py": "", "tests/test_calc.py": HIDDEN.replace("(2, 3), 5", "(1, 1), 2")},
    hidden_tests={"hidden_tests/__init__.py": "", "hidden_tests/test_hidden.py": HIDDEN + "# SECRET-MARKER\n"},
    solution={"calc.py": FIXED})


# A web_search backend for the fuzzed turns: the default one would build its documentation index in the user's cache.
ECHO_BACKEND = "env_test_echo"
if ECHO_BACKEND not in web_search.WEB_SEARCH_BACKENDS:
  web_search.WEB_SEARCH_BACKENDS.register(ECHO_BACKEND)(
      lambda: mock.Mock(search=lambda query, k: [web_search.SearchResult(query, "echo", query)] * k))


def text(*calls):
  return "\n".join(render(c) for c in calls)


def call(name, **args):
  return ToolCall(ToolName(name), args)


class WithoutTimingsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("unittest", "Ran 3 tests in 0.004s\n\nOK\nRan 1 test in 12.5s\nin 0.5s",
       "Ran 3 tests in 0.000s\n\nOK\nRan 1 test in 0.000s\nin 0.5s"),
      ("pytest", "==== 1 failed, 2 passed in 0.13s ====\n3 passed, 1 warning in 61.20s (0:01:01)\nslept in 2s",
       "==== 1 failed, 2 passed in 0.00s ====\n3 passed, 1 warning in 0.00s\nslept in 2s"),
      ("other_durations_kept", "took 0.004s\nRan the job in 3.1s", "took 0.004s\nRan the job in 3.1s"),
  )
  def test_only_the_test_runners_times_are_rewritten(self, output, expected):
    self.assertEqual(env_lib.without_timings(output), expected)


class EnvTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    try:
      sandbox_lib.check_available()
    except sandbox_lib.SandboxUnavailable as e:
      self.skipTest(str(e))

  def env(self, **config):
    env = CodingEnv(EnvConfig(**config))
    self.addCleanup(env.close)
    return env

  def test_first_observation_shows_prompt_files_and_format_but_not_hidden_tests(self):
    obs = self.env().reset(TASK)
    self.assertIn(TASK.prompt, obs)
    self.assertIn("calc.py", obs)
    self.assertIn("tests/test_calc.py", obs)
    self.assertIn('<tool name="finish"/>', obs)
    self.assertNotIn("SECRET-MARKER", obs)
    self.assertNotIn("hidden_tests", obs)

  def test_fix_and_finish_passes_the_hidden_tests(self):
    env = self.env()
    env.reset(TASK)
    r = env.step("Let me look.\n" + text(call("read_file", path="calc.py"), call("grep", pattern=r"a [-+] b")))
    self.assertFalse(r.done)
    self.assertIn(BUGGY, r.observation)
    self.assertIn("calc.py:2:  return a - b", r.observation)
    self.assertNotIn("hidden", r.observation)
    r = env.step(text(call("edit", path="calc.py", search="a - b", replace="a + b"),
                      call("run", command="python3 -m unittest discover -s tests -t . 2>&1 | tail -1")))
    self.assertIn("edited calc.py at line 2", r.observation)
    self.assertIn("OK", r.observation)
    r = env.step(text(call("finish")))
    self.assertTrue(r.done)
    self.assertEqual(r.info["done_reason"], "finish")
    self.assertEqual(r.info["tool_calls"], 5)
    terms = env.reward()
    self.assertEqual(terms["passed"], 1.0)
    self.assertEqual(terms["pass_fraction"], 1.0)
    self.assertEqual(terms["tests_total"], 2.0)
    self.assertEqual(terms["malformed_tool_calls"], 0.0)
    self.assertEqual(terms["turns"], 3.0)
    self.assertEqual(env.reward(), terms)  # cached after done

  @parameterized.named_parameters(
      ("finish_only", text(call("finish"))),
      # Deleting the visible tests and the hidden tests' directory does not help: the hidden tests judge.
      ("delete_tests", text(call("run", command="rm -rf tests hidden_tests"), call("finish"))),
      ("break_tests", text(call("write_file", path="hidden_tests/test_hidden.py", content="pass\n"),
                           call("finish"))),
  )
  def test_policies_that_do_not_fix_the_bug_fail(self, turn):
    env = self.env()
    env.reset(TASK)
    self.assertTrue(env.step(turn).done)
    terms = env.reward()
    self.assertEqual(terms["passed"], 0.0)
    self.assertLess(terms["pass_fraction"], 1.0)

  def test_tool_errors_are_observations(self):
    env = self.env()
    env.reset(TASK)
    r = env.step(text(
        call("read_file", path="missing.py"),
        call("read_file", path="../../etc/passwd"),
        call("read_file", path="/etc/passwd"),
        call("edit", path="calc.py", search="nowhere", replace="x"),
        call("edit", path="calc.py", search="return", replace="yield"),
        call("edit", path="missing.py", search="a", replace="b"),
        call("grep", pattern="(unclosed"),
        call("grep", pattern="x", path="nope"),
        call("grep", pattern="zzz_no_such_text"),
        call("run", command="exit 3"),
    ))
    self.assertFalse(r.done)
    self.assertEqual(r.info["step_tool_calls"], 10)
    self.assertEqual(r.info["step_tool_errors"], 8)  # "no matches" and a failing command are results, not errors
    self.assertEqual(r.info["step_malformed_tool_calls"], 0)
    obs = r.observation
    self.assertIn("missing.py", obs)
    self.assertIn("outside the repository", obs)
    self.assertIn("not in calc.py", obs)
    self.assertIn("occurs 2 times", obs)
    self.assertIn("bad regex", obs)
    self.assertIn("no matches", obs)
    self.assertIn("exit code 3", obs)
    self.assertNotIn("root:", obs)  # the host's /etc/passwd
    self.assertNotIn("/tmp/", obs)  # host paths of the workdir stay hidden
    self.assertEqual(env._sandbox.read_file("calc.py"), BUGGY)  # failed edits change nothing

  def test_symlink_escape_is_refused(self):
    env = self.env()
    env.reset(TASK)
    r = env.step(text(call("run", command="ln -s /etc/passwd leak && ln -s / root"),
                      call("read_file", path="leak"), call("read_file", path="root/etc/passwd"),
                      call("write_file", path="root/tmp/pwned", content="x"),
                      call("edit", path="leak", search="root", replace="x")))
    self.assertEqual(r.info["step_tool_errors"], 4)
    self.assertNotIn("root:x:0", r.observation)

  def test_write_read_and_grep_in_subdirectories(self):
    env = self.env()
    env.reset(TASK)
    content = "<tool name=\"x\"> and </arg> inside a file\nline two\n"
    r = env.step(text(call("write_file", path="pkg/sub/new.py", content=content),
                      call("read_file", path="./pkg/sub/new.py"),
                      call("grep", pattern="line t", path="/work/pkg"),
                      call("grep", pattern="inside", path="pkg/sub/new.py")))
    self.assertEqual(r.info["step_tool_errors"], 0, r.observation)
    self.assertIn(content, r.observation)
    self.assertIn("pkg/sub/new.py:2:line two", r.observation)
    self.assertIn("pkg/sub/new.py:1:", r.observation)

  def test_grep_ignores_repository_modules_named_like_the_stdlib(self):
    env = self.env()
    shadows = {"json.py": "import sys\nsys.exit(1)\n", "re.py": "raise SystemExit(3)\n", "os.py": "x = 1\n"}
    env.reset(CodingTask(task_id="shadow", prompt="p", files={**TASK.files, **shadows}, hidden_tests=TASK.hidden_tests))
    r = env.step(text(call("grep", pattern=r"a [-+] b"), call("grep", pattern="zzz_no_such_text")))
    self.assertEqual(r.info["step_tool_errors"], 0, r.observation)
    self.assertIn("calc.py:2:  return a - b", r.observation)
    self.assertIn("no matches.", r.observation)

  def test_a_crashing_grep_is_an_error_not_no_matches(self):
    env = self.env()
    env.reset(TASK)
    for script in ("import sys\nsys.exit(1)\n", "raise RuntimeError('boom')\n"):
      with mock.patch.object(env_lib, "_GREP_SCRIPT", script):
        r = env.step(text(call("grep", pattern="x")))
      self.assertEqual(r.info["step_tool_errors"], 1, r.observation)
      self.assertNotIn("no matches", r.observation)
      self.assertIn("grep failed (exit code 1)", r.observation)

  def test_fifos_are_refused_not_waited_for(self):
    env = self.env()
    env.reset(TASK)
    start = time.monotonic()
    r = env.step(text(call("run", command="mkfifo pipe"), call("read_file", path="pipe"),
                      call("write_file", path="pipe", content="x"),
                      call("edit", path="pipe", search="a", replace="b"), call("grep", pattern="x", path="pipe"),
                      call("grep", pattern="return")))
    self.assertLess(time.monotonic() - start, 5.0)
    self.assertEqual(r.info["step_tool_errors"], 3, r.observation)
    self.assertEqual(r.observation.count("not a regular file"), 3)
    self.assertIn("calc.py:2:", r.observation)  # grep over the repository skips the FIFO

  @parameterized.named_parameters(
      ("entries", dict(max_workdir_entries=50), "mkdir d && for i in $(seq 100); do : > d/f$i; done"),
      ("bytes", dict(max_workdir_bytes=100_000), "head -c 200000 /dev/zero > big.bin"),
  )
  def test_a_workdir_past_its_caps_ends_the_episode_ungraded(self, caps, command):
    made = []

    def factory(files, limits):
      made.append(files)
      return sandbox_lib.Sandbox(files, limits)

    env = CodingEnv(EnvConfig(**caps), sandbox_factory=factory)
    self.addCleanup(env.close)
    env.reset(TASK)
    r = env.step(text(call("write_file", path="calc.py", content=FIXED), call("run", command=command),
                      call("read_file", path="calc.py")))
    self.assertTrue(r.done)
    self.assertEqual(r.info["done_reason"], "workdir_limit")
    self.assertEqual(r.info["step_tool_calls"], 2)  # nothing runs after the cap was found crossed
    self.assertIn("scores 0", r.observation)
    terms = env.reward()
    self.assertEqual((terms["passed"], terms["pass_fraction"], terms["workdir_limit"]), (0.0, 0.0, 1.0))
    self.assertLen(made, 1)  # no judge sandbox: the oversized repository was never copied or read

  def test_the_episode_tool_time_budget(self):
    env = self.env(max_tool_s=1.0, limits=sandbox_lib.SandboxLimits(wall_s=5.0, cpu_s=5))
    env.reset(TASK)
    start = time.monotonic()
    r = env.step(text(call("run", command="sleep 3"), call("read_file", path="calc.py")))
    self.assertLess(time.monotonic() - start, 3.0)  # the command's timeout was cut to the budget left
    self.assertTrue(r.done)
    self.assertEqual(r.info["done_reason"], "time_budget")
    self.assertIn("timed out", r.observation)
    self.assertIn("tool time are spent; 1 tool call(s) were not run", r.observation)
    self.assertGreaterEqual(r.info["tool_seconds"], 1.0)
    self.assertEqual(env.reward()["passed"], 0.0)  # graded as it stands

  def test_pathological_regex_meets_the_sandbox_timeout(self):
    env = self.env(limits=sandbox_lib.SandboxLimits(wall_s=1.0, cpu_s=2))
    env.reset(CodingTask(task_id="redos", prompt="p", files={"a.txt": "a" * 40 + "b\n"},
                         hidden_tests={"hidden_tests/test_x.py": "pass\n"}))
    r = env.step(text(call("grep", pattern="^(a+)+$")))
    self.assertIn("timed out", r.observation)
    self.assertEqual(r.info["step_tool_errors"], 1)

  def test_malformed_and_incomplete_calls_are_counted(self):
    env = self.env()
    env.reset(TASK)
    r = env.step('<tool name="delete"></tool> <tool name="run"></tool> ' + text(call("read_file", path="calc.py")) +
                 '\n<tool name="edit"><arg name="path">calc.py</arg><arg name="search">a - b')
    self.assertFalse(r.done)
    self.assertEqual(r.info["step_tool_calls"], 1)
    self.assertEqual(r.info["step_malformed_tool_calls"], 3)
    self.assertEqual(r.info["step_incomplete_tool_calls"], 1)
    self.assertIn("unknown tool 'delete'", r.observation)
    self.assertIn("missing argument 'command'", r.observation)
    self.assertIn("incomplete tool call 'edit'", r.observation)
    self.assertIn(BUGGY, r.observation)  # the well-formed call between them still ran
    r = env.step("no tools at all")
    self.assertIn("no tool call found", r.observation)
    self.assertEqual(r.info["malformed_tool_calls"], 3)
    r = env.step("</tool>" + text(call("finish")))
    self.assertTrue(r.done)
    self.assertEqual(r.info["malformed_tool_calls"], 4)
    terms = env.reward()
    self.assertEqual(terms["malformed_tool_calls"], 4.0)
    self.assertEqual(terms["incomplete_tool_calls"], 1.0)

  def test_turn_budget(self):
    env = self.env(max_turns=2)
    env.reset(TASK)
    self.assertFalse(env.step("thinking").done)
    r = env.step(text(call("read_file", path="calc.py")))
    self.assertTrue(r.done)
    self.assertEqual(r.info["done_reason"], "turn_budget")
    self.assertIn(BUGGY, r.observation)  # the last turn's calls still ran
    r = env.step(text(call("write_file", path="x.py", content="x")))
    self.assertTrue(r.done)
    self.assertNotIn("x.py", env._sandbox.list_files())  # nothing runs after the end

  def test_token_budget_with_default_and_given_counters(self):
    env = self.env(max_tokens=100)
    env.reset(TASK)
    self.assertFalse(env.step("x" * 396).done)  # 99 tokens at 4 bytes each
    r = env.step("y" * 4)
    self.assertTrue(r.done)
    self.assertEqual((r.info["done_reason"], r.info["tokens"]), ("token_budget", 100))
    words = CodingEnv(EnvConfig(max_tokens=3), token_counter=lambda s: len(s.split()))
    self.addCleanup(words.close)
    words.reset(TASK)
    self.assertFalse(words.step("one two").done)
    self.assertTrue(words.step("three").done)

  def test_calls_after_finish_and_beyond_the_per_turn_limit_do_not_run(self):
    env = self.env(max_calls_per_turn=2)
    env.reset(TASK)
    r = env.step(text(*[call("write_file", path=f"f{i}.py", content="") for i in range(3)]))
    self.assertIn("only the first 2", r.observation)
    self.assertEqual(r.info["step_tool_calls"], 2)
    r = env.step(text(call("finish"), call("write_file", path="late.py", content="x")))
    self.assertTrue(r.done)
    self.assertIn("after finish were not run", r.observation)
    self.assertEqual(sorted(p for p in env._sandbox.list_files() if p.startswith(("f", "late"))), ["f0.py", "f1.py"])

  def test_observations_are_clipped(self):
    env = self.env(max_observation_bytes=2000)
    env.reset(TASK)
    r = env.step(text(call("run", command="python3 -c \"print('z' * 100000)\""), call("read_file", path="calc.py")))
    self.assertLess(len(r.observation.encode()), 2300)
    self.assertIn("bytes cut", r.observation)
    self.assertIn("return a - b", r.observation)  # the tail, where the last result is, survives
    self.assertEqual(clip("short", 10), "short")

  def test_fuzzed_turns_never_raise(self):
    env = self.env(max_turns=1000, web_search_backend=ECHO_BACKEND)
    env.reset(TASK)
    rng = random.Random(3)
    for _ in range(60):
      r = env.step(fuzz_text(rng))
      self.assertIsInstance(r.observation, str)
    self.assertIsInstance(env.step(None).observation, str)  # pytype: disable=wrong-arg-types

  def test_sandbox_factory_serves_the_episode_and_the_judge(self):
    made = []

    def factory(files, limits):
      made.append(sorted(files))
      return sandbox_lib.Sandbox(files, limits)

    env = CodingEnv(sandbox_factory=factory)
    self.addCleanup(env.close)
    env.reset(TASK)
    env.step(text(call("write_file", path="calc.py", content=FIXED), call("finish")))
    self.assertEqual(env.reward()["passed"], 1.0)
    self.assertLen(made, 2)
    self.assertNotIn("hidden_tests/test_hidden.py", made[0])  # the episode never holds the hidden tests
    # Nor does the judge's sandbox on disk: the judge gets the hidden tests on its stdin
    # (c2jax/envs/grading/grading.py).
    self.assertNotIn("hidden_tests/test_hidden.py", made[1])
    self.assertIn("calc.py", made[1])

  def test_a_test_runs_duration_is_not_in_the_observation(self):
    env = self.env()
    env.reset(TASK)
    slow = "import time, unittest\n\n\nclass S(unittest.TestCase):\n\n  def test_sleep(self):\n    time.sleep(0.02)\n"
    env.step(text(call("write_file", path="tests/test_slow.py", content=slow)))
    run = text(call("run", command="python3 -m unittest tests.test_slow"))
    first, second = env.step(run).observation, env.step(run).observation
    self.assertIn("Ran 1 test in 0.000s", first)  # it slept 0.02 s: unittest itself printed 0.02s or more
    result = lambda observation: observation.split("</result>")[0]  # the budget line after it counts turns
    self.assertEqual(result(first), result(second))  # the same action, the same tool result

  def test_misuse_and_lifetime(self):
    env = CodingEnv()
    env.close()  # before reset: fine
    with self.assertRaises(RuntimeError):
      env.step("x")
    with self.assertRaises(RuntimeError):
      env.reward()
    env.reset(TASK)
    workdir = env._sandbox.workdir
    env.reset(TASK)  # a second reset starts afresh and drops the first sandbox
    self.assertFalse(workdir.exists())
    env.close()
    env.close()


if __name__ == "__main__":
  absltest.main()
