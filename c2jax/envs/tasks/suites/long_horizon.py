"""The "tiny_long_horizon" suite: a function whose steps are spread over K note files, each buried in filler, so
that an agent with a small context must read, note down, summarize and continue (report section 4:
self-summarization keeps the context on long-horizon tasks).

  Write `def f(x):` in solution.py that applies the steps in notes/step_1.txt .. notes/step_4.txt to x, in order,
  and returns the result.                                        ->   return abs((-(x * 3)) * 5)

The prompt names only the files. notes/step_i.txt holds one line "step i: <words>" (e.g. "step 2: multiply by 3")
among `filler_lines` lines of project notes (deterministic per task, never naming an operation), about 150-300
bytes at the defaults: one file fits a small context easily, the K files and the agent's turns together do not.
The repository also holds a one-line README.md and a stub solution.py.

The step grammar (`STEPS`, 28 steps on an int): add k, subtract k (k = 1..9), multiply by k (2..5), divide by k,
rounding down (2..4: floor division), negate, square, take the absolute value. A task is a sequence of K of them;
no two adjacent steps may do what one step or none would (add 2 then add 3, negate twice, square then the absolute
value), and every task is a distinct function on `PROBES` (the hidden tests' inputs) with at least
`MIN_DISTINCT_OUTPUTS` outputs there and at most `MAX_FIXED_POINTS` inputs it leaves unchanged. The pool of
`POOL_SIZE` sequences per K (370 for K = 2, the grammar's limit) is one fixed draw; the seed permutes it and splits
it: the first `heldout_fraction` is "heldout", the rest "train", and a held-out sequence with a step that train
never has at the same position moves to train. So held-out tasks are step SEQUENCES never trained on whose every
step (at its position) is trained on (as tiny_compositions holds out compositions of trained parts). Hidden tests
check f(v) for `CASES` inputs drawn from (seed, task key); they are redrawn until neither a constant nor f(x) = x
passes them all.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import random
import re
from typing import Sequence

from c2jax.envs.tasks.coding_tasks import CODING_SUITES, Category, CodingTask, HIDDEN_TESTS_DIR, check_split

STUB_PATH = "solution.py"
README_PATH = "README.md"
CASES = 6  # hidden test cases per task
POOL_SIZE = 400  # tasks per number of files (fewer where the grammar holds fewer distinct functions)
PROBES = tuple(range(-10, 11))  # the hidden tests' inputs are drawn from these; they tell the functions apart
MIN_DISTINCT_OUTPUTS = 5  # over PROBES: a function with fewer is nearly constant there (guessable)
MAX_FIXED_POINTS = 2  # PROBES with f(v) == v, at most: f(x) = x passes few of a task's tests
_ENUMERATE_BELOW = 50_000  # sequence spaces smaller than this are enumerated and shuffled, larger ones sampled


def note_path(index: int) -> str:
  """The repository path of step `index` (1-based)."""
  return f"notes/step_{index}.txt"


class Op(enum.Enum):
  """What one step does to x."""

  ADD = "add"
  SUBTRACT = "sub"
  MULTIPLY = "mul"
  DIVIDE = "div"
  NEGATE = "neg"
  SQUARE = "sq"
  ABS = "abs"


@dataclasses.dataclass(frozen=True)
class Step:
  """One step of a task.

  Attributes:
    op: the operation.
    k: its constant (ADD, SUBTRACT, MULTIPLY, DIVIDE), else None.
  """

  op: Op
  k: int | None = None

  @property
  def key(self) -> str:
    """Stable short name ("add3", "neg"): the task id is the keys of its steps joined by dots."""
    return f"{self.op.value}{'' if self.k is None else self.k}"

  @property
  def words(self) -> str:
    """The step as a note states it (never holds ':' or ';', the separators of step lines and summaries)."""
    return {Op.ADD: f"add {self.k}", Op.SUBTRACT: f"subtract {self.k}", Op.MULTIPLY: f"multiply by {self.k}",
            Op.DIVIDE: f"divide by {self.k}, rounding down", Op.NEGATE: "negate", Op.SQUARE: "square",
            Op.ABS: "take the absolute value"}[self.op]

  def apply(self, x: int) -> int:
    """The step on one int (floor division rounds down, as its words say)."""
    return {Op.ADD: lambda: x + self.k, Op.SUBTRACT: lambda: x - self.k, Op.MULTIPLY: lambda: x * self.k,
            Op.DIVIDE: lambda: x // self.k, Op.NEGATE: lambda: -x, Op.SQUARE: lambda: x * x,
            Op.ABS: lambda: abs(x)}[self.op]()

  def expression(self, inner: str, atomic: bool) -> str:
    """Python source of the step applied to `inner` (parenthesized unless `atomic`: a name or a call)."""
    p = inner if atomic else f"({inner})"
    return {Op.ADD: f"{p} + {self.k}", Op.SUBTRACT: f"{p} - {self.k}", Op.MULTIPLY: f"{p} * {self.k}",
            Op.DIVIDE: f"{p} // {self.k}", Op.NEGATE: f"-{p}", Op.SQUARE: f"{p} ** 2",
            Op.ABS: f"abs({inner})"}[self.op]


STEPS: tuple[Step, ...] = (
    tuple(Step(Op.ADD, k) for k in range(1, 10)) + tuple(Step(Op.SUBTRACT, k) for k in range(1, 10))
    + tuple(Step(Op.MULTIPLY, k) for k in range(2, 6)) + tuple(Step(Op.DIVIDE, k) for k in range(2, 5))
    + (Step(Op.NEGATE), Step(Op.SQUARE), Step(Op.ABS)))
_BY_WORDS = {s.words: s for s in STEPS}
_NONLINEAR = frozenset({Op.DIVIDE, Op.SQUARE, Op.ABS})


def parse_step(words: str) -> Step | None:
  """The step a note's words name ("multiply by 3"), or None when they name none."""
  return _BY_WORDS.get(words.strip().rstrip("."))


