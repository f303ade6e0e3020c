"""The "tiny_compositions" suite: list functions composed of a reducer, a mapper and a filter, all named in words.

  Write `def f(xs):` in solution.py returning the sum of the squares of the even numbers in xs.
  Example: f([1, 2, 4]) == 20                              ->   return sum(x * x for x in xs if x % 2 == 0)

Every part is a word (squares, even, largest), never a constant to copy, and the held-out split holds
*compositions* never trained on: a held-out task's reducer, mapper and filter each appear in many train tasks, only
not together. It measures what a model of any size can learn from the train split (which word asks for which
piece of code, and how pieces combine), where tiny_functions' held-out constants ("x plus 7", "every 'u' replaced
by 'q'") also need a copying circuit that a byte-level model a few minutes old on a CPU has not formed
(docs/experiments/main_job.md, sections 1.3 and 2.1). It is the main job's suite at CPU scale (configs/rl_tiny.py).

The grammar, enumerated in a fixed order (each task a distinct function):
  * reducers: the sum of, the largest of (0 if none), the smallest of (0 if none), a list of (in order);
  * mappers: the numbers themselves, their squares, doubles, negations, absolute values, halves rounded down,
    successors (x + 1);
  * filters: all numbers, the even / odd / positive / negative / nonzero ones;
  * and "how many" of each filter. Difficulty 1 + number of non-trivial parts (mapper, filter).
Tasks, test inputs, the held-out split and grading are tiny_functions' (`procedural.make_task`): a seed permutes
the enumeration and draws the inputs; the first `heldout_fraction` of the permutation is held out.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from c2jax.envs.tasks.coding_tasks import CODING_SUITES
from c2jax.envs.tasks.suites.procedural import GRAMMARS, FunctionSpec, TinyFunctionsSuite

# (key, phrase for "<reducer> <phrase> of", the expression of x)
_MAPPERS = (
    ("id", "", "x", lambda x: x),
    ("square", "the squares of ", "x * x", lambda x: x * x),
    ("double", "the doubles of ", "2 * x", lambda x: 2 * x),
    ("negate", "the negations of ", "-x", lambda x: -x),
    ("abs", "the absolute values of ", "abs(x)", abs),
    ("half", "the halves (rounded down) of ", "x // 2", lambda x: x // 2),
    ("succ", "the successors (x + 1) of ", "x + 1", lambda x: x + 1),
)
# (key, words naming the numbers, condition or None)
_FILTERS = (
    ("all", "the numbers in xs", None, lambda x: True),
    ("even", "the even numbers in xs", "x % 2 == 0", lambda x: x % 2 == 0),
    ("odd", "the odd numbers in xs", "x % 2 == 1", lambda x: x % 2 == 1),
    ("positive", "the positive numbers in xs", "x > 0", lambda x: x > 0),
    ("negative", "the negative numbers in xs", "x < 0", lambda x: x < 0),
    ("nonzero", "the nonzero numbers in xs", "x != 0", lambda x: x != 0),
)


def _specs() -> list[FunctionSpec]:
  specs = []
  for fkey, fwords, cond, pred in _FILTERS:
    clause = f" if {cond}" if cond else ""
    for mkey, mwords, mexpr, mapper in _MAPPERS:
      difficulty = 1 + (cond is not None) + (mkey != "id")
      gen = f"{mexpr} for x in xs{clause}"
      numbers = f"{mwords}{fwords}"

      def values(xs, pred=pred, mapper=mapper):
        return [mapper(x) for x in xs if pred(x)]

      key = f"{fkey}.{mkey}"
      specs.append(FunctionSpec(f"sum.{key}", "xs", f"the sum of {numbers}", f"sum({gen})",
                                lambda xs, v=values: sum(v(xs)), difficulty))
      specs.append(FunctionSpec(f"max.{key}", "xs", f"the largest of {numbers}, or 0 if there are none",
                                f"max(({gen}), default=0)", lambda xs, v=values: max(v(xs), default=0), difficulty))
      specs.append(FunctionSpec(f"min.{key}", "xs", f"the smallest of {numbers}, or 0 if there are none",
                                f"min(({gen}), default=0)", lambda xs, v=values: min(v(xs), default=0), difficulty))
      if cond is not None or mkey != "id":  # a list of all the numbers is xs itself
        specs.append(FunctionSpec(f"list.{key}", "xs", f"a list of {numbers}, in order", f"[{gen}]",
                                  lambda xs, v=values: v(xs), difficulty))
    specs.append(FunctionSpec(f"count.{fkey}", "xs", f"how many of {fwords} there are",
                              f"sum(1 for x in xs{clause})", lambda xs, pred=pred: sum(1 for x in xs if pred(x)),
                              1 + (cond is not None)))
  return specs


@functools.lru_cache(maxsize=1)
def all_specs() -> tuple[FunctionSpec, ...]:
  """The whole grammar in its fixed order (173 functions)."""
  specs = tuple(_specs())
  assert len({s.key for s in specs}) == len(specs)
  return specs


@dataclasses.dataclass(frozen=True)
class TinyCompositionsSuite(TinyFunctionsSuite):
  """The grammar split by a seed; fields, splits and tasks as `procedural.TinyFunctionsSuite`'s.

  Attributes:
    seed: permutes the grammar (which compositions are held out) and draws the test inputs.
    heldout_fraction: the share of tasks in the "heldout" split.
    max_difficulty: keeps only tasks of difficulty <= this.
  """

  GRAMMAR: ClassVar[str] = "tiny_compositions"

  name: str = "tiny_compositions"


GRAMMARS["tiny_compositions"] = all_specs
TINY_COMPOSITIONS = CODING_SUITES.register("tiny_compositions")(TinyCompositionsSuite())
