"""A user message that arrives while the agent works (interruption handling, CursorBench's complementary evaluations,
report section 5): its format, kept in the task's metadata "interruption" as a JSON object.

  interruption = task_interruption(task)       # Interruption(turn=1, message="...", cut_tokens=None) or None
  text = cut_turn(task, turn, text)            # a scripted driver's cut of the interrupted turn
  budgets = turn_tokens(task, 256)             # the agent loop's: Episode(turn_tokens=budgets)

  {"turn": 1, "message": "Change of plan: ..."}                    between turns: after the agent's turn 1 ends
  {"turn": 1, "message": "Change of plan: ...", "cut_tokens": 40}  mid-turn: turn 1 is cut after 40 tokens

The environment (`c2jax.envs.core.env.CodingEnv`) delivers the message after the agent's turn `turn` (1-based) as a
user turn of its chat format, after that turn's tool results: in place of the next generation prompt for a native
template, framed by `USER_OPEN` / `USER_CLOSE` after the budget line for brief. A finish called in that turn is
overruled (the user spoke before the agent was done) and the episode goes on; a spent budget still ends it, and the
message is then never delivered. Mid-turn, the driver cuts the running turn first: the agent loop ends turn `turn`
after `cut_tokens` tokens as a per-turn budget (`c2jax.actors.agent_loop.Episode.turn_tokens` from `turn_tokens`,
set by the evaluation harness, `policy_eval.evaluate_episodes` and the RL actors), a scripted driver after
`cut_tokens` bytes of its text (`cut_turn`: the byte tokens of the brief format); the tool calls complete before
the cut run, the rest of the turn is lost, then the message follows. A turn that ends by itself before the cut is
not cut.
"""

from __future__ import annotations

import dataclasses
import json

from c2jax.envs.tasks.coding_tasks import CodingTask, TaskFormatError

METADATA_KEY = "interruption"
USER_OPEN, USER_CLOSE = "<user>", "</user>"


@dataclasses.dataclass(frozen=True)
class Interruption:
  """A user message after the agent's turn `turn` (1-based), the turn cut after `cut_tokens` tokens (mid-turn) or
  not (None: between turns)."""

  turn: int
  message: str
  cut_tokens: int | None = None

  def __post_init__(self):
    if not (isinstance(self.turn, int) and self.turn >= 1):
      raise TaskFormatError(f"An interruption's turn must be an integer >= 1, got {self.turn!r}.")
    if not (isinstance(self.message, str) and self.message.strip()):
      raise TaskFormatError("An interruption needs a non-empty message.")
    if self.cut_tokens is not None and not (isinstance(self.cut_tokens, int) and self.cut_tokens >= 1):
      raise TaskFormatError(f"An interruption's cut_tokens must be an integer >= 1 or absent, got "
                            f"{self.cut_tokens!r}.")

  def to_json(self) -> dict:
    out = {"turn": self.turn, "message": self.message}
    return out if self.cut_tokens is None else {**out, "cut_tokens": self.cut_tokens}


def encode(interruption: Interruption) -> str:
  """The metadata value of `interruption` (what `task_interruption` reads back)."""
  return json.dumps(interruption.to_json())


def task_interruption(task: CodingTask) -> Interruption | None:
  """The task's interruption, or None; a malformed one raises TaskFormatError naming the piece."""
  text = task.metadata.get(METADATA_KEY)
  if text is None:
    return None
  try:
    value = json.loads(text)
  except ValueError:
    value = None
  if not isinstance(value, dict) or set(value) - {"turn", "message", "cut_tokens"}:
    raise TaskFormatError(f"Task {task.task_id}'s metadata {METADATA_KEY!r} must be a JSON object with turn, "
                          "message and optionally cut_tokens.")
  return Interruption(turn=value.get("turn"), message=value.get("message"), cut_tokens=value.get("cut_tokens"))


def framed(message: str) -> str:
  """The brief format's user turn: the message between `USER_OPEN` and `USER_CLOSE` lines."""
  return f"\n{USER_OPEN}\n{message}\n{USER_CLOSE}"


def cut_turn(task: CodingTask, turn: int, text: str) -> str:
  """A scripted driver's turn `turn` (1-based) of `text`: cut after `cut_tokens` bytes when the task interrupts it
  mid-turn, else as it is."""
  interruption = task_interruption(task)
  if interruption is None or interruption.cut_tokens is None or interruption.turn != turn:
    return text
  return text.encode("utf-8")[:interruption.cut_tokens].decode("utf-8", errors="ignore")


def turn_tokens(task: CodingTask, max_turn_tokens: int) -> tuple[int, ...]:
  """The agent loop's budgets of an episode's first turns (`agent_loop.Episode.turn_tokens`) that cut the turn a
  user interrupts mid-turn after `cut_tokens`: the engine's running turn ends there, host-side, its complete tool
  calls run, and the environment appends the user's message. () without a mid-turn interruption (every turn has
  `max_turn_tokens`)."""
  interruption = task_interruption(task)
  if interruption is None or interruption.cut_tokens is None:
    return ()
  return (max_turn_tokens,) * (interruption.turn - 1) + (min(interruption.cut_tokens, max_turn_tokens),)