def step_line(index: int, step: Step) -> str:
  """The line of notes/step_<index>.txt that states its step: "step 2: multiply by 3"."""
  return f"step {index}: {step.words}"


_STEP_LINE = re.compile(r"^step (\d+): (.+?)\s*$", re.M)


def find_steps(text: str) -> dict[int, Step]:
  """The steps stated by "step i: <words>" lines anywhere in `text` (a note, an observation), index -> step."""
  found = {}
  for m in _STEP_LINE.finditer(text):
    step = parse_step(m.group(2))
    if step is not None:
      found[int(m.group(1))] = step
  return found


def solution_source(steps: Sequence[Step]) -> str:
  """solution.py applying `steps` to x in order, as one composed expression."""
  expr, atomic = "x", True
  for step in steps:
    expr, atomic = step.expression(expr, atomic), step.op is Op.ABS
  return f"def f(x):\n    return {expr}\n"


def compose(steps: Sequence[Step], x: int) -> int:
  """`steps` applied to x in order (what the tests expect)."""
  for step in steps:
    x = step.apply(x)
  return x


# ---------------------------------------------------------------------------------------------------- the pool


def _signature(steps: Sequence[Step]) -> tuple[int, ...]:
  return tuple(compose(steps, v) for v in PROBES)


@functools.lru_cache(maxsize=1)
def _forbidden_pairs() -> frozenset[tuple[Step, Step]]:
  """Adjacent steps (a, b) whose composition one step or none does: a task holds none of them (they would let a
  shorter program stand for the notes, and merge distinct-looking sequences into one function)."""
  single = {_signature([s]) for s in STEPS} | {_signature([])}
  return frozenset((a, b) for a in STEPS for b in STEPS if _signature([a, b]) in single)


