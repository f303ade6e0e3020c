'''The "instructions" suite: instruction following (CursorBench's complementary evaluations, report section 5). Each
task's prompt states an explicit constraint beside the work (a file not to touch, an interface to keep, a style to
follow), which the grader checks on the submission (c2jax/envs/grading/constraints.py, from the task's metadata
"constraints"); the hidden tests check the work.

  tasks = CODING_SUITES.get("instructions").tasks("heldout")    # all of them; "train" is empty
  terms["instructions_followed"]    # 1.0 when the task passed and every constraint held

Each task's shortcut (`c2jax.envs.tasks.shortcuts`, what the `shortcut` scripted policy writes) passes the hidden
tests but breaks the stated constraint, as an agent that reads only the first half of the prompt would: the
evaluation scores the reference 1.0 and the shortcut 0.0, while pass@1 scores them alike.
'''

from __future__ import annotations


from c2jax.envs.tasks import constraints as constraints_lib
from c2jax.envs.tasks.constraints import Constraint, Kind, Style
from c2jax.envs.tasks.coding_tasks import CODING_SUITES, Category, CodingTask
from c2jax.envs.tasks.suites.inline import HeldOutSuite, inline_task

EVALUATION = "instruction_following"
SUITE = "instructions"


def _task(task_id: str, prompt: str, constraints: tuple[Constraint, ...], category: Category = Category.FEATURE,
          **kw) -> CodingTask:
  return inline_task(SUITE, task_id, prompt, evaluation=EVALUATION, category=category,
                     metadata={constraints_lib.METADATA_KEY: constraints_lib.encode(constraints)}, **kw)


_CONFIG = '''"""Settings shared by the shop's services."""

TAX_RATE = 0.2
CURRENCY = "EUR"
'''

_TAX_TOTAL = _task(
    "tax_total",
    "`total(prices)` in shop/pricing.py should add tax at shop/config.py's TAX_RATE and round to cents. Do not "
    "edit shop/config.py: other services read it.",
    (Constraint(Kind.UNTOUCHED, paths=("shop/config.py",)),),
    files={"shop/__init__.py": "", "shop/config.py": _CONFIG,
           "shop/pricing.py": '''from shop import config


def total(prices):
    """The sum of `prices`."""
    return sum(prices)
'''},
    tests='''import unittest

from shop.pricing import total


class TotalTest(unittest.TestCase):

    def test_adds_tax(self):
        self.assertEqual(total([10, 5]), 18.0)

    def test_rounds_to_cents(self):
        self.assertEqual(total([0.1, 0.2]), 0.36)

    def test_empty(self):
        self.assertEqual(total([]), 0.0)
''',
    solution={"shop/pricing.py": '''from shop import config


def total(prices):
    """The sum of `prices` with tax at config.TAX_RATE, rounded to cents."""
    return round(sum(prices) * (1 + config.TAX_RATE), 2)
'''},
    shortcut={"shop/config.py": _CONFIG + '''

def with_tax(amount):
    return round(amount * (1 + TAX_RATE), 2)
''', "shop/pricing.py": '''from shop import config


def total(prices):
    """The sum of `prices` with tax."""
    return config.with_tax(sum(prices))
'''},
)

_PAGES = _task(
    "page_count",
    "`pages(n_items, per_page)` in paging.py undercounts: 10 items at 3 per page make 4 pages. Fix it, and leave "
    "tests/test_paging.py as it is.",
    (Constraint(Kind.UNTOUCHED, paths=("tests/test_paging.py",)),),
    category=Category.DEBUGGING,
    files={"paging.py": '''def pages(n_items, per_page):
    """How many pages `n_items` fill at `per_page` items a page."""
    return n_items // per_page
''', "tests/__init__.py": "", "tests/test_paging.py": '''import unittest

from paging import pages


class PagesTest(unittest.TestCase):

    def test_full_pages(self):
        self.assertEqual(pages(9, 3), 3)
'''},
    tests='''import unittest

from paging import pages


class PagesTest(unittest.TestCase):

    def test_partial_page(self):
        self.assertEqual(pages(10, 3), 4)

    def test_full_pages(self):
        self.assertEqual(pages(9, 3), 3)

    def test_one_item(self):
        self.assertEqual(pages(1, 50), 1)

    def test_none(self):
        self.assertEqual(pages(0, 3), 0)
''',
    solution={"paging.py": '''def pages(n_items, per_page):
    """How many pages `n_items` fill at `per_page` items a page (a partial page counts)."""
    return -(-n_items // per_page)
'''},
    shortcut={"paging.py": '''import math


def pages(n_items, per_page):
    """How many pages `n_items` fill at `per_page` items a page (a partial page counts)."""
    return math.ceil(n_items / per_page)
''', "tests/test_paging.py": '''import unittest

from paging import pages


class PagesTest(unittest.TestCase):

    def test_full_pages(self):
        self.assertEqual(pages(9, 3), 3)

    def test_partial_page(self):
        self.assertEqual(pages(10, 3), 4)
'''},
)

_DURATION = '''_UNITS = {"s": 1, "m": 60}


def parse_duration(text, default_unit="s"):
    """Seconds in a duration such as "10s" or "5m"; a bare number is in `default_unit`."""
    text = text.strip()
    if text[-1].isdigit():
        return int(text) * _UNITS[default_unit]
    return int(text[:-1]) * _UNITS[text[-1]]
'''

