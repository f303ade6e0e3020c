"""The instruction-following checks: each kind of constraint holds on the starting repository and on a faithful
change, and breaks on the change it forbids; malformed constraints are refused in one sentence."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.grading import constraints as checks
from c2jax.envs.tasks import constraints
from c2jax.envs.tasks.coding_tasks import CodingTask, TaskFormatError
from c2jax.envs.tasks.constraints import Constraint, Kind, Style

_API = "def f(a, b=1, *, c):\n    return a\n\n\nclass K:\n    pass\n"
_STYLED = 'def g(x: int) -> int:\n    """Doc."""\n    return x\n'
_START = {"api.py": _API, "config.py": "X = 1\n", "style.py": _STYLED}


def _task(*cs: Constraint) -> CodingTask:
  return CodingTask(task_id="t", prompt="p", files=_START, hidden_tests={"hidden_tests/test_t.py": ""},
                    metadata={constraints.METADATA_KEY: constraints.encode(cs)})


class ConstraintsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("untouched_changed", Constraint(Kind.UNTOUCHED, paths=("config.py",)), {"config.py": "X = 2\n"}),
      ("untouched_deleted", Constraint(Kind.UNTOUCHED, paths=("config.py",)), {"config.py": None}),
      ("api_renamed", Constraint(Kind.KEEP_API, paths=("api.py",), names=("f",)),
       {"api.py": "def g(a, b=1, *, c):\n    return a\n"}),
      ("api_parameter_dropped", Constraint(Kind.KEEP_API, paths=("api.py",), names=("f",)),
       {"api.py": "def f(a, *, c):\n    return a\n"}),
      ("api_default_dropped", Constraint(Kind.KEEP_API, paths=("api.py",), names=("f",)),
       {"api.py": "def f(a, b, *, c):\n    return a\n"}),
      ("api_class_gone", Constraint(Kind.KEEP_API, paths=("api.py",), names=("K",)), {"api.py": "K = 1\n"}),
      ("api_unparsable", Constraint(Kind.KEEP_API, paths=("api.py",), names=("f",)), {"api.py": "def f(:\n"}),
      ("unannotated", Constraint(Kind.STYLE, paths=("style.py",), style=Style.ANNOTATED),
       {"style.py": _START["style.py"] + "\n\ndef h(y: int):\n    \"\"\"Doc.\"\"\"\n    return y\n"}),
      ("printing", Constraint(Kind.STYLE, paths=("style.py",), style=Style.NO_PRINT),
       {"style.py": _START["style.py"] + "\n\nprint(1)\n"}),
      ("undocumented", Constraint(Kind.STYLE, paths=("style.py",), style=Style.DOCSTRINGS),
       {"style.py": _START["style.py"] + "\n\nclass C:\n    pass\n"}),
  )
  def test_breaks(self, constraint, change):
    task = _task(constraint)
    self.assertEqual(checks.constraint_terms(task, task.files),
                     {"constraint_violations": 0.0, "constraints_total": 1.0})
    after = {p: c for p, c in {**task.files, **change}.items() if c is not None}
    self.assertEqual(checks.constraint_terms(task, after)["constraint_violations"], 1.0)

  def test_faithful_changes_hold(self):
    task = _task(Constraint(Kind.UNTOUCHED, paths=("config.py",)),
                 Constraint(Kind.KEEP_API, paths=("api.py",), names=("f", "K")),
                 Constraint(Kind.STYLE, paths=("style.py",), style=Style.ANNOTATED))
    after = {**task.files,
             # a new default value, a new body, a new function: the interface is what callers see
             "api.py": "def f(a, b=2, *, c):\n    return a + b\n\n\nclass K:\n    x = 1\n\n\ndef new():\n    pass\n",
             "style.py": _START["style.py"] + "\n\nclass C:\n    def m(self, y: int) -> int:\n        return y\n"}
    self.assertEqual(checks.constraint_terms(task, after), {"constraint_violations": 0.0, "constraints_total": 3.0})

  def test_a_task_without_constraints_has_no_terms(self):
    task = dataclasses.replace(_task(), metadata={})
    self.assertEqual(checks.constraint_terms(task, task.files), {})

  def test_round_trip(self):
    cs = (Constraint(Kind.UNTOUCHED, paths=("a.py", "b.py")), Constraint(Kind.KEEP_API, paths=("c.py",), names=("f",)),
          Constraint(Kind.STYLE, paths=("d.py",), style=Style.NO_PRINT))
    self.assertEqual(constraints.task_constraints(_task(*cs)), cs)

  @parameterized.parameters(
      ('[{"kind": "frozen", "paths": ["a.py"]}]', "kind"),
      ('[{"kind": "untouched", "paths": "a.py"}]', "paths"),
      ('[{"kind": "untouched", "paths": ["../a.py"]}]', "inside the repository"),
      ('[{"kind": "keep_api", "names": ["f"]}]', "path"),
      ('[{"kind": "style", "paths": ["a.py"], "style": "pep8"}]', "style"),
      ('{"kind": "untouched"}', "JSON list"),
      ("not json", "JSON list"),
  )
  def test_malformed_is_refused(self, text, names):
    task = dataclasses.replace(_task(), metadata={constraints.METADATA_KEY: text})
    with self.assertRaisesRegex(TaskFormatError, names):
      constraints.task_constraints(task)


if __name__ == "__main__":
  absltest.main()
