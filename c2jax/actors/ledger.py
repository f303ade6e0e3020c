"""A trajectory's token ledger: every position of a multi-turn episode with where it came from, which turn, which
weights drew it, its behaviour log-prob and its routing (report section 4: RL trains on what the agent actually
sampled, with routing replay over every position).

  traj.tokens[i], traj.source[i] (Source), traj.turn[i], traj.logprobs[i], traj.versions[i], traj.expert_ids[:, i]
  row = traj.row(seq_len)             # the buffer row: loss_mask = (source == MODEL), padded to seq_len

The ledger is built from ids only: sampled ids are read from the engine and never decoded and re-encoded; each
observation is tokenized once, when it is appended. `drift` counts positions where the ledger and the tokens the
engine fed to the model disagree (0 by construction; tested), `retokenized_turns` the model turns whose text would
not tokenize back to the sampled ids (what a pipeline that re-tokenizes the conversation would have trained on
wrongly; information only).

Turn indices: the prompt and the model's first turn are turn 0; the observation answering turn t (its tool
results) and the budget notice after it carry t, and the model's next turn t + 1.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Mapping

import numpy as np


class Source(enum.IntEnum):
  """Where a token of a trajectory came from; only MODEL tokens are actions (in the loss mask)."""

  PROMPT = 0
  MODEL = 1
  OBSERVATION = 2
  NOTICE = 3


class EpisodeEnd(enum.Enum):
  """Why an episode ended. FINISHED: the environment ended it (the agent called finish, or a one-turn episode's
  turn ended on a stop token); every other end is a budget's cut (`Trajectory.cut`)."""

  FINISHED = "finished"
  TURN_BUDGET = "turn_budget"
  TOKEN_BUDGET = "token_budget"
  CONTEXT = "context"
  TOOL_TIME = "tool_time"
  WORKDIR_LIMIT = "workdir_limit"

  @classmethod
  def from_env(cls, reason: str) -> EpisodeEnd:
    """The end of a `CodingEnv` done_reason ("finish", "turn_budget", "token_budget", "time_budget",
    "workdir_limit")."""
    return {"finish": cls.FINISHED, "time_budget": cls.TOOL_TIME}.get(reason) or cls(reason)


@dataclasses.dataclass(frozen=True)
class Trajectory:
  """One finished episode.

  Attributes:
    tokens: [n] int32 every position, prompt first.
    source: [n] int8 `Source` of each position.
    turn: [n] int32 turn index of each position (module docstring).
    logprobs: [n] float32 behaviour log-probs of MODEL tokens (0 elsewhere).
    versions: [n] int32 weights version that drew each MODEL token (0 elsewhere).
    expert_ids: [Lm, n, K] int32 routed experts of every position.
    turns: model turns taken.
    end: why the episode ended.
    reward_terms: the environment's raw reward terms.
    drift: positions where the ledger and the engine's tokens differ (0).
    retokenized_turns: model turns whose decoded text re-encodes to other ids.
    tool_seconds: wall time of this episode's tool calls (reset, steps and grading).
  """

  tokens: np.ndarray
  source: np.ndarray
  turn: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  expert_ids: np.ndarray
  turns: int
  end: EpisodeEnd
  reward_terms: Mapping[str, float]
  drift: int = 0
  retokenized_turns: int = 0
  tool_seconds: float = 0.0

  @property
  def cut(self) -> bool:
    """The episode was cut by a budget (the overlong policy of `RLConfig` applies to it)."""
    return self.end is not EpisodeEnd.FINISHED

  @property
  def prompt_length(self) -> int:
    return int(np.argmax(self.source != Source.PROMPT)) if np.any(self.source != Source.PROMPT) else len(self.source)

  @property
  def model_tokens(self) -> int:
    return int(np.sum(self.source == Source.MODEL))

  def row(self, seq_len: int) -> dict[str, np.ndarray]:
    """The buffer row's token fields padded to `seq_len`: tokens, loss_mask, behaviour_logprobs, policy_version,
    source, turn [T] and expert_ids [Lm, T, K]."""
    n = len(self.tokens)
    if n > seq_len:
      raise ValueError(f"A {n}-token trajectory does not fit a {seq_len}-token buffer row; the buffer's seq_len "
                       "must be at least the engine's context.")

    def pad(a, dtype):
      out = np.zeros((seq_len,) + a.shape[1:], dtype)
      out[:n] = a
      return out

    model = self.source == Source.MODEL
    ids = np.zeros((self.expert_ids.shape[0], seq_len, self.expert_ids.shape[2]), np.int32)
    ids[:, :n] = self.expert_ids
    return {"tokens": pad(self.tokens, np.int32), "loss_mask": pad(model, np.float32),
            "behaviour_logprobs": pad(np.where(model, self.logprobs, 0.0), np.float32),
            "policy_version": pad(np.where(model, self.versions, 0), np.int32),
            "source": pad(self.source, np.int32), "turn": pad(self.turn, np.int32), "expert_ids": ids}

  def boundaries(self) -> list[tuple[int, int, Source, int]]:
    """Runs of one source and turn as (start, end, source, turn): the turn boundaries of an inspection."""
    out, start = [], 0
    for i in range(1, len(self.tokens) + 1):
      if i == len(self.tokens) or self.source[i] != self.source[start] or self.turn[i] != self.turn[start]:
        out.append((start, i, Source(int(self.source[start])), int(self.turn[start])))
        start = i
    return out
