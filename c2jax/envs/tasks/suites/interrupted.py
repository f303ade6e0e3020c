'''The "interruptions" suite: interruption handling (CursorBench's complementary evaluations, report section 5). The
user changes the request while the agent works: each task's interruption (`c2jax.envs.tasks.interruptions`) is a
user message delivered after the agent's first turn, between turns or cutting that turn mid-way, and the hidden
tests check the final state the changed request asks for, which the prompt alone does not.

  tasks = CODING_SUITES.get("interruptions").tasks("heldout")    # all of them; "train" is empty

Each task's reference solution is the state after the interruption; its shortcut (`c2jax.envs.tasks.shortcuts`)
is the prompt's solution, what an agent that ignores the message leaves. The scripted policies
`follows_interruptions` (writes the shortcut, then the reference once the message shows in its observation) and
`ignores_interruptions` (writes the shortcut and finishes whatever it is told) score 1.0 and 0.0.
'''

from __future__ import annotations


from c2jax.envs.tasks import interruptions
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, Category, CodingTask
from c2jax.envs.tasks.interruptions import Interruption
from c2jax.envs.tasks.suites.inline import HeldOutSuite, inline_task

EVALUATION = "interruption"
SUITE = "interruptions"
# Mid-turn, the first turn is cut after this many tokens: inside a first tool call of a few hundred bytes.
_CUT = 48


def _task(task_id: str, prompt: str, message: str, mid_turn: bool, path: str, start: str, asked: str, changed: str,
          tests: str, category: Category = Category.FEATURE) -> CodingTask:
  """A one-file task: `path` holds `start`; `asked` is the prompt's solution (the shortcut), `changed` the one the
  interruption asks for (the reference)."""
  interruption = Interruption(turn=1, message=message, cut_tokens=_CUT if mid_turn else None)
  return inline_task(SUITE, task_id, prompt, files={path: start}, tests=tests, solution={path: changed},
                     shortcut={path: asked}, evaluation=EVALUATION, category=category,
                     metadata={interruptions.METADATA_KEY: interruptions.encode(interruption)})


_GREET = _task(
    "greeting", "Add `greet(name)` to greetings.py, returning \"Hello, <name>!\".",
    "Change of plan: `greet(name)` should return \"Hi <name>\", without punctuation.", False,
    "greetings.py", '"""Greetings."""\n',
    '''"""Greetings."""


def greet(name):
    return f"Hello, {name}!"
''',
    '''"""Greetings."""


def greet(name):
    return f"Hi {name}"
''',
    '''import unittest

from greetings import greet


class GreetTest(unittest.TestCase):

    def test_greets(self):
        self.assertEqual(greet("Ada"), "Hi Ada")

    def test_another_name(self):
        self.assertEqual(greet("Bob"), "Hi Bob")
''')

_ROUND = _task(
    "rounding", "Make `price(cents)` in money.py return the amount in euros as a float (1999 -> 19.99).",
    "Sorry, I was wrong: `price(cents)` should return the whole euros, rounded down, as an int (1999 -> 19).", False,
    "money.py", '''def price(cents):
    """The amount `cents` in euros."""
    raise NotImplementedError
''',
    '''def price(cents):
    """The amount `cents` in euros."""
    return cents / 100
''',
    '''def price(cents):
    """The amount `cents` in whole euros, rounded down."""
    return cents // 100
''',
    '''import unittest

from money import price


class PriceTest(unittest.TestCase):

    def test_whole_euros(self):
        self.assertEqual(price(1999), 19)

    def test_exact(self):
        self.assertEqual(price(500), 5)
''')

_SEPARATOR = _task(
    "separator", "Add `join_tags(tags)` to tags.py: the tags joined by commas (\"a,b\").",
    "Stop, use semicolons instead of commas: \"a;b\".", True,
    "tags.py", '"""Tag helpers."""\n',
    '''"""Tag helpers."""


def join_tags(tags):
    return ",".join(tags)
''',
    '''"""Tag helpers."""


def join_tags(tags):
    return ";".join(tags)
''',
    '''import unittest

from tags import join_tags


class JoinTagsTest(unittest.TestCase):

    def test_two(self):
        self.assertEqual(join_tags(["a", "b"]), "a;b")

    def test_one(self):
        self.assertEqual(join_tags(["x"]), "x")
''')

_ORDER = _task(
    "order", "Add `ranked(scores)` to ranking.py: the scores sorted from lowest to highest.",
    "Wait: ranked should sort from highest to lowest.", True,
    "ranking.py", '"""Rankings."""\n',
    '''"""Rankings."""


def ranked(scores):
    return sorted(scores)
''',
    '''"""Rankings."""


def ranked(scores):
    return sorted(scores, reverse=True)
''',
    '''import unittest

from ranking import ranked


class RankedTest(unittest.TestCase):

    def test_highest_first(self):
        self.assertEqual(ranked([2, 9, 4]), [9, 4, 2])
''')

TASKS = (_GREET, _ROUND, _SEPARATOR, _ORDER)


INTERRUPTIONS = CODING_SUITES.register(SUITE)(HeldOutSuite(SUITE, TASKS))
