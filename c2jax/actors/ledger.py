"""A trajectory's token ledger: every position of a multi-turn episode with where it came from, which turn, which
weights drew it, its behaviour log-prob and its routing (report section 4: RL trains on what the agent actually
sampled, with routing replay over every position; self-summaries chain several generations into one episode).

  traj.tokens[i], traj.source[i] (Source), traj.turn[i], traj.logprobs[i], traj.versions[i], traj.expert_ids[:, i]
  row = traj.row(seq_len)             # the buffer row: loss_mask = the actions (MODEL and SUMMARY), padded
  traj.segments                       # (Segment, ...): the chain, oldest first; traj itself is the last one

An episode with self-summaries is a chain of segments, each one generation in the slot: the first holds the prompt
and the turns up to the summary request and the model's summary; each later one starts again from the task's first
observation, then the summary framed (RESUME), then the episode goes on. Each segment is one buffer row with its own
ledger; `Trajectory` is the last segment plus the episode's fields, `earlier` the segments before it.

The ledger is built from ids only: sampled ids are read from the engine and never decoded and re-encoded; each
observation is tokenized once, when it is appended. `drift` counts positions where the ledger and the tokens the
engine fed to the model disagree (0 by construction; tested), `retokenized_turns` the model turns whose text would
not tokenize back to the sampled ids (what a pipeline that re-tokenizes the conversation would have trained on
wrongly; information only).

Turn indices: the prompt and the model's first turn are turn 0; the observation answering turn t (its tool
results) and the budget notice after it carry t, and the model's next turn t + 1. A summary is a model turn too:
the request before it carries the index of the turn it follows, the summary the next index; a later segment's
prompt and RESUME tokens carry the summary's index, and its first turn the next.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Mapping

import numpy as np


class Source(enum.IntEnum):
  """Where a token of a trajectory came from. MODEL and SUMMARY tokens are the model's actions (a summary is
  trained like any turn, the report's choice; `SummaryTokens.MASKED` leaves it out of the loss)."""

  PROMPT = 0
  MODEL = 1
  OBSERVATION = 2
  NOTICE = 3
  SUMMARY_REQUEST = 4  # the harness's request to summarize (c2jax/envs/chat/self_summary.py)
  SUMMARY = 5  # the model's summary turn
  RESUME = 6  # a later segment's copy of the summary, framed, after the task's first observation


ACTIONS = (Source.MODEL, Source.SUMMARY)


class SummaryTokens(enum.Enum):
  """Whether the summary turns are in the loss: TRAINED (the report: the chain's reward reinforces good summaries
  and suppresses bad ones) or MASKED (the ablation: summaries are sampled but get no gradient)."""

  TRAINED = "trained"
  MASKED = "masked"


class EpisodeEnd(enum.Enum):
  """Why an episode ended. FINISHED: the environment ended it (the agent called finish, or a one-turn episode's
  turn ended on a stop token); every other end is a budget's cut (`Trajectory.cut`). ENV_ERROR: the environment
  raised while starting, running a turn's tools or grading (the agent loop's `ENV_ERROR_TERMS`: reward 0)."""

  FINISHED = "finished"
  TURN_BUDGET = "turn_budget"
  TOKEN_BUDGET = "token_budget"
  CONTEXT = "context"
  TOOL_TIME = "tool_time"
  WORKDIR_LIMIT = "workdir_limit"
  SUMMARY_BUDGET = "summary_budget"  # a summary ran past `SummaryConfig.max_tokens`
  SEGMENT_LIMIT = "segment_limit"  # the context filled again after `SummaryConfig.max_segments` segments
  ENV_ERROR = "env_error"

  @classmethod
  def from_env(cls, reason: str) -> EpisodeEnd:
    """The end of a `CodingEnv` done_reason ("finish", "turn_budget", "token_budget", "time_budget",
    "workdir_limit")."""
    return {"finish": cls.FINISHED, "time_budget": cls.TOOL_TIME}.get(reason) or cls(reason)


