"""RMSNorm as in DeepSeek-V3 / HF `DeepseekV3RMSNorm`."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The latent norms inside MLA (q_a_layernorm, kv_a_layernorm) use this eps whatever `rms_norm_eps` says:
# DeepSeek-V3's reference code (and HF) construct them with the default eps.
LATENT_NORM_EPS = 1e-6


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """weight * x / sqrt(mean(x^2) + eps), normalized in float32 and cast back before the weight (as HF).

  Args:
    x: [..., D] activations.
    weight: [D] scale.
    eps: added to the mean square.
  Returns:
    [..., D] in x's dtype (promoted with weight's).
  """
  xf = x.astype(jnp.float32)
  normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * normed.astype(x.dtype)
