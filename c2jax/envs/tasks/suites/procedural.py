"""The "tiny_functions" suite: small Python functions specified in one sentence plus an example.

  Write `def f(xs):` in solution.py returning the sum of x * x for the even numbers x in xs. Example: f([1, 2, 4]) == 20

A task's repository is one stub (solution.py with the signature and `raise NotImplementedError`); its hidden tests
check the example and several more cases, one test method each (so the pass fraction is graded, not all or
nothing); its reference solution is the one-line body. Small enough for a tiny model trained on CPU to learn, and
checked by the same sandboxed grading as the realistic suite.

The tasks are a grammar enumerated in a fixed order, so every task is a distinct function:
  * list tasks: reducer (sum, count, list, max) of mapper (x, x * m, x + m, x * x) over a filter (all, even, odd,
    x > k, x < k, divisible by k); difficulty 1 + number of non-trivial filter/mapper parts;
  * integer tasks: x + k, x - k, x * k, x % k, max/min(x, k), |x - k|, divisibility (difficulty 1), a * x + b,
    (x + b) * a, x * x + k (2);
  * string tasks: repeat, reverse, upper case, count a letter, replace a letter, prefix, suffix, palindrome
    (difficulty 1), words reversed (2).
The seed permutes the enumeration and splits it: the first `heldout_fraction` of the permutation is "heldout",
the rest "train" (disjoint by construction); test inputs come from a generator seeded by (seed, task key), so the
suite is a pure function of its fields. About 2,350 tasks in all.

No task is solved by a constant: string inputs always draw from the letters a task names (counting 'z' needs
inputs with a 'z'), and test cases are redrawn until the expected outputs are not all equal.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import string
from typing import Any, Callable, ClassVar

from c2jax.envs.tasks.coding_tasks import CODING_SUITES, Category, CodingTask, HIDDEN_TESTS_DIR, check_split

STUB_PATH = "solution.py"
CASES = 6  # hidden test cases besides the example


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
  """One function to write.

  Attributes:
    key: unique, stable name of the function within the grammar (the task id's suffix).
    arg: the parameter's name (x, xs or s); it also picks the input generator.
    phrase: what the function returns, in words (after "returning").
    body: the reference's return expression.
    fn: the same function in Python, which computes the expected outputs.
    difficulty: 1..3.
    letters: letters the string inputs must be able to hold besides the common ones (the letter to count or
      replace); otherwise such a task would expect the same output for every input.
  """

  key: str
  arg: str
  phrase: str
  body: str
  fn: Callable[[Any], Any]
  difficulty: int
  letters: str = ""


# ---------------------------------------------------------------------------------------------------- grammar


def _list_specs() -> list[FunctionSpec]:
  filters = [("all", "the numbers x in xs", None, lambda x: True)]
  filters += [("even", "the even numbers x in xs", "x % 2 == 0", lambda x: x % 2 == 0),
              ("odd", "the odd numbers x in xs", "x % 2 == 1", lambda x: x % 2 == 1)]
  filters += [(f"gt{k}", f"the numbers x in xs with x > {k}", f"x > {k}", lambda x, k=k: x > k) for k in range(11)]
  filters += [(f"lt{k}", f"the numbers x in xs with x < {k}", f"x < {k}", lambda x, k=k: x < k) for k in range(11)]
  filters += [(f"div{k}", f"the numbers x in xs divisible by {k}", f"x % {k} == 0", lambda x, k=k: x % k == 0)
              for k in range(3, 10)]
  mappers = [("id", "x", lambda x: x), ("sq", "x * x", lambda x: x * x)]
  mappers += [(f"times{m}", f"x * {m}", lambda x, m=m: x * m) for m in range(2, 10)]
  mappers += [(f"plus{m}", f"x + {m}", lambda x, m=m: x + m) for m in range(1, 10)]
  specs = []
  for fkey, fphrase, cond, pred in filters:
    clause = f" if {cond}" if cond else ""
    for mkey, mexpr, mapper in mappers:
      difficulty = 1 + (cond is not None) + (mkey != "id")
      gen = f"{mexpr} for x in xs{clause}"

      def reduce(xs, pred=pred, mapper=mapper):
        return [mapper(x) for x in xs if pred(x)]

      specs.append(FunctionSpec(f"sum.{fkey}.{mkey}", "xs", f"the sum of {mexpr} for {fphrase}", f"sum({gen})",
                                lambda xs, r=reduce: sum(r(xs)), difficulty))
      specs.append(FunctionSpec(f"max.{fkey}.{mkey}", "xs", f"the largest {mexpr} for {fphrase}, or 0 if there are "
                                "none", f"max(({gen}), default=0)", lambda xs, r=reduce: max(r(xs), default=0),
                                difficulty))
      if cond is not None or mkey != "id":  # a list of x for all x is xs itself
        specs.append(FunctionSpec(f"list.{fkey}.{mkey}", "xs", f"a list of {mexpr} for {fphrase}, in order",
                                  f"[{gen}]", lambda xs, r=reduce: r(xs), difficulty))
    specs.append(FunctionSpec(f"count.{fkey}", "xs", f"how many of {fphrase} there are",
                              f"sum(1 for x in xs{clause})", lambda xs, pred=pred: sum(1 for x in xs if pred(x)),
                              1 + (cond is not None)))
  return specs


def _int_specs() -> list[FunctionSpec]:
  specs = []
  for k in range(1, 21):
    specs.append(FunctionSpec(f"int.plus{k}", "x", f"x plus {k}", f"x + {k}", lambda x, k=k: x + k, 1))
    specs.append(FunctionSpec(f"int.minus{k}", "x", f"x minus {k}", f"x - {k}", lambda x, k=k: x - k, 1))
  for k in range(2, 13):
    specs.append(FunctionSpec(f"int.times{k}", "x", f"x times {k}", f"x * {k}", lambda x, k=k: x * k, 1))
    specs.append(FunctionSpec(f"int.mod{k}", "x", f"the remainder of x divided by {k} (x % {k})", f"x % {k}",
                              lambda x, k=k: x % k, 1))
    specs.append(FunctionSpec(f"int.divisible{k}", "x", f"True if x is divisible by {k}, else False",
                              f"x % {k} == 0", lambda x, k=k: x % k == 0, 1))
  for k in range(-10, 11):
    specs.append(FunctionSpec(f"int.max{k}", "x", f"the larger of x and {k}", f"max(x, {k})",
                              lambda x, k=k: max(x, k), 1))
    specs.append(FunctionSpec(f"int.min{k}", "x", f"the smaller of x and {k}", f"min(x, {k})",
                              lambda x, k=k: min(x, k), 1))
  for k in range(21):
    specs.append(FunctionSpec(f"int.distance{k}", "x", f"the distance between x and {k} (never negative)",
                              f"abs(x - {k})", lambda x, k=k: abs(x - k), 1))
  for k in range(-10, 11):
    specs.append(FunctionSpec(f"int.square_plus{k}", "x", f"x squared plus {k}", f"x * x + {k}",
                              lambda x, k=k: x * x + k, 2))
  for a in range(2, 10):
    for b in range(1, 10):
      specs.append(FunctionSpec(f"int.affine{a}x{b}", "x", f"{a} times x plus {b}", f"{a} * x + {b}",
                                lambda x, a=a, b=b: a * x + b, 2))
      specs.append(FunctionSpec(f"int.shift{b}times{a}", "x", f"x plus {b}, times {a}", f"(x + {b}) * {a}",
                                lambda x, a=a, b=b: (x + b) * a, 2))
  return specs


def _str_specs() -> list[FunctionSpec]:
  specs = [
      FunctionSpec("str.reverse", "s", "s reversed", "s[::-1]", lambda s: s[::-1], 1),
      FunctionSpec("str.upper", "s", "s in upper case", "s.upper()", lambda s: s.upper(), 1),
      FunctionSpec("str.palindrome", "s", "True if s reads the same backwards, else False", "s == s[::-1]",
                   lambda s: s == s[::-1], 1),
      FunctionSpec("str.words_reversed", "s", "the words of s (split on whitespace) in reverse order, joined by "
                   "single spaces", "' '.join(reversed(s.split()))", lambda s: " ".join(reversed(s.split())), 2),
  ]
  for k in range(2, 6):
    specs.append(FunctionSpec(f"str.repeat{k}", "s", f"s repeated {k} times", f"s * {k}", lambda s, k=k: s * k, 1))
  for k in range(1, 10):
    specs.append(FunctionSpec(f"str.first{k}", "s", f"the first {k} characters of s (all of s if it is shorter)",
                              f"s[:{k}]", lambda s, k=k: s[:k], 1))
    specs.append(FunctionSpec(f"str.last{k}", "s", f"the last {k} characters of s (all of s if it is shorter)",
                              f"s[-{k}:]", lambda s, k=k: s[-k:], 1))
  for c in string.ascii_lowercase:
    specs.append(FunctionSpec(f"str.count_{c}", "s", f"the number of times the letter '{c}' occurs in s",
                              f"s.count('{c}')", lambda s, c=c: s.count(c), 1, letters=c))
  for a in "aeiou":
    for b in string.ascii_lowercase:
      if a != b:
        specs.append(FunctionSpec(f"str.replace_{a}{b}", "s", f"s with every '{a}' replaced by '{b}'",
                                  f"s.replace('{a}', '{b}')", lambda s, a=a, b=b: s.replace(a, b), 1,
                                  letters=a + b))
  return specs


@functools.lru_cache(maxsize=1)
def all_specs() -> tuple[FunctionSpec, ...]:
  """The whole grammar in its fixed order."""
  specs = tuple(_list_specs() + _int_specs() + _str_specs())
  assert len({s.key for s in specs}) == len(specs)
  return specs


# ---------------------------------------------------------------------------------------------------- inputs


_LETTERS = "abcdeilmnorstu"  # common letters: inputs look like words


def _input(spec: FunctionSpec, rng: random.Random) -> Any:
  """One test input for `spec`."""
  if spec.arg == "x":
    return rng.randint(-20, 40)
  if spec.arg == "xs":
    return [rng.randint(-5, 15) for _ in range(rng.randint(0, 7))]
  # The spec's own letters (deduplicated, in order) weigh as much as a few common ones, so most inputs hold them.
  alphabet = _LETTERS + "".join(dict.fromkeys(c for c in spec.letters if c not in _LETTERS)) * 3
  words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
  return " ".join(words) if rng.random() < 0.3 else words[0]


def _example(spec: FunctionSpec, rng: random.Random) -> Any:
  """An input whose output says something (a non-empty list, not all filtered out, ...)."""
  best = None
  for _ in range(50):
    value = _input(spec, rng)
    if spec.arg == "xs":
      value = value or [rng.randint(-5, 15) for _ in range(3)]
    best = value
    out = spec.fn(value)
    if out not in (0, [], "", False) and out != value:
      break
  return best


def _literal(value: Any) -> str:
  return repr(value)


# ---------------------------------------------------------------------------------------------------- tasks


def _cases(spec: FunctionSpec, example: Any, rng: random.Random) -> list[Any]:
  """Up to CASES distinct inputs other than the example."""
  cases, seen = [], {repr(example)}
  for _ in range(200):
    if len(cases) == CASES:
      break
    value = _input(spec, rng)
    if repr(value) not in seen:
      seen.add(repr(value))
      cases.append(value)
  return cases


def make_task(spec: FunctionSpec, seed: int, suite: str = "tiny_functions") -> CodingTask:
  """The task of one spec; deterministic in (spec.key, seed).

  Raises:
    ValueError: no draw of test cases gave two different expected outputs (a constant would pass the task).
  """
  rng = random.Random(f"{seed}/{spec.key}")
  example = _example(spec, rng)
  for _ in range(100):
    cases = _cases(spec, example, rng)
    if len({repr(spec.fn(v)) for v in [example] + cases}) > 1:
      break
  else:
    raise ValueError(f"Task {spec.key}: every drawn test case expects the same output; a constant would pass it.")
  signature = f"def f({spec.arg}):"
  call = f"f({_literal(example)}) == {_literal(spec.fn(example))}"
  prompt = f"Write `{signature}` in {STUB_PATH} returning {spec.phrase}. Example: {call}"
  tests = ["import unittest", "", "from solution import f", "", "", "class TestF(unittest.TestCase):", ""]
  for name, value in [("example", example)] + [(f"case_{i}", v) for i, v in enumerate(cases)]:
    expected = _literal(spec.fn(value))
    tests += [f"    def test_{name}(self):", f"        self.assertEqual(f({_literal(value)}), {expected})", ""]
  tests += ["", 'if __name__ == "__main__":', "    unittest.main()"]
  return CodingTask(
      task_id=f"{suite}/{spec.key}",
      prompt=prompt,
      files={STUB_PATH: f"{signature}\n    raise NotImplementedError\n"},
      hidden_tests={f"{HIDDEN_TESTS_DIR}/__init__.py": "",
                    f"{HIDDEN_TESTS_DIR}/test_solution.py": "\n".join(tests) + "\n"},
      solution={STUB_PATH: f"{signature}\n    return {spec.body}\n"},
      expected_tests=1 + len(cases),
      category=Category.FEATURE,
      difficulty=spec.difficulty,
      metadata={"suite": suite, "family": spec.key.split(".")[0], "seed": str(seed)},
  )


GRAMMARS: dict[str, Callable[[], tuple[FunctionSpec, ...]]] = {"tiny_functions": all_specs}
"""Grammar name -> its specs in their fixed order; a suite class names its grammar (`TinyFunctionsSuite.GRAMMAR`)."""


@dataclasses.dataclass(frozen=True)
class TinyFunctionsSuite:
  """The grammar split by a seed.

  Attributes:
    seed: permutes the grammar (which tasks are held out) and draws the test inputs.
    heldout_fraction: the share of tasks in the "heldout" split.
    max_difficulty: keeps only tasks of difficulty <= this (a curriculum starts at 1).
  """

  GRAMMAR: ClassVar[str] = "tiny_functions"  # the key of its specs in GRAMMARS

  seed: int = 0
  heldout_fraction: float = 0.2
  max_difficulty: int = 3
  name: str = "tiny_functions"

  def _split_specs(self, split: str) -> tuple[FunctionSpec, ...]:
    check_split(split)
    return _splits(self.GRAMMAR, self.seed, self.heldout_fraction, self.max_difficulty)[split]

  def size(self, split: str) -> int:
    return len(self._split_specs(split))

  def task(self, split: str, index: int) -> CodingTask:
    """Task `index` (modulo the split's size) of `split`."""
    specs = self._split_specs(split)
    return make_task(specs[int(index) % len(specs)], self.seed, self.name)

  def tasks(self, split: str) -> list[CodingTask]:
    return [make_task(spec, self.seed, self.name) for spec in self._split_specs(split)]

  def __call__(self, **overrides) -> TinyFunctionsSuite:
    """The suite with other fields: `CODING_SUITES.get("tiny_functions")(seed=3)`."""
    return dataclasses.replace(self, **overrides)


@functools.lru_cache(maxsize=16)
def _splits(grammar: str, seed: int, heldout_fraction: float,
            max_difficulty: int) -> dict[str, tuple[FunctionSpec, ...]]:
  specs = list(GRAMMARS[grammar]())
  random.Random(seed).shuffle(specs)
  n_heldout = int(round(len(specs) * heldout_fraction))
  keep = lambda group: tuple(s for s in group if s.difficulty <= max_difficulty)
  return {"heldout": keep(specs[:n_heldout]), "train": keep(specs[n_heldout:])}


TINY_FUNCTIONS = CODING_SUITES.register("tiny_functions")(TinyFunctionsSuite())