@dataclasses.dataclass(frozen=True)
class Segment:
  """One generation of an episode in its slot: a buffer row.

  Attributes:
    tokens: [n] int32 every position, prompt first.
    source: [n] int8 `Source` of each position.
    turn: [n] int32 turn index of each position (module docstring).
    logprobs: [n] float32 behaviour log-probs of the action tokens (0 elsewhere).
    versions: [n] int32 weights version that drew each action token (0 elsewhere).
    expert_ids: [Lm, n, K] int32 routed experts of every position.
    drift: positions where the ledger and the engine's tokens differ (0).
  """

  tokens: np.ndarray
  source: np.ndarray
  turn: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  expert_ids: np.ndarray
  drift: int

  @property
  def prompt_length(self) -> int:
    return int(np.argmax(self.source != Source.PROMPT)) if np.any(self.source != Source.PROMPT) else len(self.source)

  @property
  def model_tokens(self) -> int:
    """Action tokens (turns and summaries)."""
    return int(np.sum(np.isin(self.source, ACTIONS)))

  @property
  def summary_tokens(self) -> int:
    return int(np.sum(self.source == Source.SUMMARY))

  def row(self, seq_len: int, summary_tokens: SummaryTokens = SummaryTokens.TRAINED) -> dict[str, np.ndarray]:
    """The buffer row's token fields padded to `seq_len`: tokens, loss_mask, behaviour_logprobs, policy_version,
    source, turn [T] and expert_ids [Lm, T, K]. loss_mask is 1 on the actions (without the summary's tokens under
    `SummaryTokens.MASKED`); the log-probs and versions stay on every action, masked or not."""
    n = len(self.tokens)
    if n > seq_len:
      raise ValueError(f"A {n}-token trajectory does not fit a {seq_len}-token buffer row; the buffer's seq_len "
                       "must be at least the engine's context.")

    def pad(a, dtype):
      out = np.zeros((seq_len,) + a.shape[1:], dtype)
      out[:n] = a
      return out

    action = np.isin(self.source, ACTIONS)
    trained = action & ~((self.source == Source.SUMMARY) & (SummaryTokens(summary_tokens) is SummaryTokens.MASKED))
    ids = np.zeros((self.expert_ids.shape[0], seq_len, self.expert_ids.shape[2]), np.int32)
    ids[:, :n] = self.expert_ids
    return {"tokens": pad(self.tokens, np.int32), "loss_mask": pad(trained, np.float32),
            "behaviour_logprobs": pad(np.where(action, self.logprobs, 0.0), np.float32),
            "policy_version": pad(np.where(action, self.versions, 0), np.int32),
            "source": pad(self.source, np.int32), "turn": pad(self.turn, np.int32), "expert_ids": ids}

  def boundaries(self) -> list[tuple[int, int, Source, int]]:
    """Runs of one source and turn as (start, end, source, turn): the turn boundaries of an inspection."""
    out, start = [], 0
    for i in range(1, len(self.tokens) + 1):
      if i == len(self.tokens) or self.source[i] != self.source[start] or self.turn[i] != self.turn[start]:
        out.append((start, i, Source(int(self.source[start])), int(self.turn[start])))
        start = i
    return out


@dataclasses.dataclass(frozen=True)
class Trajectory(Segment):
  """One finished episode: its last segment (the fields of `Segment`) and the episode's own fields.

  Attributes:
    turns: model turns taken (summaries included).
    end: why the episode ended.
    reward_terms: the environment's raw reward terms (the whole chain's: every segment gets them).
    retokenized_turns: model turns whose decoded text re-encodes to other ids.
    tool_seconds: wall time of this episode's tool calls (reset, steps and grading).
    earlier: the segments before the last, oldest first (one per summary written; empty without summaries).
  """

  turns: int = 0
  end: EpisodeEnd = EpisodeEnd.FINISHED
  reward_terms: Mapping[str, float] = dataclasses.field(default_factory=dict)
  retokenized_turns: int = 0
  tool_seconds: float = 0.0
  earlier: tuple[Segment, ...] = ()

  @property
  def cut(self) -> bool:
    """The episode was cut by a budget (the overlong policy of `RLConfig` applies to it)."""
    return self.end is not EpisodeEnd.FINISHED

  @property
  def segments(self) -> tuple[Segment, ...]:
    """The chain, oldest first; the last is this trajectory's own ledger."""
    last = Segment(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Segment)})
    return self.earlier + (last,)

  @property
  def compactions(self) -> int:
    """Summaries that started a new segment."""
    return len(self.earlier)

  @property
  def episode_summary_tokens(self) -> int:
    """Summary tokens over the whole chain (a summary that overran its budget is in the last segment)."""
    return sum(s.summary_tokens for s in self.segments)

  def rows(self, seq_len: int, summary_tokens: SummaryTokens = SummaryTokens.TRAINED) -> list[dict[str, np.ndarray]]:
    """One buffer row per segment, oldest first (`Segment.row`)."""
    return [s.row(seq_len, summary_tokens) for s in self.segments]
