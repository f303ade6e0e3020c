'''The "intent" suite: under-specified prompts whose hidden tests check the reasonable reading (CursorBench's
complementary evaluations, report section 5). Each prompt leaves a detail unsaid that a careful engineer settles from
the request's purpose or the repository's own conventions (a docstring, a neighbouring function); the hidden tests
check that reading, and nothing incidental (the exact text of a message, a formatting choice the prompt leaves open).

  tasks = CODING_SUITES.get("intent").tasks("heldout")    # all of them; "train" is empty

Each task's shortcut (`c2jax.envs.tasks.shortcuts`, what the `shortcut` scripted policy writes) implements the
prompt's most literal reading, which the hidden tests reject: the reference scores 1.0, the shortcut 0.0. The
evaluation's score is the pass rate of the tasks tagged "intent" (`c2jax.eval.harness.COMPLEMENTARY`).
'''

from __future__ import annotations


from c2jax.envs.tasks.coding_tasks import CODING_SUITES, Category, CodingTask
from c2jax.envs.tasks.suites.inline import HeldOutSuite, inline_task

EVALUATION = "intent"
SUITE = "intent"


def _task(task_id: str, prompt: str, path: str, start: str, reference: str, literal: str, tests: str,
          category: Category = Category.FEATURE) -> CodingTask:
  """A one-file task: `path` holds `start`; the reference and the literal reading each replace it whole."""
  return inline_task(SUITE, task_id, prompt, files={path: start}, tests=tests, solution={path: reference},
                     shortcut={path: literal}, evaluation=EVALUATION, category=category)


_UNIQUE = _task(
    "unique_items", "Make `unique(items)` in listutil.py remove duplicates.", "listutil.py",
    '''def unique(items):
    """The items of `items`, as a list."""
    return list(items)
''',
    '''def unique(items):
    """The items of `items` without repeats, as a list in the order they first appear."""
    seen = set()
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
''',
    '''def unique(items):
    """The items of `items` without repeats, as a list."""
    return list(set(items))
''',
    '''import unittest

from listutil import unique


class UniqueTest(unittest.TestCase):

    def test_keeps_first_occurrences_in_order(self):
        self.assertEqual(unique([3, 1, 3, 2, 1]), [3, 1, 2])

    def test_strings(self):
        self.assertEqual(unique(["b", "a", "b"]), ["b", "a"])
''')

_NAMES = _task(
    "sorted_names", "`sorted_names(names)` in people.py should sort people's names alphabetically.", "people.py",
    '''def sorted_names(names):
    """`names` as a list."""
    return list(names)
''',
    '''def sorted_names(names):
    """`names` in alphabetical order, whatever their case."""
    return sorted(names, key=str.casefold)
''',
    '''def sorted_names(names):
    """`names` sorted."""
    return sorted(names)
''',
    '''import unittest

from people import sorted_names


class SortedNamesTest(unittest.TestCase):

    def test_case_does_not_decide_the_order(self):
        self.assertEqual(sorted_names(["bob", "alice", "Carol"]), ["alice", "bob", "Carol"])

    def test_already_capitalized(self):
        self.assertEqual(sorted_names(["Dan", "Bea"]), ["Bea", "Dan"])
''')

