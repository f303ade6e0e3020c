"""Tasks as the actors see them: a prompt to sample from and a verifier that turns samples into reward terms.

  suite = TASK_SUITES.get("char_class")(seed=0)
  task = suite.task("train", 17)                  # deterministic from (seed, split, index)
  terms = suite.reward(task, generated_tokens)    # {"outcome": 0.75, ...}: the raw reward terms of one sample
  many = rewards(suite, [task] * 8, samples)     # the same for many samples, `suite.reward_workers` at a time

A suite is registered by name, so a run config picks it with `--config.task.suite=<name>`. The verifier returns
the environment's raw signals (names from `c2jax.rl.rewards.REWARD_TERMS`); their weighting happens in the trainer
(report section 4: the reward is composed there, so ablations do not touch the environment).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Mapping, Protocol, Sequence

import numpy as np

from c2jax.registry import Registry

SPLITS = ("train", "heldout")


@dataclasses.dataclass(frozen=True)
class TokenTask:
  """One task instance.

  Attributes:
    task_id: unique within its suite and seed, stable across processes (it names the group in the buffer).
    prompt: the prompt's token ids.
    text: the prompt as text, for logs and inspection.
  """

  task_id: str
  prompt: tuple[int, ...]
  text: str = ""


class TokenTaskSuite(Protocol):
  """What an actor needs from a suite of verifiable tasks.

  A suite whose `reward` reports more than "outcome" names its terms in a tuple attribute `reward_terms` (names from
  c2jax.rl.rewards.REWARD_TERMS): they are what the rollout buffer stores and the RL run logs and may weight
  (`reward_terms(suite)`).
  """

  name: str

  def size(self, split: str) -> int:
    """How many distinct tasks the split holds."""

  def task(self, split: str, index: int) -> TokenTask:
    """The task `index` (taken modulo `size(split)`) of `split`."""

  def reward(self, task: TokenTask, generated: np.ndarray) -> Mapping[str, float]:
    """The raw reward terms of one sample; `generated` [N] holds the sampled tokens (without the prompt).

    A suite whose verifier waits on something outside the process (a sandbox, a judge) may declare an int
    attribute `reward_workers` > 1: `rewards` then calls `reward` from that many threads at once.
    """


DEFAULT_REWARD_TERMS = ("outcome",)


def reward_terms(suite: TokenTaskSuite) -> tuple[str, ...]:
  """The reward terms every sample of `suite` reports (its `reward_terms`, else just "outcome")."""
  return tuple(getattr(suite, "reward_terms", DEFAULT_REWARD_TERMS))


def rewards(suite: TokenTaskSuite, tasks: Sequence[TokenTask],
            generated: Sequence[np.ndarray]) -> list[Mapping[str, float]]:
  """`suite.reward` of each (task, sample) pair, in order; `getattr(suite, "reward_workers", 1)` at a time.

  Coding suites grade each sample in its own sandbox processes, so threads overlap their start-up and the tests'
  run time (c2jax/envs/coding_rl.py); pure-Python verifiers keep the default of one.
  """
  if len(tasks) != len(generated):
    raise ValueError(f"{len(tasks)} tasks for {len(generated)} samples.")
  workers = int(getattr(suite, "reward_workers", 1))
  if workers <= 1 or len(tasks) <= 1:
    return [suite.reward(t, g) for t, g in zip(tasks, generated)]
  with concurrent.futures.ThreadPoolExecutor(min(workers, len(tasks)), thread_name_prefix="reward") as pool:
    return list(pool.map(suite.reward, tasks, generated))


TASK_SUITES: Registry = Registry("task suite")


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"Unknown split {split!r}; use one of {', '.join(SPLITS)}.")
