"""KL regularization to a reference policy: estimators (registered by name) and where they enter (report section 4).

Per token, with x sampled from the policy and log r = log pi_ref(x) - log pi(x) (Schulman's notation, r = pi_ref/pi):

  k1 = -log r                  unbiased for KL(pi || pi_ref); high variance but no exp (the report's choice:
                               "chosen to avoid variance blow-up")
  k2 = (log r)^2 / 2           biased, low variance
  k3 = r - 1 - log r           unbiased and >= 0, but r = exp(log r) blows up where pi << pi_ref

Placement (`KlPlacement`) matters as much as the estimator, because an estimator's *value* being unbiased says
nothing about its *gradient* when x is sampled from pi itself:

  IN_REWARD               r_i <- r_i - beta sum_t k(x_t), with log r from the behaviour log-probs (no gradient);
                          the policy gradient then optimizes -beta KL(pi || pi_ref). With k1 this is the classic
                          RLHF form (Ziegler et al. 2019) and is exact in expectation.
  LOSS                    loss += beta sum_t w_t k(x_t) with gradient through log pi only. On-policy the expected
                          gradients are: k1 -> 0 (E_pi[grad log pi] = 0: a no-op!), k2 -> grad KL(pi || pi_ref),
                          k3 -> grad KL(pi_ref || pi) (the other direction). Kept for ablations.
  LOSS_STRAIGHT_THROUGH   loss += beta sum_t w_t sg(rho) (k + sg(k) (log pi - sg(log pi))): value rho k,
                          gradient sg(rho) (grad k + k grad log pi), the score-function gradient of E_pi[k];
                          with k1 or k3 its expectation is exactly grad KL(pi || pi_ref), also off-policy
                          through rho = pi/mu (mu: the behaviour policy).

tests/rl/formulas_test.py checks these expectations exactly by enumerating a categorical distribution.
"""

from __future__ import annotations

import enum
from typing import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from c2jax.registry import Registry


class KlPlacement(enum.Enum):
  """Where the KL estimator enters the update; see the module docstring."""

  NONE = "none"
  IN_REWARD = "in_reward"
  LOSS = "loss"
  LOSS_STRAIGHT_THROUGH = "loss_straight_through"


KL_ESTIMATORS: Registry[Callable[[jax.Array], jax.Array]] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1(log_r: jax.Array) -> jax.Array:
  """k1 = -log r."""
  return -log_r


@KL_ESTIMATORS.register("k2")
def k2(log_r: jax.Array) -> jax.Array:
  """k2 = (log r)^2 / 2."""
  return 0.5 * jnp.square(log_r)


@KL_ESTIMATORS.register("k3")
def k3(log_r: jax.Array) -> jax.Array:
  """k3 = r - 1 - log r (expm1 keeps it accurate, and >= 0, near r = 1)."""
  return jnp.expm1(log_r) - log_r


def kl_estimate(name: str, logp: ArrayLike, ref_logp: ArrayLike) -> jax.Array:
  """Per-token estimate of KL(pi || pi_ref) at sampled tokens: logp, ref_logp [...] -> [...]."""
  return KL_ESTIMATORS.get(name)(jnp.asarray(ref_logp) - jnp.asarray(logp))


def kl_loss_term(name: str, placement: KlPlacement, logp: jax.Array, ref_logp: jax.Array,
                 behaviour_logp: jax.Array) -> jax.Array:
  """The per-token KL loss term for the LOSS placements (before beta and the aggregation weights).

  Args:
    name: estimator name (k1, k2, k3).
    placement: LOSS or LOSS_STRAIGHT_THROUGH.
    logp: [...] the trainer's log-probs (differentiated).
    ref_logp: [...] the reference policy's log-probs (constant).
    behaviour_logp: [...] the sampling log-probs (constant), for the straight-through importance weight.
  """
  ref_logp = jax.lax.stop_gradient(ref_logp)
  k = kl_estimate(name, logp, ref_logp)
  if placement is KlPlacement.LOSS:
    return k
  if placement is KlPlacement.LOSS_STRAIGHT_THROUGH:
    rho = jax.lax.stop_gradient(jnp.exp(jnp.clip(logp - behaviour_logp, -20.0, 20.0)))
    return rho * (k + jax.lax.stop_gradient(k) * (logp - jax.lax.stop_gradient(logp)))
  raise ValueError(f"kl_loss_term is for the LOSS placements, not {placement}.")
