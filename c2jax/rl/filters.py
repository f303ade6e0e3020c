"""Plausibility filtering of tokens whose trainer and actor probabilities disagree (report section 4).

The actor samples with one numerical engine and the trainer recomputes log-probs with another (different kernels,
batch shapes, precisions; MoE routing flips). Where the two disagree beyond a threshold the token's gradient is
noise, or worse: a token the actor sampled at probability 1e-3 that the trainer puts at 1e-9 gets a huge ratio.
Such tokens are dropped from the loss (their contribution zeroed; normalizers unchanged, see `policy_loss`).

A token t is implausible when

  pi_theta(x_t) / mu(x_t) < min_ratio  or  > max_ratio      (the trainer / actor probability ratio), or
  pi_theta(x_t) < min_prob                                  (a token the trainer finds implausible outright)

FilterMode.TOKEN drops those tokens; FilterMode.SEQUENCE drops whole sequences in which more than
`sequence_max_fraction` of the action tokens are implausible (0: any implausible token drops its sequence). A
sequence is a row of a padded batch or a segment of a packed one (`c2jax.rl.batch`).
"""

from __future__ import annotations

import dataclasses
import enum
import math

import jax
import jax.numpy as jnp


class FilterMode(enum.Enum):
  NONE = "none"
  TOKEN = "token"
  SEQUENCE = "sequence"


@dataclasses.dataclass(frozen=True)
class PlausibilityFilter:
  """Thresholds of the plausibility filter (see the module docstring).

  Attributes:
    mode: NONE, TOKEN or SEQUENCE.
    min_ratio / max_ratio: the band of pi_theta / mu that is kept.
    min_prob: the smallest trainer probability kept (0 disables).
    sequence_max_fraction: in SEQUENCE mode, the largest fraction of implausible action tokens a row may have.
  """

  mode: FilterMode = FilterMode.TOKEN
  min_ratio: float = 0.5
  max_ratio: float = 2.0
  min_prob: float = 0.0
  sequence_max_fraction: float = 0.0

  def __post_init__(self):
    if not 0 < self.min_ratio <= 1 <= self.max_ratio:
      raise ValueError(f"Plausibility band [{self.min_ratio}, {self.max_ratio}] must satisfy 0 < min_ratio <= 1 <= "
                       "max_ratio.")
    if not 0 <= self.min_prob < 1 or not 0 <= self.sequence_max_fraction < 1:
      raise ValueError("min_prob and sequence_max_fraction must lie in [0, 1).")


def plausible(logp: jax.Array, behaviour_logp: jax.Array, mask: jax.Array, f: PlausibilityFilter,
              sequence: jax.Array | None = None, n_seq: int = 0) -> jax.Array:
  """[B, T] float32 keep-weights in {0, 1} (1 off the mask: only action tokens are ever filtered).

  Args:
    logp: [B, T] trainer log-probs (no gradient is taken through the decision).
    behaviour_logp: [B, T] actor sampling log-probs.
    mask: [B, T] action mask.
    f: the thresholds.
    sequence: [B, T] each token's sequence in [0, n_seq), -1 on padding (`c2jax.rl.batch.sequence_index`); None:
      one sequence per row. Only FilterMode.SEQUENCE reads it.
    n_seq: the number of sequences `sequence` indexes.
  """
  if f.mode is FilterMode.NONE:
    return jnp.ones_like(mask)
  logp = jax.lax.stop_gradient(logp)
  log_ratio = logp - behaviour_logp
  # Written as "not inside" so that NaN log-probs (a broken actor row) count as implausible.
  bad = ~((log_ratio >= math.log(f.min_ratio)) & (log_ratio <= math.log(f.max_ratio)))
  if f.min_prob > 0:
    bad = bad | ~(logp >= math.log(f.min_prob))
  bad = bad & (mask > 0)
  if f.mode is FilterMode.TOKEN:
    return 1.0 - bad.astype(jnp.float32)
  if sequence is None:
    b, t = mask.shape
    sequence, n_seq = jnp.broadcast_to(jnp.arange(b)[:, None], (b, t)), b
  inside = sequence >= 0
  idx = jnp.maximum(sequence, 0).reshape(-1)
  count = lambda x: jax.ops.segment_sum(jnp.where(inside, x, 0).astype(jnp.float32).reshape(-1), idx,
                                        num_segments=n_seq)
  fraction = count(bad) / jnp.maximum(count(mask > 0), 1.0)
  drop = (fraction > f.sequence_max_fraction)[idx].reshape(mask.shape) & inside
  return 1.0 - drop.astype(jnp.float32)