_DURATION_TASK = _task(
    "duration_units",
    "Make `parse_duration` in timeparse.py understand hours (\"2h\") and days (\"1d\"). Keep its signature: code "
    "outside this repository calls it with `default_unit=`.",
    (Constraint(Kind.KEEP_API, paths=("timeparse.py",), names=("parse_duration",)),),
    files={"timeparse.py": _DURATION},
    tests='''import unittest

from timeparse import parse_duration


class ParseDurationTest(unittest.TestCase):

    def test_hours(self):
        self.assertEqual(parse_duration("2h"), 7200)

    def test_days(self):
        self.assertEqual(parse_duration("1d"), 86400)

    def test_seconds_and_minutes(self):
        self.assertEqual([parse_duration("10s"), parse_duration("5m")], [10, 300])
''',
    solution={"timeparse.py": _DURATION.replace('{"s": 1, "m": 60}', '{"s": 1, "m": 60, "h": 3600, "d": 86400}')},
    shortcut={"timeparse.py": '''_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text):
    """Seconds in a duration such as "10s", "5m", "2h" or "1d"."""
    text = text.strip()
    return int(text[:-1]) * _UNITS[text[-1]]
'''},
)

_STATS = '''def mean(xs: list[float]) -> float:
    """The arithmetic mean of `xs`."""
    return sum(xs) / len(xs)
'''

_MEDIAN = _task(
    "median_annotated",
    "Add `median(xs)` to stats.py: the middle value, or the mean of the two middle values for an even count. "
    "Follow the module's style: every function is type-annotated.",
    (Constraint(Kind.STYLE, paths=("stats.py",), style=Style.ANNOTATED),),
    files={"stats.py": _STATS},
    tests='''import unittest

from stats import median


class MedianTest(unittest.TestCase):

    def test_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)
''',
    solution={"stats.py": _STATS + '''

def median(xs: list[float]) -> float:
    """The middle value of `xs` (the mean of the two middle values for an even count)."""
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
'''},
    shortcut={"stats.py": _STATS + '''

def median(xs):
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
'''},
)

_INVENTORY = '''import logging

log = logging.getLogger(__name__)


def remove(stock, item, n):
    """Takes `n` of `item` out of `stock` (a dict of counts)."""
    stock[item] = stock.get(item, 0) - n
    log.info("removed %d %s", n, item)
'''

_OVERDRAW = "    stock[item] = stock.get(item, 0) - n"

_REMOVE = _task(
    "refuse_overdraw",
    "`remove` in inventory.py must refuse to take out more than is in stock: raise ValueError and leave the stock "
    "as it was. Report refusals through the module's logger; never print.",
    (Constraint(Kind.STYLE, paths=("inventory.py",), style=Style.NO_PRINT),),
    category=Category.DEBUGGING,
    files={"inventory.py": _INVENTORY},
    tests='''import unittest

from inventory import remove


class RemoveTest(unittest.TestCase):

    def test_refuses_overdraw(self):
        stock = {"apple": 2}
        with self.assertRaises(ValueError):
            remove(stock, "apple", 3)
        self.assertEqual(stock, {"apple": 2})

    def test_removes(self):
        stock = {"apple": 5}
        remove(stock, "apple", 3)
        self.assertEqual(stock, {"apple": 2})
''',
    solution={"inventory.py": _INVENTORY.replace(_OVERDRAW, '''    have = stock.get(item, 0)
    if n > have:
        log.warning("refused to remove %d %s: %d in stock", n, item, have)
        raise ValueError(f"cannot remove {n} {item}: {have} in stock")
    stock[item] = have - n''')},
    shortcut={"inventory.py": _INVENTORY.replace(_OVERDRAW, '''    have = stock.get(item, 0)
    if n > have:
        print(f"refused to remove {n} {item}: {have} in stock")
        raise ValueError(f"cannot remove {n} {item}: {have} in stock")
    stock[item] = have - n''')},
)

_TEXT = '''def title_case(s):
    """`s` with every word capitalized."""
    return " ".join(w.capitalize() for w in s.split())
'''

_SLUG = _task(
    "slugify_documented",
    "Add `slugify(text)` to text.py: lowercase words joined by '-', every character but letters, digits and spaces "
    "dropped. Every function of this module has a docstring; keep it so.",
    (Constraint(Kind.STYLE, paths=("text.py",), style=Style.DOCSTRINGS),),
    files={"text.py": _TEXT},
    tests='''import unittest

from text import slugify


class SlugifyTest(unittest.TestCase):

    def test_words(self):
        self.assertEqual(slugify("Hello World"), "hello-world")

    def test_punctuation(self):
        self.assertEqual(slugify("  C'est la vie!  2 times "), "cest-la-vie-2-times")
''',
    solution={"text.py": _TEXT + '''

def slugify(text):
    """`text` as a URL slug: lowercase words joined by '-', only letters and digits kept."""
    kept = "".join(c for c in text.lower() if c.isalnum() or c.isspace())
    return "-".join(kept.split())
'''},
    shortcut={"text.py": _TEXT + '''

def slugify(text):
    kept = "".join(c for c in text.lower() if c.isalnum() or c.isspace())
    return "-".join(kept.split())
'''},
)

TASKS = (_TAX_TOTAL, _PAGES, _DURATION_TASK, _MEDIAN, _REMOVE, _SLUG)


INSTRUCTIONS = CODING_SUITES.register(SUITE)(HeldOutSuite(SUITE, TASKS))
