"""Random Hadamard transform (RHT) in 16 x 16 blocks along the contraction axis, for weight-gradient operands.

Each block of 16 elements v along `axis` becomes v @ M with M = diag(s) H_16 / 4, H_16 the Sylvester Hadamard
matrix and s fixed random signs drawn from `seed`. M is orthonormal (M M^T = I), so transforming both operands of
a matmul along their shared contraction axis leaves the product unchanged, while spreading outliers across the
block before a 4-bit cast (as TransformerEngine's NVFP4 recipe does for wgrad with its 16-point RHT).
Pure jnp: a [.., 16] x [16, 16] contraction that XLA fuses; no kernel is warranted.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

HADAMARD_BLOCK = 16


def _mix32(h: np.ndarray) -> np.ndarray:
  """numpy twin of `random_bits.mix32` (the signs are fixed host-side constants)."""
  h = h.astype(np.uint64) & 0xFFFFFFFF
  h ^= h >> 16
  h = (h * 0x85EBCA6B) & 0xFFFFFFFF
  h ^= h >> 13
  h = (h * 0xC2B2AE35) & 0xFFFFFFFF
  h ^= h >> 16
  return h


def hadamard_signs(seed: int) -> np.ndarray:
  """The 16 fixed random signs (+-1.0, float32) for `seed`: a pure function of the seed, on every platform."""
  i = np.arange(HADAMARD_BLOCK, dtype=np.uint64)
  h = _mix32(_mix32(i * 0x9E3779B9 + 1) ^ (seed & 0xFFFFFFFF))
  return np.where(h & 1, -1.0, 1.0).astype(np.float32)


def hadamard_matrix(seed: int) -> np.ndarray:
  """M = diag(signs(seed)) @ H_16 / 4: float32 [16, 16], orthonormal."""
  h = np.ones((1, 1), np.float32)
  while h.shape[0] < HADAMARD_BLOCK:
    h = np.block([[h, h], [h, -h]])
  return (hadamard_signs(seed)[:, None] * h / np.float32(4.0)).astype(np.float32)


def _blocked_apply(x: jax.Array, m: np.ndarray, axis: int) -> jax.Array:
  if not -x.ndim <= axis < x.ndim:
    raise ValueError(f"Hadamard axis {axis} is out of range for a rank-{x.ndim} input; pass an axis in range.")
  axis %= x.ndim
  if x.shape[axis] % HADAMARD_BLOCK:
    raise ValueError(f"The Hadamard transform needs dimension {axis} of shape {x.shape} to be a multiple of "
                     f"{HADAMARD_BLOCK}; pad that axis.")
  moved = jnp.moveaxis(x, axis, -1)
  blocks = moved.reshape(*moved.shape[:-1], moved.shape[-1] // HADAMARD_BLOCK, HADAMARD_BLOCK)
  y = jnp.einsum("...gi,ij->...gj", blocks.astype(jnp.float32), jnp.asarray(m),
                 precision=jax.lax.Precision.HIGHEST)
  return jnp.moveaxis(y.reshape(moved.shape), -1, axis).astype(x.dtype)


@functools.partial(jax.jit, static_argnames=("axis", "seed"))
def random_hadamard(x: jax.Array, axis: int = -1, seed: int = 0) -> jax.Array:
  """Applies the blockwise random Hadamard transform along `axis` (a multiple of 16), in float32.

  Args:
    x: any-rank array; apply it to both matmul operands along their contraction axis.
    axis: the contraction axis.
    seed: picks the random signs (use the same seed for both operands).

  Returns:
    Array of x's shape and dtype.
  """
  return _blocked_apply(x, hadamard_matrix(seed), axis)


@functools.partial(jax.jit, static_argnames=("axis", "seed"))
def inverse_random_hadamard(y: jax.Array, axis: int = -1, seed: int = 0) -> jax.Array:
  """Inverse of `random_hadamard` (multiplies the blocks by M^T)."""
  return _blocked_apply(y, hadamard_matrix(seed).T, axis)