@functools.lru_cache(maxsize=8)
def pool(num_files: int, size: int = POOL_SIZE) -> tuple[tuple[Step, ...], ...]:
  """The fixed draw of up to `size` step sequences of length `num_files`, distinct functions, in draw order (a
  larger `size` extends a smaller one's draw)."""
  if num_files < 2:
    raise ValueError(f"tiny_long_horizon needs num_files >= 2 (got {num_files}): a held-out task is a new sequence "
                     "of trained steps.")
  rng = random.Random(f"tiny_long_horizon/{num_files}")
  if len(STEPS) ** num_files < _ENUMERATE_BELOW:
    candidates = list(itertools.product(STEPS, repeat=num_files))
    rng.shuffle(candidates)
  else:
    candidates = (tuple(rng.choice(STEPS) for _ in range(num_files)) for _ in range(200 * size))
  forbidden = _forbidden_pairs()
  out, seen = [], set()
  for steps in candidates:
    if len(out) == size:
      break
    if any(pair in forbidden for pair in zip(steps, steps[1:])):
      continue
    signature = _signature(steps)
    if (signature in seen or len(set(signature)) < MIN_DISTINCT_OUTPUTS
        or sum(y == v for y, v in zip(signature, PROBES)) > MAX_FIXED_POINTS):
      continue
    seen.add(signature)
    out.append(steps)
  return tuple(out)


@functools.lru_cache(maxsize=16)
def _splits(seed: int, heldout_fraction: float, num_files: int,
            pool_size: int) -> dict[str, tuple[tuple[Step, ...], ...]]:
  sequences = list(pool(num_files, pool_size))
  random.Random(seed).shuffle(sequences)
  n_heldout = int(round(len(sequences) * heldout_fraction))
  heldout, train = sequences[:n_heldout], sequences[n_heldout:]
  trained = {(i, s) for steps in train for i, s in enumerate(steps)}
  kept = []
  for steps in heldout:  # moving a sequence to train only adds trained (position, step) pairs: one pass suffices
    if all((i, s) in trained for i, s in enumerate(steps)):
      kept.append(steps)
    else:
      train.append(steps)
      trained.update(enumerate(steps))
  return {"heldout": tuple(kept), "train": tuple(train)}


# ---------------------------------------------------------------------------------------------------- filler

