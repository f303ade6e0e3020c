"""Reward composition for RL: weighted reward terms and the nonlinear length penalty (report section 4).

The environment reports raw reward signals per chain (`batch["reward_terms"]`, see c2jax/rl/batch.py): the task
outcome, plus the report's auxiliary signals for coding style, communication, and incomplete or malformed tool
calls. Signals are reported as they are measured (`malformed_tool_calls` is a count, not a penalty); the
configured weight gives each its sign and size, so penalizing malformed calls is a negative weight:

  R = sum_i w_i * terms_i  -  lambda * C_{k,q}(x),        x = chain response tokens / scale

  C_{k,q}(x) = ((1 + k x)^(1 - q) - 1) / (k (1 - q))       (report section 4, "nonlinear length penalty")

C is concave for q > 0 (its slope (1 + k x)^-q falls with length), so the first tokens cost the most: easy tasks
are pushed to be solved quickly while hard tasks can still afford to think longer. Its limits are
log(1 + k x) / k as q -> 1 and x (a linear penalty) as k -> 0.

An ablation is a config override (`--config.rl.reward.weights.style=0.1`); from plain data:

  cfg = typed_config.from_plain(RewardConfig(), {"weights": {"outcome": 1.0, "style": 0.1,
                                                             "malformed_tool_calls": -0.05},
                                                 "length_penalty": {"weight": 0.1, "k": 1.0, "q": 0.5}}, "reward")
  out = compose_rewards(batch["reward_terms"], chain_lengths, cfg)   # cfg is hashable: a static jit argument
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Mapping

import jax
import jax.numpy as jnp

from c2jax.registry import Registry


@dataclasses.dataclass(frozen=True)
class RewardTerm:
  """A raw reward signal the environment reports per chain.

  Attributes:
    name: the key in `batch["reward_terms"]` and in `RewardConfig.weights`.
    doc: what it measures, its range, and which sign of weight makes sense.
  """

  name: str
  doc: str


REWARD_TERMS: Registry[RewardTerm] = Registry("reward term")


def _register_term(name: str, doc: str) -> RewardTerm:
  return REWARD_TERMS.register(name)(RewardTerm(name=name, doc=doc))


OUTCOME = _register_term("outcome", "Task success: the fraction of the task's hidden tests that pass, in [0, 1] "
                         "(the coding suites credit it: a canary passing alone costs a pass, so in [-1, 1]); "
                         "positive weight.")
STYLE = _register_term("style", "Coding-style score of the agent's changes, in [0, 1], higher is better; positive "
                       "weight.")
COMMUNICATION = _register_term("communication", "Quality of the agent's messages to the user, in [0, 1], higher is "
                               "better; positive weight.")
MALFORMED_TOOL_CALLS = _register_term("malformed_tool_calls", "Number of incomplete or malformed tool calls in the "
                                      "chain, a count >= 0; a negative weight penalizes them.")
# A detected attempt already scores outcome 0; with outcome at most 1, -1 puts one attempt as far below an honest
# failure as a full success is above it, so guessing which tests are canaries loses on average.
HACK_ATTEMPTS_WEIGHT = -1.0
HACK_ATTEMPTS = _register_term("hack_attempts", "Detected attempts to game the grader (c2jax/envs/grading/grading.py: "
                               "a canary test passed with its twin, the test framework or the judge tampered with, a "
                               "planted module, a forged report), one per kind, a count in [0, 7], 0 for an honest "
                               f"submission; a negative weight, {HACK_ATTEMPTS_WEIGHT} by default "
                               "(HACK_ATTEMPTS_WEIGHT), scores a detected attempt below an honest failure.")

LENGTH_PENALTY_PART = "length_penalty"

# Below these the closed forms lose precision (log1p(u) / k at u -> 0) or divide by zero (expm1(a) / (1 - q) at
# a -> 0), so the series take over. Truncation errors there are ~u^4 / 5 < 1e-12 and ~a^6 / 7! < 2e-10, far
# below float32 resolution, which keeps values and slopes continuous across the switch.
_U_SERIES = 1e-3
_A_SERIES = 0.1


@jax.custom_jvp
def _expm1(a: jax.Array) -> jax.Array:
  """expm1 with slope exp(a): JAX differentiates expm1 as expm1(a) + 1, which cancels to ~eps / exp(a) relative
  error for a << 0 (q > 1 at long lengths)."""
  return jnp.expm1(a)


@_expm1.defjvp
def _expm1_jvp(primals, tangents):
  (a,), (da,) = primals, tangents
  return jnp.expm1(a), jnp.exp(a) * da


def length_penalty(x: jax.Array, k: float | jax.Array, q: float | jax.Array) -> jax.Array:
  """The report's nonlinear length penalty C_{k,q}(x) = ((1 + k x)^(1 - q) - 1) / (k (1 - q)), elementwise.

  Evaluated as C = (log1p(k x) / k) * g((1 - q) log1p(k x)) with g(a) = expm1(a) / a, each factor by a series
  near its removable singularity, so values and gradients are finite and continuous at and near the limits
  q -> 1 (C = log(1 + k x) / k) and k -> 0 (C = x). The slope is dC/dx = (1 + k x)^-q > 0.

  Args:
    x: [...] lengths, >= 0 (in units of the config's `scale`).
    k: curvature k >= 0 (scalar or broadcastable to x); k = 0 is the linear penalty C = x.
    q: exponent q (scalar or broadcastable); q = 1 is the logarithmic penalty, q > 1 saturates at
      1 / (k (q - 1)).

  Returns:
    [...] float32 penalty C_{k,q}(x), 0 at x = 0.

  Raises:
    ValueError: if k is a Python number below 0.
  """
  if isinstance(k, numbers.Real) and not k >= 0:
    raise ValueError(f"Length penalty curvature k must be >= 0 (k = 0 is the linear penalty); got k = {k}.")
  x = jnp.asarray(x, jnp.float32)
  k = jnp.asarray(k, jnp.float32)
  # 1 - q in Python's float64 when q is a number: q = 1 - 1e-7 rounds to 1 - 1.19e-7 in float32.
  one_minus_q = jnp.asarray(1.0 - q, jnp.float32)

  u = k * x
  log1p_u = jnp.log1p(u)
  # h = log1p(k x) / k, the q = 1 penalty. Where u is tiny the quotient is 0 / 0 at k = 0 (or underflows), so
  # the series x (1 - u/2 + u^2/3 - u^3/4) takes over; the other branch gets safe operands so that its unused
  # gradient is finite (a NaN times the zero cotangent of jnp.where is still NaN).
  small_u = u < _U_SERIES
  h_series = x * (1.0 - u * (1.0 / 2.0 - u * (1.0 / 3.0 - u * (1.0 / 4.0))))
  h_exact = jnp.log1p(jnp.where(small_u, 1.0, u)) / jnp.where(small_u, 1.0, k)
  h = jnp.where(small_u, h_series, h_exact)

  # a = (1 - q) log1p(k x); C = h * expm1(a) / a. Near a = 0 use the series of expm1(a) / a; elsewhere
  # expm1(a) / (1 - q) / k, whose autodiff slope is a product of factors (no cancellation, unlike that of
  # expm1(a) / a). |a| >= _A_SERIES implies 1 - q != 0 and u > 0, hence k > 0, so its safe operands are exact.
  a = one_minus_q * log1p_u
  small_a = jnp.abs(a) < _A_SERIES
  g_series = 1.0 + a * (1.0 / 2 + a * (1.0 / 6 + a * (1.0 / 24 + a * (1.0 / 120 + a * (1.0 / 720)))))
  c_series = h * g_series
  c_exact = (_expm1(jnp.where(small_a, 1.0, a)) / jnp.where(small_a, 1.0, one_minus_q)
             / jnp.where(small_a, 1.0, k))
  return jnp.where(small_a, c_series, c_exact)


@dataclasses.dataclass(frozen=True)
class LengthPenaltyConfig:
  """The length penalty's term in the reward: - weight * C_{k,q}(chain response tokens / scale).

  Attributes:
    weight: lambda >= 0, the penalty's weight (it is subtracted); 0 disables it.
    k: curvature k >= 0 of C_{k,q}; k -> 0 is linear in length.
    q: exponent q of C_{k,q}; 0 < q < 1 grows sublinearly, q = 1 logarithmically, q > 1 saturates.
    scale: tokens per unit of x (x = tokens / scale), so that k and q read the same at any budget.
  """

  weight: float = 0.0
  k: float = 1.0
  q: float = 0.5
  scale: float = 1000.0

  def __post_init__(self):
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if not isinstance(v, numbers.Real) or not math.isfinite(v):
        raise ValueError(f"Length penalty {f.name} must be a finite number; got {v!r}.")
      object.__setattr__(self, f.name, float(v))  # ints from overrides would change the hash and the trace
    if self.weight < 0:
      raise ValueError(f"Length penalty weight must be >= 0 (the penalty is subtracted from the reward); got "
                       f"{self.weight}.")
    if self.k < 0:
      raise ValueError(f"Length penalty k must be >= 0 (k = 0 is the linear penalty); got {self.k}.")
    if self.scale <= 0:
      raise ValueError(f"Length penalty scale must be > 0 tokens; got {self.scale}.")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """How the reward is composed from the environment's raw terms (report section 4).

  Tuples of pairs rather than dicts, so that the config is hashable and can be a static jit argument.

  Attributes:
    weights: (term name, w_i) pairs, names from `REWARD_TERMS`; the sign of w_i gives the term's direction.
      A term with weight 0 is disabled and need not be in the batch.
    length_penalty: the length penalty lambda * C_{k,q}(x).
  """

  weights: tuple[tuple[str, float], ...] = (("outcome", 1.0),)
  length_penalty: LengthPenaltyConfig = LengthPenaltyConfig()

  def __post_init__(self):
    pairs = self.weights.items() if isinstance(self.weights, Mapping) else self.weights
    weights = []
    for pair in pairs:
      if len(pair) != 2:
        raise ValueError(f"Reward weights must be (term name, weight) pairs; got {pair!r}.")
      name, w = pair
      if name not in REWARD_TERMS:
        raise ValueError(f"Reward config weights an unknown reward term {name!r}; known: "
                         f"{', '.join(REWARD_TERMS.names())}.")
      if not isinstance(w, numbers.Real) or not math.isfinite(w):
        raise ValueError(f"Reward weight of {name!r} must be a finite number; got {w!r}.")
      weights.append((name, float(w)))
    names = [n for n, _ in weights]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
      raise ValueError(f"Reward config weights {', '.join(map(repr, dup))} more than once; give each term once.")
    object.__setattr__(self, "weights", tuple(weights))
    if isinstance(self.length_penalty, Mapping):
      object.__setattr__(self, "length_penalty", LengthPenaltyConfig(**self.length_penalty))



@dataclasses.dataclass(frozen=True)
class RewardOutput:
  """The composed reward and its pieces, for the advantage and for logging (all [B] float32).

  Attributes:
    total: R = sum_i w_i * terms_i - lambda * C_{k,q}(x); equals the sum of `parts`.
    parts: the signed contribution of each configured term (w_i * terms_i, zeros for weight 0) and of the
      length penalty under "length_penalty" (- lambda * C, zeros when disabled).
    raw: every term present in the batch, unweighted (configured or not), for logging.
  """

  total: jax.Array
  parts: dict[str, jax.Array]
  raw: dict[str, jax.Array]


jax.tree_util.register_dataclass(RewardOutput, data_fields=["total", "parts", "raw"], meta_fields=[])


def compose_rewards(terms: Mapping[str, jax.Array], chain_lengths: jax.Array, cfg: RewardConfig) -> RewardOutput:
  """Composes the per-sequence reward from the raw terms and the chain's length (report section 4).

  Args:
    terms: {name: [N]} raw signals of each sequence's chain (`batch["reward_terms"]`); names from `REWARD_TERMS`.
    chain_lengths: [N] response tokens of each sequence's whole chain (all its self-summary segments), e.g.
      `segment_sum_by(batch["chain_id"], per_sequence_sum(action_mask(batch), batch), row_valid(batch))` from
      c2jax/rl/batch.py.
    cfg: the reward config (static under jit).

  Returns:
    RewardOutput with total, parts and raw, all [N] float32.

  Raises:
    ValueError: for a term name not in `REWARD_TERMS`, a term with nonzero weight missing from `terms`, or
      arrays whose shapes are not [B].
  """
  for name in terms:
    if name not in REWARD_TERMS:
      raise ValueError(f"Reward term {name!r} in the batch is not registered; known: "
                       f"{', '.join(REWARD_TERMS.names())} (register new terms in c2jax/rl/rewards.py).")
  b_shape = tuple(jnp.shape(chain_lengths))
  if len(b_shape) != 1:
    raise ValueError(f"chain_lengths must have shape [B]; got {b_shape}.")
  for name, v in terms.items():
    if tuple(jnp.shape(v)) != b_shape:
      raise ValueError(f"Reward term {name!r} has shape {tuple(jnp.shape(v))}; expected [B] = {b_shape} like "
                       f"chain_lengths.")
  raw = {name: jnp.asarray(v, jnp.float32) for name, v in terms.items()}
  zeros = jnp.zeros(b_shape, jnp.float32)

  parts = {}
  for name, w in cfg.weights:
    if w == 0.0:
      parts[name] = zeros
      continue
    if name not in raw:
      raise ValueError(f"Reward term {name!r} has weight {w} but the batch reports only "
                       f"{', '.join(sorted(raw)) or 'no terms'}; report it from the environment or set its weight "
                       f"to 0.")
    parts[name] = w * raw[name]

  lp = cfg.length_penalty
  if lp.weight == 0.0:
    parts[LENGTH_PENALTY_PART] = zeros
  else:
    x = jnp.asarray(chain_lengths, jnp.float32) / lp.scale
    parts[LENGTH_PENALTY_PART] = -lp.weight * length_penalty(x, lp.k, lp.q)

  total = zeros
  for v in parts.values():
    total = total + v
  return RewardOutput(total=total, parts=parts, raw=raw)
