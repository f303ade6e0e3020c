"""Counter-based random bits for stochastic rounding: the bits of element (row, col) are a hash of
(key words, row, col), so they depend on neither the sharding nor the tile shape nor the rest of the batch.

Plain uint32 arithmetic (multiply, xor, shift), so the same functions run in the jnp reference, inside a Pallas
kernel body, and under `interpret=True`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Odd constants from MurmurHash3's finalizer and the golden ratio: any odd multipliers would do.
_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35
_GOLDEN = 0x9E3779B9


def mix32(h: jax.Array) -> jax.Array:
  """MurmurHash3's 32-bit finalizer: a bijection on uint32 with full avalanche."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(_M1)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(_M2)
  return h ^ (h >> 16)


def row_seeds(key: jax.Array, rows: int) -> jax.Array:
  """Per-row seed words for `rows` rows from one PRNG key or from one key per row.

  Args:
    key: a single PRNG key (typed or raw uint32[2]): row r then draws from (key, r), its global row index; or
      an array of `rows` keys (shape [rows] typed, or [rows, 2] raw): row r draws from its own key, whatever
      its position in the batch.

  Returns:
    uint32 [rows, 2].
  """
  typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
  if key.ndim > (0 if typed else 1):
    keys = key.reshape(rows) if typed else key.reshape(rows, key.shape[-1])
    return jax.vmap(lambda k: jax.random.bits(k, (2,), jnp.uint32))(keys)
  words = jax.random.bits(key, (2,), jnp.uint32)
  r = jnp.arange(rows, dtype=jnp.uint32)
  w0 = jnp.broadcast_to(words[0], (rows,))
  w1 = mix32(words[1] ^ mix32(r * jnp.uint32(_GOLDEN) + jnp.uint32(1)))
  return jnp.stack([w0, w1], axis=-1)


def element_bits(seed0: jax.Array, seed1: jax.Array, col: jax.Array) -> jax.Array:
  """32 random bits for column `col` of a row with seed words (seed0, seed1); broadcasts.

  Args:
    seed0, seed1: uint32 row seed words (from `row_seeds`).
    col: uint32 global column index.

  Returns:
    uint32 bits.
  """
  return mix32(seed0 ^ mix32(seed1 ^ (col * jnp.uint32(_M1) + jnp.uint32(_GOLDEN))))


def uniform_from_bits(bits: jax.Array) -> jax.Array:
  """A float32 in [0, 1) on the 2^-24 grid (the top 24 bits): exact, so thresholds compare the same everywhere."""
  return (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