_NAMES = ("Ana", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kemal", "Lena")
_THINGS = ("release checklist", "build cache", "lint config", "changelog", "test fixtures", "logging setup",
           "CI runner", "docs index", "API sketch", "benchmark table", "style guide", "backup script",
           "issue tracker", "demo notebook")
_VERBS = ("update", "review", "trim", "rename", "archive", "split", "check", "draft", "clean up", "move")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
# No template names an operation or says "step": the note's one step line is the only thing in it to act on.
_TEMPLATES = (
    "{name} will {verb} the {thing} before {day}.",
    "Reminder: {name} owns the {thing}; ask before changing it.",
    "{day}: {name} looked at the {thing} and left {n} comments.",
    "Open question: who should {verb} the {thing} next?",
    "The {thing} is fine for now, says {name}.",
    "Idea from {name}: {verb} the {thing} once a week.",
    "Do not {verb} the {thing} on {day}s.",
    "{name} and {other} disagree about the {thing}.",
    "Left over from {day}: {verb} the {thing} ({n} items).",
)


def filler_line(rng: random.Random) -> str:
  """One plausible line of project notes."""
  name, other = rng.sample(_NAMES, 2)
  return rng.choice(_TEMPLATES).format(name=name, other=other, verb=rng.choice(_VERBS), thing=rng.choice(_THINGS),
                                       day=rng.choice(_DAYS), n=rng.randint(2, 9))


def note_text(index: int, step: Step, filler_lines: int, rng: random.Random) -> str:
  """notes/step_<index>.txt: `filler_lines` lines of notes with the step line at a random place among them."""
  lines = [filler_line(rng) for _ in range(filler_lines)]
  lines.insert(rng.randint(0, filler_lines), step_line(index, step))
  return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------- tasks


def _cases(steps: Sequence[Step], rng: random.Random, key: str) -> list[int]:
  """CASES distinct inputs on which f is neither constant nor the identity.

  Raises:
    ValueError: no draw gave such inputs (a constant or `return x` would pass the task).
  """
  for _ in range(100):
    cases = rng.sample(PROBES, CASES)
    outputs = [compose(steps, v) for v in cases]
    if len(set(outputs)) > 1 and outputs != cases:
      return cases
  raise ValueError(f"Task {key}: every drawn set of test inputs is passed by a constant or by f(x) = x.")


def make_task(steps: Sequence[Step], seed: int, filler_lines: int, suite: str = "tiny_long_horizon") -> CodingTask:
  """The task of one step sequence; deterministic in (steps, seed, filler_lines)."""
  steps = tuple(steps)
  key = ".".join(s.key for s in steps)
  rng = random.Random(f"{seed}/{key}")
  cases = _cases(steps, rng, key)
  k = len(steps)
  prompt = (f"Write `def f(x):` in {STUB_PATH} that applies the steps in {note_path(1)} .. {note_path(k)} to x, in "
            "order, and returns the result.")
  files = {README_PATH: "Project notes, and the function they describe.\n",
           STUB_PATH: "def f(x):\n    raise NotImplementedError\n"}
  note_rng = random.Random(f"{seed}/{key}/notes/{filler_lines}")
  files.update({note_path(i): note_text(i, s, filler_lines, note_rng) for i, s in enumerate(steps, 1)})
  tests = ["import unittest", "", "from solution import f", "", "", "class TestF(unittest.TestCase):", ""]
  for i, value in enumerate(cases):
    tests += [f"    def test_case_{i}(self):", f"        self.assertEqual(f({value!r}), {compose(steps, value)!r})",
              ""]
  tests += ["", 'if __name__ == "__main__":', "    unittest.main()"]
  return CodingTask(
      task_id=f"{suite}/{key}",
      prompt=prompt,
      files=files,
      hidden_tests={f"{HIDDEN_TESTS_DIR}/__init__.py": "",
                    f"{HIDDEN_TESTS_DIR}/test_solution.py": "\n".join(tests) + "\n"},
      solution={STUB_PATH: solution_source(steps)},
      expected_tests=len(cases),
      category=Category.FEATURE,
      difficulty=1 + min(2, sum(s.op in _NONLINEAR for s in steps)),
      metadata={"suite": suite, "seed": str(seed), "steps": key, "num_files": str(k),
                "filler_lines": str(filler_lines)},
  )


@dataclasses.dataclass(frozen=True)
class TinyLongHorizonSuite:
  """The pool of step sequences split by a seed.

  Attributes:
    seed: permutes the pool (which sequences are held out), draws the test inputs and the filler.
    heldout_fraction: the share of the pool drawn for "heldout" (a few move to train; see the module docstring).
    num_files: K, the steps of a task and its note files (>= 2).
    filler_lines: lines of project notes around each note's step line (4: a note of about 150-300 bytes).
    pool_size: step sequences drawn (`pool`), at most; more train tasks than a model can memorize make it read
      its notes instead (K = 3 holds 4,341 distinct functions, K = 2 370).
  """

  seed: int = 0
  heldout_fraction: float = 0.2
  num_files: int = 4
  filler_lines: int = 4
  pool_size: int = POOL_SIZE
  name: str = "tiny_long_horizon"

  def __post_init__(self):
    if self.filler_lines < 0:
      raise ValueError(f"tiny_long_horizon: filler_lines must be >= 0, got {self.filler_lines}.")
    if not 0.0 <= self.heldout_fraction < 1.0:
      raise ValueError(f"tiny_long_horizon: heldout_fraction must be in [0, 1), got {self.heldout_fraction}.")
    if self.pool_size < 2:
      raise ValueError(f"tiny_long_horizon: pool_size must be >= 2, got {self.pool_size}.")

  def _sequences(self, split: str) -> tuple[tuple[Step, ...], ...]:
    check_split(split)
    return _splits(self.seed, self.heldout_fraction, self.num_files, self.pool_size)[split]

  def size(self, split: str) -> int:
    return len(self._sequences(split))

  def task(self, split: str, index: int) -> CodingTask:
    """Task `index` (modulo the split's size) of `split`."""
    sequences = self._sequences(split)
    return make_task(sequences[int(index) % len(sequences)], self.seed, self.filler_lines, self.name)

  def tasks(self, split: str) -> list[CodingTask]:
    return [make_task(steps, self.seed, self.filler_lines, self.name) for steps in self._sequences(split)]

  def __call__(self, **overrides) -> TinyLongHorizonSuite:
    """The suite with other fields: `CODING_SUITES.get("tiny_long_horizon")(num_files=6, filler_lines=8)`."""
    return dataclasses.replace(self, **overrides)


TINY_LONG_HORIZON = CODING_SUITES.register("tiny_long_horizon")(TinyLongHorizonSuite())
