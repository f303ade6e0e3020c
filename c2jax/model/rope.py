"""Rotary position embedding of MLA's decoupled rope dims, with YaRN context extension.

Frequencies follow HF `_compute_yarn_parameters` exactly (the DeepSeek-V3 / Kimi-K2 release semantics), so that
converted checkpoints reproduce HF logits. YaRN (Peng et al. 2023) interpolates low frequencies by `factor`,
keeps high ones, ramps between dims [low, high] found from beta_fast/beta_slow rotations, and scales cos/sin by
an attention factor. Kimi K2.5 uses YaRN to reach long contexts (report section 3: 256K extension phase).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.config import RopeConfig, RopeLayout, RopeType, yarn_mscale


def inv_frequencies(rope: RopeConfig, dim: int) -> tuple[np.ndarray, float]:
  """Inverse frequencies [R/2] (float32, numpy: a trace-time constant) and the cos/sin attention factor."""
  base = rope.theta
  pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
  inv_extra = 1.0 / pos_freqs
  if rope.type is RopeType.DEFAULT:
    return inv_extra.astype(np.float32), 1.0

  factor = rope.factor
  if rope.attention_factor is not None:
    attention_factor = float(rope.attention_factor)
  elif rope.mscale and rope.mscale_all_dim:
    attention_factor = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
  else:
    attention_factor = yarn_mscale(factor)

  def correction_dim(num_rotations: float) -> float:
    return (dim * math.log(rope.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
        2 * math.log(base))

  low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
  if rope.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001  # avoids a zero-width ramp, as HF does
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  extrapolation = 1 - ramp
  inv_inter = 1.0 / (factor * pos_freqs)
  inv = inv_inter * (1 - extrapolation) + inv_extra * extrapolation
  return inv.astype(np.float32), float(attention_factor)


def rope_angles(positions: jax.Array, rope: RopeConfig, dim: int) -> tuple[jax.Array, jax.Array]:
  """cos and sin tables for positions.

  Args:
    positions: [B, T] int positions.
    rope: the rope config.
    dim: R, the number of rope dims (even).
  Returns:
    (cos, sin), each [B, T, R/2] float32, already multiplied by the attention factor.
  """
  inv, attention_factor = inv_frequencies(rope, dim)
  angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv)
  return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array, layout: RopeLayout) -> jax.Array:
  """Rotates pairs of x's last dim.

  The result is laid out as [rotated firsts | rotated seconds] for both layouts (HF's interleaved variant does the
  same): attention only ever contracts q_rope with k_rope, so a common permutation of both is harmless.

  Args:
    x: [B, T, ..., R] (any number of head dims between T and R).
    cos, sin: [B, T, R/2] from `rope_angles`.
    layout: which dims form a pair.
  Returns:
    [B, T, ..., R] in x's dtype.
  """
  if layout is RopeLayout.INTERLEAVED:
    x1, x2 = x[..., 0::2], x[..., 1::2]
  else:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
  extra = x.ndim - cos.ndim
  shape = cos.shape[:2] + (1,) * extra + cos.shape[2:]
  c, s = cos.reshape(shape), sin.reshape(shape)
  x1f, x2f = x1.astype(jnp.float32), x2.astype(jnp.float32)
  out = jnp.concatenate([x1f * c - x2f * s, x2f * c + x1f * s], axis=-1)
  return out.astype(x.dtype)
