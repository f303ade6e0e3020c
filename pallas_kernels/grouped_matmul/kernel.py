"""Pallas grouped matmuls for MoE experts: rows sorted by expert, ragged group sizes.

Two kernels cover the forward and both backward products of y = x W_{g(m)} (Composer 2 report section 5):

  gmm   out [M, N] = lhs [M, K] . rhs[g(m)] [N, K]^T   (forward: rhs = W^T; d_lhs: lhs = dy, rhs = W)
  tgmm  out [E, K, N] = sum over the rows m of group e of lhs_t[:, m] rhs_t[:, m]^T   (d_rhs: lhs_t = x^T,
        rhs_t = dy^T, the contraction running over the grouped rows)

Operands are K-major (contraction last) and may be PLAIN, MXFP8 or NVFP4 (`scaled_matmul.kernel.Operand`); the
tile arithmetic is shared with the dense kernel. Group g owns rows [offsets[g], offsets[g + 1]); rows at or past
offsets[E] (padding) belong to no group and produce zeros.

gmm: one program per (row tile, column tile) owns its output tile outright (no two programs write the same
tile, so nothing races on a GPU). It loops over the groups that intersect its rows (a range computed outside
with searchsorted, so zero-size groups cost nothing) and adds each group's product masked to that group's rows.
A tile that straddles a group boundary is computed once per group it touches.

tgmm: one program per (group, K tile, N tile) walks its group's rows in row-tile-aligned chunks and masks rows
outside the group. Aligned chunks keep MXFP8 scale blocks (32 rows along the contraction) whole: a block that
straddles two groups is shared by both, which is exact because a scale factors out of every product it touches.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.formats import out_struct
from pallas_kernels.scaled_matmul.kernel import (ANY, Operand, OperandFormat, TuningConfig, check_pair,
                                                 chunk_product, compiler_params, contraction_block, epilogue,
                                                 next_pow2, pad_contraction, pad_rows,
                                                 row_block,
                                                 tile_refs)


def group_offsets(group_sizes: jax.Array) -> jax.Array:
  """[E] sizes -> [E + 1] int32 offsets (0, s_0, s_0 + s_1, ...)."""
  return jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(group_sizes.astype(jnp.int32))])


def tile_group_ranges(offsets: jax.Array, num_tiles: int, bm: int) -> tuple[jax.Array, jax.Array]:
  """For each row tile, the half-open range [lo, hi) of non-empty groups whose rows intersect it: [T], [T]."""
  starts = jnp.arange(num_tiles, dtype=jnp.int32) * bm
  # First group ending after the tile's first row; last group starting before its end (exclusive bound).
  lo = jnp.searchsorted(offsets[1:], starts, side="right").astype(jnp.int32)
  hi = jnp.searchsorted(offsets[:-1], starts + bm, side="left").astype(jnp.int32)
  return lo, jnp.maximum(lo, hi)


def _gmm_kernel(off_ref, lo_ref, hi_ref, *refs, lhs: Operand, rhs: Operand, bm: int, bn: int, bk: int, out_dtype):
  refs = list(refs)
  out_ref = refs.pop()
  a = tile_refs(lhs, refs)
  b0 = tile_refs(rhs, refs, lead=(0,))
  i, j = pl.program_id(0), pl.program_id(1)
  a_rows, b_rows = pl.ds(i * bm, bm), pl.ds(j * bn, bn)
  row_ids = i * bm + jax.lax.broadcasted_iota(jnp.int32, (bm, 1), 0)

  def group(g, acc):
    start, end = off_ref[g], off_ref[g + 1]
    b = dataclasses.replace(b0, lead=(g,))

    def step(kk, part):
      return part + chunk_product(a, a_rows, b, b_rows, kk * bk, bk)

    part = jax.lax.fori_loop(0, lhs.contraction // bk, step, jnp.zeros((bm, bn), jnp.float32))
    part = epilogue(part, a, a_rows, b, b_rows)
    return acc + jnp.where((row_ids >= start) & (row_ids < end), part, 0.0)

  acc = jax.lax.fori_loop(lo_ref[i], hi_ref[i], group, jnp.zeros((bm, bn), jnp.float32))
  out_ref[...] = acc.astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("out_dtype", "config", "interpret"))
def gmm_kernel(lhs: Operand, rhs: Operand, group_sizes: jax.Array, *, out_dtype=jnp.float32,
               config: TuningConfig = TuningConfig(), interpret: bool = False) -> jax.Array:
  """out [M, N]: row m of lhs [M, K] times rhs[g(m)] [N, K]^T, for rhs [E, N, K]; zero rows past the groups.

  Args:
    lhs: Operand [M, K] (rows sorted by group).
    rhs: Operand [E, N, K].
    group_sizes: [E] int32 rows per group (sum <= M).
    out_dtype: output dtype (accumulation is float32).
    config: tile sizes.
    interpret: run the kernel body with the Pallas interpreter (CPU).
  Returns:
    [M, N] out_dtype.
  """
  check_pair(lhs, rhs)
  m, n, k = lhs.rows, rhs.rows, lhs.contraction
  config = config.for_operand(lhs)
  bm, bn = row_block(config.block_m, m), row_block(config.block_n, n)
  bk = contraction_block(config.block_k, k, lhs.format)
  lhs, rhs = pad_rows(lhs, bm), pad_rows(rhs, bn)
  mp, np_ = lhs.rows, rhs.rows
  offsets = group_offsets(group_sizes)
  lo, hi = tile_group_ranges(offsets, mp // bm, bm)
  kernel = functools.partial(_gmm_kernel, lhs=lhs, rhs=rhs, bm=bm, bn=bn, bk=bk, out_dtype=out_dtype)
  args = (offsets, lo, hi, *lhs.arrays(), *rhs.arrays())
  out = pl.pallas_call(
      kernel, out_shape=out_struct((mp, np_), out_dtype, *args), grid=(mp // bm, np_ // bn),
      in_specs=[ANY] * len(args), out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      interpret=interpret, compiler_params=compiler_params(config, interpret), name="grouped_matmul")(*args)
  return out[:m, :n]


def _tgmm_kernel(off_ref, *refs, lhs: Operand, rhs: Operand, bm: int, bn: int, bc: int, out_dtype):
  refs = list(refs)
  out_ref = refs.pop()
  a = tile_refs(lhs, refs)
  b = tile_refs(rhs, refs)
  g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  a_rows, b_rows = pl.ds(i * bm, bm), pl.ds(j * bn, bn)
  start, end = off_ref[g], off_ref[g + 1]

  def chunk(c, acc):
    return acc + chunk_product(a, a_rows, b, b_rows, c * bc, bc, krange=(start, end))

  # Zero-size groups run no chunk (start // bc == ceil(start / bc) when start is aligned) or one masked chunk.
  acc = jax.lax.fori_loop(start // bc, (end + bc - 1) // bc, chunk, jnp.zeros((bm, bn), jnp.float32))
  out_ref[...] = jnp.where(end > start, acc, 0.0).astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("out_dtype", "config", "interpret"))
def tgmm_kernel(lhs_t: Operand, rhs_t: Operand, group_sizes: jax.Array, *, out_dtype=jnp.float32,
                config: TuningConfig = TuningConfig(), interpret: bool = False) -> jax.Array:
  """out [E, K, N] = per group e, lhs_t [K, M][:, rows_e] . rhs_t [N, M][:, rows_e]^T.

  Args:
    lhs_t: Operand [K, M], contraction over the grouped rows M (last).
    rhs_t: Operand [N, M].
    group_sizes: [E] int32 (sum <= M); columns past the groups are ignored.
    out_dtype: output dtype (accumulation is float32).
    config: block_m tiles K, block_n tiles N, block_k is the row chunk along M.
    interpret: run the kernel body with the Pallas interpreter (CPU).
  Returns:
    [E, K, N] out_dtype; zero for empty groups.
  """
  check_pair(lhs_t, rhs_t)
  if lhs_t.format is OperandFormat.NVFP4:
    raise ValueError("The transposed grouped matmul takes PLAIN or MXFP8 operands; quantize the weight-gradient "
                     "operands to MXFP8 (the recipe's backward format).")
  kdim, n, m = lhs_t.rows, rhs_t.rows, lhs_t.contraction
  e = group_sizes.shape[0]
  config = config.for_operand(lhs_t)
  bm, bn = row_block(config.block_m, kdim), row_block(config.block_n, n)
  # The grouped rows are the contraction: pad them to a power-of-two chunk (padding lies past every group).
  bc = contraction_block(config.block_k, m, lhs_t.format)
  if bc & (bc - 1):
    bc = min(config.block_k, next_pow2(m))
    lhs_t, rhs_t = pad_contraction(lhs_t, bc), pad_contraction(rhs_t, bc)
  lhs_t, rhs_t = pad_rows(lhs_t, bm), pad_rows(rhs_t, bn)
  kp, np_ = lhs_t.rows, rhs_t.rows
  kernel = functools.partial(_tgmm_kernel, lhs=lhs_t, rhs=rhs_t, bm=bm, bn=bn, bc=bc, out_dtype=out_dtype)
  args = (group_offsets(group_sizes), *lhs_t.arrays(), *rhs_t.arrays())
  out = pl.pallas_call(
      kernel, out_shape=out_struct((e, kp, np_), out_dtype, *args), grid=(e, kp // bm, np_ // bn),
      in_specs=[ANY] * len(args), out_specs=pl.BlockSpec((None, bm, bn), lambda g, i, j: (g, i, j)),
      interpret=interpret, compiler_params=compiler_params(config, interpret),
      name="transposed_grouped_matmul")(*args)
  return out[:, :kdim, :n]