_PERCENT = _task(
    "as_percent", "`as_percent(ratio)` in fmt.py should show a ratio as a percentage.", "fmt.py",
    '''def as_money(amount):
    """`amount` with two decimals and its currency: as_money(3.5) == "3.50 EUR"."""
    return f"{amount:.2f} EUR"


def as_percent(ratio):
    """`ratio` as text."""
    return str(ratio)
''',
    '''def as_money(amount):
    """`amount` with two decimals and its currency: as_money(3.5) == "3.50 EUR"."""
    return f"{amount:.2f} EUR"


def as_percent(ratio):
    """`ratio` (0.25 for a quarter) as a percentage: as_percent(0.25) == "25%"."""
    return f"{ratio * 100:g}%"
''',
    '''def as_money(amount):
    """`amount` with two decimals and its currency: as_money(3.5) == "3.50 EUR"."""
    return f"{amount:.2f} EUR"


def as_percent(ratio):
    """`ratio` with a percent sign."""
    return f"{ratio}%"
''',
    '''import unittest

from fmt import as_percent


class AsPercentTest(unittest.TestCase):

    def test_a_quarter(self):
        self.assertEqual(float(as_percent(0.25).rstrip("%").strip()), 25.0)
        self.assertTrue(as_percent(0.25).endswith("%"))

    def test_whole(self):
        self.assertEqual(float(as_percent(1).rstrip("%").strip()), 100.0)
''')

_CLEAN = _task(
    "drop_empty_fields", "`clean(record)` in records.py should drop the empty fields of a record.", "records.py",
    '''def clean(record):
    """A copy of `record` (a dict of field -> value)."""
    return dict(record)
''',
    '''def clean(record):
    """A copy of `record` without its empty fields: None, "" and empty containers (0 and False are values)."""
    return {k: v for k, v in record.items() if not (v is None or (isinstance(v, (str, list, dict, tuple, set))
                                                                   and len(v) == 0))}
''',
    '''def clean(record):
    """A copy of `record` without its empty (falsy) fields."""
    return {k: v for k, v in record.items() if v}
''',
    '''import unittest

from records import clean


class CleanTest(unittest.TestCase):

    def test_drops_missing_values(self):
        self.assertEqual(clean({"name": "Ada", "email": None, "note": ""}), {"name": "Ada"})

    def test_keeps_zero_and_false(self):
        self.assertEqual(clean({"count": 0, "active": False, "tags": []}), {"count": 0, "active": False})
''')

_RANGES = '''"""Ranges in this module include both ends: 1..3 holds 1, 2 and 3."""


def span(lo, hi):
    """The integers of lo..hi."""
    return list(range(lo, hi + 1))
'''

_BETWEEN = _task(
    "between", "Add `between(x, lo, hi)` to ranges.py: whether x is between lo and hi.", "ranges.py", _RANGES,
    _RANGES + '''

def between(x, lo, hi):
    """Whether `x` lies in lo..hi (both ends included, as every range here)."""
    return lo <= x <= hi
''',
    _RANGES + '''

def between(x, lo, hi):
    """Whether `x` lies strictly between lo and hi."""
    return lo < x < hi
''',
    '''import unittest

from ranges import between


class BetweenTest(unittest.TestCase):

    def test_inside(self):
        self.assertTrue(between(2, 1, 3))

    def test_ends_are_inside(self):
        self.assertEqual([between(1, 1, 3), between(3, 1, 3)], [True, True])

    def test_outside(self):
        self.assertFalse(between(4, 1, 3))
''')

_INITIALS = _task(
    "initials", "`initials(name)` in names.py should return a person's initials.", "names.py",
    '''def initials(name):
    """The initials of `name`."""
    return ""
''',
    '''def initials(name):
    """The initials of `name`: the first letter of each of its words, upper-cased ("ada lovelace" -> "AL")."""
    return "".join(word[0].upper() for word in name.split())
''',
    '''def initials(name):
    """The first letters of the first and last words of `name`."""
    words = name.split()
    return words[0][0] + words[-1][0]
''',
    '''import unittest

from names import initials


class InitialsTest(unittest.TestCase):

    def test_two_words(self):
        self.assertEqual(initials("Ada Lovelace"), "AL")

    def test_every_word_upper_cased(self):
        self.assertEqual(initials("grace brewster hopper"), "GBH")
''')

TASKS = (_UNIQUE, _NAMES, _PERCENT, _CLEAN, _BETWEEN, _INITIALS)


INTENT = CODING_SUITES.register(SUITE)(HeldOutSuite(SUITE, TASKS))
