"""Expert parallelism for the routed experts of a MoE layer: token dispatch and combine with all-to-all.

Composer 2 report, section 5: training runs FSDP + EP + CP, with expert parallelism decoupled from tensor
parallelism, and tokens dispatched to their experts DeepEP-style (each token's rows travel to the devices that
hold its experts and come back weighted). Here the routed experts are split over the `expert` mesh axis, and
the expert hidden dim F over `tensor`; tokens are split over (data, fsdp, expert) by batch and over `context`
by sequence, so each device routes its own tokens and exchanges them within its expert group (the P_e devices
that differ only in their `expert` coordinate).

Per-device shapes inside the shard_map (n = B_l T_l local tokens; P_e expert-axis size, E_l = E / P_e local
experts, global expert e = j E_l + e_l lives on expert shard j; F_t = F / tensor size; C slots per round):

  x [n, D] -> route (locally, `moe.route`; replayed ids keep gates recomputed from the current router)
  -> sort the n K assignments by expert -> per round r, expert e takes its sorted rows [r C, (r + 1) C):
  send [P_e, E_l, C, D] --all_to_all(expert)--> recv [P_e (source), E_l, C, D] -> [E_l, P_e C, D]
  -> SwiGLU with local experts [E_l, D, F_t], [E_l, F_t, D] as one batched matmul -> [E_l, P_e C, D]
  --all_to_all(expert)--> [E, C, D] back on the source -> combine with the gates into [n, D]
  -> psum over `tensor` (each tensor rank holds a partial sum over its F_t slice).

Communication per round: 2 all-to-alls of P_e E_l C D = E C D elements each in the forward (a device keeps
1/P_e of them); the backward re-sends x, sends the output cotangents, and returns dx (3 of that size) plus two
[E, C] gate-sized exchanges. C = `moe.slot_capacity(n K, E, cf)` slots per (source device, expert).

Dropless by default: the number of rounds is ceil(max load / C), decided at run time and made equal across each
expert group with a pmax (every member of an all-to-all must take part in every round), so a balanced batch
costs one round and a skewed one more, never a dropped token. Reverse-mode AD cannot go through a loop with a
data-dependent trip count, so the rounds have a hand-written VJP (as `moe.experts_slots`) that recomputes each
round. With a capacity factor there is exactly one round and assignments past C per (source device, expert)
are dropped and counted.

The shard_map keeps `check_vma` on, so gradients of values shared across devices (the replicated router, the
experts shared by data/fsdp/context ranks, the tokens shared by tensor ranks) are summed by JAX's own
transposes; see `_expert_parallel_shard`.

Quantized precisions (`ModelConfig.precision` MXFP8, NVFP4_FWD_MXFP8_BWD) run each expert shard's FFN as
`moe.quantized_grouped_dot` over its rows [E_l P_e C, D] in groups of P_e C (the function the single-device
`moe.experts_quantized` uses, so forward and custom backward are the same recipe). Every scale of that recipe is
per row of the tokens or per (expert, channel) of whole local experts, except those along F: the
forward's down-projection input and weight (NVFP4: 16-blocks with a second-level scale over the whole of F; MXFP8:
32-blocks) and the backward's gate/up cotangent and weight (MXFP8 32-blocks). So `_check` refuses NVFP4 with a
split tensor axis and MXFP8 with F_t not a multiple of 32. The weight gradient quantizes x and dy along rows in
32-row MXFP8 blocks, and which tokens share a block depends on the layout (here a (round, source, expert) slot
group, on one device all experts' sorted rows back to back); but an E8M0 scale is a power of two, so an element's
E4M3 code does not depend on its block unless it is ~2^14 or more below the block's largest (a subnormal): the
results equal the single-device ones up to float reassociation (tests/parallel/expert_parallel_quantized_test.py).

GPU/TPU could send exactly the routed rows with `jax.lax.ragged_all_to_all` instead of padded slots. The slot
path is the default (and the only one here) because it is a plain dense all-to-all that every backend
implements well: ragged_all_to_all is not implemented on XLA:CPU, and was reported at about 2% of NVLink
bandwidth on 8xB200.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from c2jax.model import moe
from c2jax.model.config import ModelConfig, Precision
from c2jax.model.sharding import RoutedOutput
from c2jax.parallel.mesh import AXES, BATCH_AXES, CONTEXT, DATA, EXPERT, FSDP, TENSOR
from pallas_kernels.formats import MXFP8_BLOCK
from pallas_kernels.target import Platform

# Mesh axes that split tokens (tensor ranks hold copies of the same tokens).
_TOKEN_AXES = (*BATCH_AXES, CONTEXT)
_TOKEN_SPEC = P(BATCH_AXES, CONTEXT, None)


@dataclasses.dataclass(frozen=True)
class _Dispatch:
  """One device's expert-sorted assignments and how many rounds its expert group runs.

  Attributes:
    slots: token [A = n K] of each sorted row, starts/sizes [E] of each expert's rows, capacity C.
    rounds: scalar int32, the same on every device of the expert group.
    num_shards: P_e, the expert-axis size.
    precision: the experts' number format (`moe.slot_ffn` for BF16, else `moe.quantized_grouped_dot`).
    platform: the platform the program is traced for (the quantized recipe's kernels or reference).
  """

  slots: moe.Slots
  rounds: jax.Array
  num_shards: int
  precision: Precision = Precision.BF16
  platform: Platform = Platform.CPU


jax.tree_util.register_dataclass(_Dispatch, data_fields=["slots", "rounds"],
                                 meta_fields=["num_shards", "precision", "platform"])


def _to_experts(a: jax.Array, num_shards: int) -> jax.Array:
  """Source rows [E, C, ...] -> the expert shard's rows [E_l, P_e C, ...] (sources in order along P_e C)."""
  e, c = a.shape[:2]
  a = jax.lax.all_to_all(a.reshape(num_shards, e // num_shards, c, *a.shape[2:]), EXPERT, 0, 0)
  return jnp.swapaxes(a, 0, 1).reshape(e // num_shards, num_shards * c, *a.shape[3:])


def _from_experts(a: jax.Array, num_shards: int) -> jax.Array:
  """Inverse of `_to_experts`: [E_l, P_e C, ...] on the expert shard -> [E, C, ...] back on each source."""
  el, pc = a.shape[:2]
  c = pc // num_shards
  a = jnp.swapaxes(a.reshape(el, num_shards, c, *a.shape[2:]), 0, 1)
  return jax.lax.all_to_all(a, EXPERT, 0, 0).reshape(el * num_shards, c, *a.shape[3:])


def _ffn(xe, wg, wu, wd, precision: Precision, platform: Platform):
  """SwiGLU of the expert shard's rows xe [E_l, P_e C, D] with its experts [E_l, D, F_t], [E_l, F_t, D] -> [E_l,
  P_e C, D]: one batched matmul in BF16, else the single-device quantized grouped matmul with groups of P_e C rows
  (padding slots are zero rows: zero output, and no effect on any scale since a zero never raises an amax)."""
  if precision is Precision.BF16:
    return moe.slot_ffn(xe, wg, wu, wd)[2]
  el, rows, d = xe.shape
  sizes = jnp.full((el,), rows, jnp.int32)
  y = moe.grouped_swiglu(xe.reshape(el * rows, d), wg, wu, wd, sizes, moe.quantized_grouped_dot(precision, platform))
  return y.reshape(el, rows, d)


@jax.custom_vjp
def _exchange_compute(x, gates_sorted, wg, wu, wd, plan: _Dispatch):
  """sum_k g_k FFN_{ids_k}(x) [n, D] for this device's tokens, partial over its F_t slice."""
  out, _ = _exchange_fwd(x, gates_sorted, wg, wu, wd, plan)
  return out


def _exchange_fwd(x, gates_sorted, wg, wu, wd, plan):
  def body(r, out):
    rows, valid = plan.slots.round_rows(r)
    tok = plan.slots.token[rows]
    xs = jnp.where(valid[..., None], x[tok], 0)
    ye = _ffn(_to_experts(xs, plan.num_shards), wg, wu, wd, plan.precision, plan.platform)
    y = _from_experts(ye, plan.num_shards)
    g = jnp.where(valid, gates_sorted[rows], 0).astype(y.dtype)
    return out.at[tok.reshape(-1)].add((y * g[..., None]).reshape(-1, y.shape[-1]))

  out = jax.lax.fori_loop(0, plan.rounds, body, jnp.zeros_like(x))
  return out, (x, gates_sorted, wg, wu, wd, plan)


def _exchange_bwd(res, d_out):
  x, gates_sorted, wg, wu, wd, plan = res
  p = plan.num_shards

  def body(r, acc):
    dx, dgates, dwg, dwu, dwd = acc
    rows, valid = plan.slots.round_rows(r)
    tok = plan.slots.token[rows]
    # Gates and the cotangent of g * y travel to the experts (rather than y coming back) so that dgates and
    # the FFN backward both happen where y is: one [E, C, D] exchange fewer per round.
    xe = _to_experts(jnp.where(valid[..., None], x[tok], 0), p)
    ge = _to_experts(jnp.where(valid, gates_sorted[rows], 0), p)
    d_gy = _to_experts(jnp.where(valid[..., None], d_out[tok], 0), p)
    ye, ffn_vjp = jax.vjp(functools.partial(_ffn, precision=plan.precision, platform=plan.platform), xe, wg, wu, wd)
    dge = jnp.sum(d_gy * ye, axis=-1)
    dxe, dwg_r, dwu_r, dwd_r = ffn_vjp(d_gy * ge[..., None].astype(d_gy.dtype))
    dxs = _from_experts(dxe, p)
    dgs = _from_experts(dge, p)
    dx = dx.at[tok.reshape(-1)].add(jnp.where(valid[..., None], dxs, 0).reshape(-1, dxs.shape[-1]))
    dgates = dgates.at[rows.reshape(-1)].add(jnp.where(valid, dgs, 0).reshape(-1).astype(dgates.dtype))
    return dx, dgates, dwg + dwg_r, dwu + dwu_r, dwd + dwd_r

  init = tuple(jnp.zeros_like(a) for a in (x, gates_sorted, wg, wu, wd))
  dx, dgates, dwg, dwu, dwd = jax.lax.fori_loop(0, plan.rounds, body, init)
  return dx, dgates, dwg, dwu, dwd, None


_exchange_compute.defvjp(_exchange_fwd, _exchange_bwd)


def _vary(a: jax.Array, axes: tuple[str, ...]) -> jax.Array:
  """Marks a (invariant over `axes`) as varying over them, so that its cotangent is psummed over them."""
  return jax.lax.pcast(a, axes, to="varying")


def _expert_parallel_shard(x, router, bias, experts, forced_ids=None, *, cfg: ModelConfig, num_shards: int,
                           capacity_factor: float | None) -> RoutedOutput:
  """One device's routed experts, inside the shard_map over all mesh axes.

  Args:
    x: [B_l, T_l, D] local tokens (B_l = B / (data fsdp expert), T_l = T / context).
    router: [D, E] float32, replicated.
    bias: [E] correction bias, replicated.
    experts: {gate, up: [E_l, D, F_t], down: [E_l, F_t, D]}, this device's experts and hidden slice.
    forced_ids: [B_l, T_l, K] int replayed experts, or None to route.
    cfg: the model config.
    num_shards: P_e, the expert-axis size.
    capacity_factor: None for dropless rounds; else one round and assignments past capacity dropped.
  Returns:
    RoutedOutput(y [B_l, T_l, D], ids [B_l, T_l, K] int32, dropped scalar float32 summed over the mesh).
  """
  b, t, d = x.shape
  e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
  flat = x.reshape(b * t, d)
  routing = moe.route(flat, router, bias, cfg, None if forced_ids is None else forced_ids.reshape(b * t, k))
  # The same bookkeeping as the local slot dispatch (`moe.experts_slots`): a stable sort by expert, so that in
  # capacity mode the assignments kept are each expert's first C in (token, k) order on this device.
  token, order, sizes = moe.sorted_assignments(routing.ids, e)
  cf = cfg.moe_capacity_factor if capacity_factor is None else capacity_factor
  capacity = moe.slot_capacity(b * t * k, e, cf)
  starts = (jnp.cumsum(sizes) - sizes).astype(jnp.int32)
  slots = moe.Slots(
      token=token.astype(jnp.int32), starts=starts, sizes=sizes, capacity=capacity)
  if capacity_factor is None:
    rounds = jax.lax.pmax(slots.num_rounds(), EXPERT)
    dropped = jnp.zeros((), jnp.float32)
  else:
    rounds = jnp.ones((), jnp.int32)
    # Tensor ranks hold copies of the same tokens: count over the token axes only.
    dropped = jax.lax.psum(jnp.sum(jnp.maximum(sizes - capacity, 0)).astype(jnp.float32), _TOKEN_AXES)
  plan = _Dispatch(slots=slots, rounds=rounds, num_shards=num_shards, precision=cfg.precision,
                   platform=moe.platform_of(cfg))

  # shard_map keeps check_vma on: it tracks which mesh axes each value varies over, and the transpose of
  # "becomes varying" is a psum. The custom VJP's float inputs are made varying over every axis, so its
  # backward needs no collectives of its own beyond the exchanges: marking x and the gates varying over
  # `tensor` sums their partial (per-F_t-slice) cotangents over tensor ranks, and marking the experts varying
  # over the token axes sums their gradients over the devices that share them (before the cast, so that the
  # sum runs in the parameter dtype). The router, replicated and used by `route` on local tokens, gets the
  # psum of the per-device gradients the same way (the implicit cast to varying).
  dt = x.dtype
  w = [_vary(experts[name], (DATA, FSDP, CONTEXT)).astype(dt) for name in ("gate", "up", "down")]
  gates_sorted = routing.gates.reshape(-1)[order].astype(jnp.float32)
  partial = _exchange_compute(_vary(flat, (TENSOR,)), _vary(gates_sorted, (TENSOR,)), *w, plan)
  y = jax.lax.psum(partial, TENSOR)
  return RoutedOutput(y=y.reshape(b, t, d), ids=routing.ids.reshape(b, t, k), dropped=dropped)


def _check(mesh: jax.sharding.Mesh, p_moe: dict, x: jax.Array, cfg: ModelConfig, forced_ids: jax.Array | None):
  """Raises ValueError, in one sentence naming the fix, when the shapes do not split over the mesh."""
  e, f = cfg.n_routed_experts, cfg.moe_intermediate_size
  pe, pt = mesh.shape[EXPERT], mesh.shape[TENSOR]
  batch_shards = mesh.shape[DATA] * mesh.shape[FSDP] * pe
  if e % pe:
    raise ValueError(f"{e} experts cannot be split over an expert axis of {pe}; choose an expert axis size that "
                     f"divides {e}.")
  if f % pt:
    raise ValueError(f"moe_intermediate_size={f} cannot be split over a tensor axis of {pt}; choose a tensor axis "
                     f"size that divides {f}.")
  if cfg.precision is Precision.NVFP4_FWD_MXFP8_BWD and pt > 1:
    raise ValueError(f"precision={cfg.precision.value} scales each down-projection row over the whole expert hidden "
                     f"dim, which a tensor axis of {pt} would split; use a tensor axis of 1 for the experts.")
  if cfg.precision is Precision.MXFP8 and (f // pt) % MXFP8_BLOCK:
    raise ValueError(f"precision={cfg.precision.value} scales blocks of {MXFP8_BLOCK} along the expert hidden dim, "
                     f"which a tensor axis of {pt} would split (moe_intermediate_size={f}); choose a tensor axis "
                     f"that leaves a multiple of {MXFP8_BLOCK} per device.")
  if x.ndim != 3 or x.shape[-1] != cfg.d_model:
    raise ValueError(f"Expert parallelism takes x [B, T, D={cfg.d_model}], got shape {x.shape}; pass the "
                     "un-flattened activations.")
  b, t, _ = x.shape
  if b % batch_shards:
    raise ValueError(f"A batch of {b} sequences cannot be split over data x fsdp x expert = {batch_shards} "
                     f"devices; make the batch a multiple of {batch_shards}.")
  if t % mesh.shape[CONTEXT]:
    raise ValueError(f"A sequence of {t} tokens cannot be split over a context axis of {mesh.shape[CONTEXT]}; "
                     f"make the sequence length a multiple of {mesh.shape[CONTEXT]}.")
  if forced_ids is not None and forced_ids.shape != (b, t, cfg.num_experts_per_tok):
    raise ValueError(f"Replayed expert ids have shape {forced_ids.shape} but the tokens need "
                     f"{(b, t, cfg.num_experts_per_tok)}; pass one id per token and chosen expert.")
  if p_moe["experts"]["gate"].shape[0] != e:
    raise ValueError(f"The expert weights hold {p_moe['experts']['gate'].shape[0]} experts but the config says "
                     f"{e}; pass the params built for this config.")


def make_expert_parallel(mesh: jax.sharding.Mesh, *, capacity_factor: float | None = None
                         ) -> Callable[..., RoutedOutput]:
  """Expert-parallel routed experts over `mesh`, for `Layout.routed_experts`.

  Args:
    mesh: a mesh with the five c2jax axes (`c2jax.parallel.mesh.make_mesh`).
    capacity_factor: None (default) for dropless dispatch; a positive float for one round of
      `moe.slot_capacity(n K, E, capacity_factor)` slots per (source device, expert), dropping the excess.
  Returns:
    fn(p_moe, x [B, T, D], cfg, forced_ids [B, T, K] | None) -> RoutedOutput(y [B, T, D] routed experts only,
    ids [B, T, K] int32, dropped scalar float32 over the whole mesh). p_moe holds router [D, E],
    router_bias [E] and experts {gate, up: [E, D, F], down: [E, F, D]}; the experts run in cfg.precision.
    Traceable under jit and scan.
  """
  missing = [a for a in AXES if a not in mesh.shape]
  if missing:
    raise ValueError(f"The mesh lacks axes {missing}; build it with c2jax.parallel.mesh.make_mesh.")
  if capacity_factor is not None and not capacity_factor > 0:
    raise ValueError(f"capacity_factor={capacity_factor} must be positive, or None for dropless dispatch.")

  def fn(p_moe: dict, x: jax.Array, cfg: ModelConfig, forced_ids: jax.Array | None = None) -> RoutedOutput:
    _check(mesh, p_moe, x, cfg, forced_ids)
    w = p_moe["experts"]
    w_specs = {"gate": P(EXPERT, None, TENSOR), "up": P(EXPERT, None, TENSOR), "down": P(EXPERT, TENSOR, None)}
    experts = {name: w[name] for name in w_specs}
    region = jax.shard_map(
        functools.partial(_expert_parallel_shard, cfg=cfg, num_shards=mesh.shape[EXPERT],
                          capacity_factor=capacity_factor),
        mesh=mesh,
        in_specs=(_TOKEN_SPEC, P(), P(), w_specs) + (() if forced_ids is None else (_TOKEN_SPEC,)),
        out_specs=RoutedOutput(y=_TOKEN_SPEC, ids=_TOKEN_SPEC, dropped=P()))
    args = (x, p_moe["router"], p_moe["router_bias"], experts)
    return region(*args, *(() if forced_ids is None else (forced_ids.astype(jnp.int32),)))

  return fn
