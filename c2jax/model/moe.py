"""DeepSeek-V3 mixture of experts: sigmoid router with correction bias, group-limited top-k, routing replay,
shared experts, and three interchangeable expert-compute paths (report section 2; section 4 for replay).

Routing (per token x [D]):
  s = sigmoid(x W_r)                              scores [E], float32
  choice = s + b                                  b = e_score_correction_bias, moves only the CHOICE
  groups: keep the `topk_group` of `n_group` groups with the largest sum of their top-2 choice values
  ids = top-K(choice) within kept groups          (or the replayed ids, when given: routing replay)
  g = s[ids]; g /= sum(g) if norm_topk_prob; g *= routed_scaling_factor
  y = sum_k g_k FFN_{ids_k}(x) + FFN_shared(x)

Routing replay (report section 4): the actor's expert ids are forced, and gates are recomputed from the current
router, so the router still receives gradient through g.

Expert compute (all equal to `experts_dense`, the reference): see `MoeDispatch`.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from c2jax.model.config import ModelConfig, MoeDispatch, Precision
from c2jax.model.sharding import constrain, current_layout
from pallas_kernels import target
from pallas_kernels.formats import Impl
from pallas_kernels.recipe.ops import expert_matmul
from pallas_kernels.target import Platform


@dataclasses.dataclass(frozen=True)
class Routing:
  """Result of routing N tokens.

  Attributes:
    ids: [N, K] int32 chosen experts.
    gates: [N, K] float32 combine weights (after normalization and routed_scaling_factor).
    scores: [N, E] float32 sigmoid scores (without bias).
  """

  ids: jax.Array
  gates: jax.Array
  scores: jax.Array


def route(x: jax.Array, router: jax.Array, bias: jax.Array, cfg: ModelConfig,
          forced_ids: jax.Array | None = None) -> Routing:
  """Routes tokens x [N, D] with router [D, E] and correction bias [E]; forced_ids [N, K] replays a routing."""
  scores = jax.nn.sigmoid(x.astype(jnp.float32) @ router.astype(jnp.float32))
  if forced_ids is None:
    ids = select_experts(jax.lax.stop_gradient(scores), jax.lax.stop_gradient(bias), cfg)
  else:
    ids = forced_ids.astype(jnp.int32)
  gates = jnp.take_along_axis(scores, ids, axis=-1)
  if cfg.norm_topk_prob:
    gates = gates / (jnp.sum(gates, axis=-1, keepdims=True) + 1e-20)
  gates = gates * cfg.routed_scaling_factor
  return Routing(ids=ids, gates=gates, scores=scores)


def select_experts(scores: jax.Array, bias: jax.Array, cfg: ModelConfig) -> jax.Array:
  """Group-limited top-k on biased scores: scores [N, E], bias [E] -> ids [N, K] int32."""
  choice = scores + bias
  n, e = choice.shape
  if cfg.n_group > 1 and cfg.topk_group < cfg.n_group:
    grouped = choice.reshape(n, cfg.n_group, e // cfg.n_group)
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [N, G]
    _, top_groups = jax.lax.top_k(group_scores, cfg.topk_group)
    keep = jnp.zeros((n, cfg.n_group), bool).at[jnp.arange(n)[:, None], top_groups].set(True)
    choice = jnp.where(jnp.repeat(keep, e // cfg.n_group, axis=1), choice, -jnp.inf)
  _, ids = jax.lax.top_k(choice, cfg.num_experts_per_tok)
  return ids.astype(jnp.int32)


def swiglu(x: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array) -> jax.Array:
  """down(silu(x gate) * up(x)) for x [..., D], gate/up [D, F], down [F, D]."""
  dt = x.dtype
  return (jax.nn.silu(x @ gate.astype(dt)) * (x @ up.astype(dt))) @ down.astype(dt)


# ------------------------------------------------------------------------------------------------------------------
# Expert compute paths. Each maps x [N, D], routing ids/gates [N, K] and experts {gate, up: [E, D, F],
# down: [E, F, D]} to [N, D] = sum_k gates[:, k] * FFN_{ids[:, k]}(x).
# ------------------------------------------------------------------------------------------------------------------


def experts_dense(x: jax.Array, ids: jax.Array, gates: jax.Array, w: dict) -> jax.Array:
  """Reference: every expert on every token ([E, N, F] work), combined with zero gates for unchosen experts."""
  dt = x.dtype
  e = w["gate"].shape[0]
  h = jax.nn.silu(jnp.einsum("nd,edf->enf", x, w["gate"].astype(dt))) * jnp.einsum("nd,edf->enf", x,
                                                                                     w["up"].astype(dt))
  y = jnp.einsum("enf,efd->end", h, w["down"].astype(dt))
  combine = jnp.sum(jax.nn.one_hot(ids, e, dtype=jnp.float32) * gates[..., None], axis=1)  # [N, E]
  return jnp.einsum("end,ne->nd", y, combine.astype(dt))


def sorted_assignments(ids: jax.Array, num_experts: int):
  """Sorts the N*K assignments by expert: (token of each sorted row [A], assignment index [A], group sizes [E])."""
  flat = ids.reshape(-1)
  order = jnp.argsort(flat, stable=True)
  k = ids.shape[1]
  sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
  return order // k, order, sizes


def experts_ragged(x: jax.Array, ids: jax.Array, gates: jax.Array, w: dict,
                   grouped_dot=jax.lax.ragged_dot) -> jax.Array:
  """Grouped matmul over expert-sorted rows: `grouped_dot(rows [A, D], w [E, D, F], sizes [E])`, by default
  `jax.lax.ragged_dot` (GPU/TPU grouped-GEMM kernels); `experts_quantized` passes the FP8/FP4 recipe."""
  dt = x.dtype
  e = w["gate"].shape[0]
  token, order, sizes = sorted_assignments(ids, e)
  ys = grouped_swiglu(x[token], w["gate"].astype(dt), w["up"].astype(dt), w["down"].astype(dt), sizes,
                      grouped_dot)
  ys = ys * gates.reshape(-1)[order][:, None].astype(dt)
  return jnp.zeros_like(x).at[token].add(ys)


def grouped_swiglu(rows: jax.Array, gate: jax.Array, up: jax.Array, down: jax.Array, sizes: jax.Array,
                   grouped_dot=jax.lax.ragged_dot) -> jax.Array:
  """SwiGLU of expert-sorted rows [A, D] with gate/up [E, D, F], down [E, F, D] and group sizes [E] -> [A, D]."""
  h = jax.nn.silu(grouped_dot(rows, gate, sizes)) * grouped_dot(rows, up, sizes)
  return grouped_dot(h, down, sizes)


def platform_of(cfg: ModelConfig) -> Platform:
  """The platform this program is traced for: `cfg.platform`, or for AUTO the devices it runs on (the active
  layout's mesh, else the mesh in context, else jax's default device; `pallas_kernels.target.resolve`)."""
  layout = current_layout()
  return target.resolve(cfg.platform, None if layout is None else layout.mesh)


def quantized_grouped_dot(precision: Precision, platform: Platform):
  """`grouped_dot(rows [A, K], w [E, K, N], sizes [E]) -> [A, N]` in an FP8/FP4 recipe, forward and backward.

  Pallas kernels compiled for a GPU; on a CPU or TPU the bit-identical reference quantizers with
  dequantize-then-matmul (interpreted kernels would add their large interpreter compile time to every CPU model
  compile, and the kernels lower through Triton only). The expert-parallel path (`c2jax.parallel.expert_parallel`)
  calls this same function on each shard's local experts.
  """
  if platform is Platform.GPU:
    return lambda a, b, sizes: expert_matmul(a, b, sizes, precision, impl=Impl.PALLAS, interpret=False)
  return lambda a, b, sizes: expert_matmul(a, b, sizes, precision, impl=Impl.REFERENCE)


def experts_quantized(x: jax.Array, ids: jax.Array, gates: jax.Array, w: dict, precision: Precision,
                      platform: Platform) -> jax.Array:
  """`experts_ragged` with each expert matmul (forward and backward) in an FP8/FP4 recipe (report section 5)."""
  return experts_ragged(x, ids, gates, w, grouped_dot=quantized_grouped_dot(precision, platform))


def slot_capacity(num_assignments: int, num_experts: int, capacity_factor: float) -> int:
  """Slots per expert per round: capacity_factor x the balanced load, rounded up to a multiple of 4.

  At least the balanced load plus 4 standard deviations of a random (multinomial) one, so that with many
  experts (a small balanced load) an ordinary fluctuation does not cost a whole second round.
  """
  mean = num_assignments / num_experts
  c = math.ceil(max(capacity_factor * mean, mean + 4 * math.sqrt(mean)))
  return max(4, -(-c // 4) * 4)


@dataclasses.dataclass(frozen=True)
class Slots:
  """Expert-sorted assignment bookkeeping shared by the forward and backward passes of `experts_slots` (and by
  the expert-parallel dispatch in `c2jax.parallel.expert_parallel`).

  token [A]: token of each sorted row; starts/sizes [E]: each expert's row range; capacity: C slots per round.
  """

  token: jax.Array
  starts: jax.Array
  sizes: jax.Array
  capacity: int

  def round_rows(self, r: jax.Array):
    """Rows handled in round r: sorted-row index [E, C] and validity [E, C]."""
    offs = r * self.capacity + jnp.arange(self.capacity, dtype=jnp.int32)
    valid = offs[None, :] < self.sizes[:, None]
    rows = jnp.where(valid, self.starts[:, None] + offs[None, :], 0)
    return rows, valid

  def num_rounds(self) -> jax.Array:
    return (jnp.max(self.sizes) + self.capacity - 1) // self.capacity

  def round(self, r: jax.Array):
    """`round_rows` with the experts of the round's row groups: None, group e is expert e (see `Tiles.round`)."""
    rows, valid = self.round_rows(r)
    return rows, valid, None


jax.tree_util.register_dataclass(Slots, data_fields=["token", "starts", "sizes"], meta_fields=["capacity"])


def tile_rows(num_assignments: int, num_experts: int) -> int:
  """Rows per tile of `experts_tiles`: a power of two near a quarter of the balanced load, in [8, 128].

  Each expert's rows are padded to whole tiles, so padding costs about E x tile / 2 rows: 1/8 of the assignments at
  a quarter of the balanced load; tiles of at least 8 rows keep each matmul's rows a vector width.
  """
  quarter = max(1.0, num_assignments / num_experts / 4)
  return int(min(128, max(8, 2 ** math.floor(math.log2(quarter)))))


# Bytes of expert weights one round of `experts_tiles` gathers (gate, up and down of each tile's expert): small
# enough to stay in a CPU's cache while the round's three matmuls read it.
_ROUND_WEIGHT_BYTES = 6 * 2**20


def tiles_per_round(num_assignments: int, tile: int, expert_shape: tuple[int, int], dtype) -> int:
  """Tiles per round of `experts_tiles`: a quarter of the assignments' tiles, fewer where their gathered weights
  (3 x D x F per tile) would pass `_ROUND_WEIGHT_BYTES`; at least one."""
  d, f = expert_shape
  by_bytes = _ROUND_WEIGHT_BYTES // (3 * d * f * jnp.dtype(dtype).itemsize)
  return int(max(1, min(-(-num_assignments // (4 * tile)), by_bytes)))


@dataclasses.dataclass(frozen=True)
class Tiles:
  """Expert-sorted assignment bookkeeping of `experts_tiles`: each expert's rows padded to whole tiles of `tile`
  rows, `per_round` tiles per round.

  Tile i holds padded rows [i tile, (i + 1) tile): the padded layout puts expert e's rows at [P_e, P_e + size_e)
  with P_e the sum of the earlier experts' sizes rounded up to whole tiles, so every tile belongs to one expert and
  an imbalanced load costs its own rows plus under one tile per expert, not whole extra rounds of E x C slots.

  token [A]: token of each sorted row; starts/sizes [E]: each expert's row range in the sorted rows.
  """

  token: jax.Array
  starts: jax.Array
  sizes: jax.Array
  tile: int
  per_round: int

  def _padded_ends(self) -> jax.Array:
    """[E] end of each expert's padded rows (its start is the previous expert's end)."""
    return jnp.cumsum((self.sizes + self.tile - 1) // self.tile * self.tile)

  def round(self, r: jax.Array):
    """Round r's tiles: sorted-row index [G, tile], validity [G, tile] and the expert of each tile [G]."""
    ends = self._padded_ends()
    first = (r * self.per_round + jnp.arange(self.per_round, dtype=jnp.int32)) * self.tile  # [G] padded rows
    # The expert whose padded range holds the tile: the number of experts that end at or before its first row
    # (empty experts have empty ranges and are skipped). Tiles past the last expert are invalid.
    experts = jnp.minimum(jnp.searchsorted(ends, first, side="right"), self.sizes.shape[0] - 1).astype(jnp.int32)
    offs = (first - (ends - (self.sizes + self.tile - 1) // self.tile * self.tile)[experts])[:, None] + jnp.arange(
        self.tile, dtype=jnp.int32)[None, :]
    valid = (offs < self.sizes[experts][:, None]) & (first < ends[-1])[:, None]
    rows = jnp.where(valid, self.starts[experts][:, None] + offs, 0)
    return rows, valid, experts

  def num_rounds(self) -> jax.Array:
    tiles = self._padded_ends()[-1] // self.tile
    return (tiles + self.per_round - 1) // self.per_round


jax.tree_util.register_dataclass(Tiles, data_fields=["token", "starts", "sizes"], meta_fields=["tile", "per_round"])


def _round_weights(w: jax.Array, experts: jax.Array | None) -> jax.Array:
  """The weights of a round's row groups: w itself for slots (group e is expert e), else w[experts]."""
  return w if experts is None else w[experts]


def _add_weight_grads(acc: jax.Array, grads: jax.Array, experts: jax.Array | None) -> jax.Array:
  """Adds a round's per-group weight gradients into the [E, ...] accumulator (tiles of one expert add up)."""
  return acc + grads if experts is None else acc.at[experts].add(grads)


def slot_ffn(xs: jax.Array, wg: jax.Array, wu: jax.Array, wd: jax.Array):
  """SwiGLU of slot rows xs [E, C, D] with per-expert weights: (gate pre-act, up, output) each [E, C, F|F|D]."""
  hg = jnp.einsum("ecd,edf->ecf", xs, wg)
  hu = jnp.einsum("ecd,edf->ecf", xs, wu)
  return hg, hu, jnp.einsum("ecf,efd->ecd", jax.nn.silu(hg) * hu, wd)


@jax.custom_vjp
def _slots_compute(x, gates_sorted, wg, wu, wd, slots: Slots):
  out, _ = _slots_fwd(x, gates_sorted, wg, wu, wd, slots)
  return out


def _slots_fwd(x, gates_sorted, wg, wu, wd, slots):
  # `slots` is a `Slots` or a `Tiles`: rounds of row groups [G, C] and, for tiles, the expert of each group.
  def body(r, out):
    rows, valid, experts = slots.round(r)
    tok = slots.token[rows]
    xs = jnp.where(valid[..., None], x[tok], 0)
    _, _, y = slot_ffn(xs, *(_round_weights(w, experts) for w in (wg, wu, wd)))
    g = jnp.where(valid, gates_sorted[rows], 0).astype(y.dtype)
    return out.at[tok.reshape(-1)].add((y * g[..., None]).reshape(-1, y.shape[-1]))

  out = jax.lax.fori_loop(0, slots.num_rounds(), body, jnp.zeros_like(x))
  return out, (x, gates_sorted, wg, wu, wd, slots)


def _slots_bwd(res, d_out):
  x, gates_sorted, wg, wu, wd, slots = res

  def body(r, acc):
    dx, dgates, dwg, dwu, dwd = acc
    rows, valid, experts = slots.round(r)
    wg_r, wu_r, wd_r = (_round_weights(w, experts) for w in (wg, wu, wd))
    tok = slots.token[rows]
    xs = jnp.where(valid[..., None], x[tok], 0)
    hg, hu, y = slot_ffn(xs, wg_r, wu_r, wd_r)
    g = jnp.where(valid, gates_sorted[rows], 0).astype(y.dtype)
    dy_full = jnp.where(valid[..., None], d_out[tok], 0)  # d(out)/d(g * y) per slot
    dgates = dgates.at[rows.reshape(-1)].add(
        jnp.where(valid, jnp.sum(dy_full * y, axis=-1), 0).reshape(-1).astype(dgates.dtype))
    dy = dy_full * g[..., None]
    act = jax.nn.silu(hg)
    dwd = _add_weight_grads(dwd, jnp.einsum("ecf,ecd->efd", act * hu, dy), experts)
    dh = jnp.einsum("ecd,efd->ecf", dy, wd_r)
    sig = jax.nn.sigmoid(hg)
    dhg = dh * hu * (sig * (1 + hg * (1 - sig)))
    dhu = dh * act
    dwg = _add_weight_grads(dwg, jnp.einsum("ecd,ecf->edf", xs, dhg), experts)
    dwu = _add_weight_grads(dwu, jnp.einsum("ecd,ecf->edf", xs, dhu), experts)
    dxs = jnp.einsum("ecf,edf->ecd", dhg, wg_r) + jnp.einsum("ecf,edf->ecd", dhu, wu_r)
    dx = dx.at[tok.reshape(-1)].add(jnp.where(valid[..., None], dxs, 0).reshape(-1, dxs.shape[-1]))
    return dx, dgates, dwg, dwu, dwd

  init = (jnp.zeros_like(x), jnp.zeros_like(gates_sorted), jnp.zeros_like(wg), jnp.zeros_like(wu),
          jnp.zeros_like(wd))
  dx, dgates, dwg, dwu, dwd = jax.lax.fori_loop(0, slots.num_rounds(), body, init)
  zero_slots = jax.tree.map(lambda a: jnp.zeros(a.shape, jax.dtypes.float0), slots)
  return dx, dgates, dwg, dwu, dwd, zero_slots


_slots_compute.defvjp(_slots_fwd, _slots_bwd)


def experts_slots(x: jax.Array, ids: jax.Array, gates: jax.Array, w: dict, capacity_factor: float) -> jax.Array:
  """Dropless capacity-slot dispatch: rounds of one batched matmul [E, C, D] x [E, D, F].

  Assignments are sorted by expert; round r gives each expert its rows [r C, (r + 1) C). The round count is
  ceil(max load / C), decided at run time (a while loop), so nothing is dropped and a balanced batch costs one
  round: work is cf x N x K rows whatever E is. The VJP is hand-written because reverse-mode autodiff cannot
  differentiate a loop whose trip count is data-dependent; it recomputes each round's activations.
  """
  dt = x.dtype
  n, k = ids.shape
  e = w["gate"].shape[0]
  token, order, sizes = sorted_assignments(ids, e)
  starts = (jnp.cumsum(sizes) - sizes).astype(jnp.int32)
  slots = Slots(token=token.astype(jnp.int32), starts=starts, sizes=sizes,
                 capacity=slot_capacity(n * k, e, capacity_factor))
  gates_sorted = gates.reshape(-1)[order].astype(jnp.float32)
  return _slots_compute(x, gates_sorted, w["gate"].astype(dt), w["up"].astype(dt), w["down"].astype(dt), slots)


def experts_tiles(x: jax.Array, ids: jax.Array, gates: jax.Array, w: dict) -> jax.Array:
  """Dropless tiled dispatch: rounds of one batched matmul over G tiles [G, tile, D] x [G, D, F].

  Assignments are sorted by expert and each expert's rows padded to whole tiles (`Tiles`); a round takes the next G
  tiles with their experts' weights gathered. Work is the assignments plus under one tile per expert, however
  imbalanced the load: where `experts_slots` runs whole extra rounds of E x C slots for one overloaded expert (2-3
  rounds at a random initialization), tiles pay for the overload's rows only. The rounds and their hand-written
  VJP are `experts_slots`'; `tile_rows` and `tiles_per_round` size them.
  """
  dt = x.dtype
  n, k = ids.shape
  e = w["gate"].shape[0]
  token, order, sizes = sorted_assignments(ids, e)
  tile = tile_rows(n * k, e)
  per_round = tiles_per_round(n * k, tile, w["gate"].shape[1:], dt)
  tiles = Tiles(token=token.astype(jnp.int32), starts=(jnp.cumsum(sizes) - sizes).astype(jnp.int32), sizes=sizes,
                tile=tile, per_round=per_round)
  gates_sorted = gates.reshape(-1)[order].astype(jnp.float32)
  return _slots_compute(x, gates_sorted, w["gate"].astype(dt), w["up"].astype(dt), w["down"].astype(dt), tiles)


def resolve_dispatch(dispatch: MoeDispatch, platform: Platform) -> MoeDispatch:
  """AUTO -> TILES on a CPU (ragged_dot is slow there), RAGGED (grouped-GEMM kernels) on a GPU or TPU."""
  if dispatch is not MoeDispatch.AUTO:
    return dispatch
  return MoeDispatch.TILES if platform is Platform.CPU else MoeDispatch.RAGGED


def routed_experts(x: jax.Array, routing: Routing, w: dict, cfg: ModelConfig) -> jax.Array:
  """sum_k gates_k FFN_{ids_k}(x) for x [N, D] with the configured dispatch (or the quantized recipe)."""
  platform = platform_of(cfg)
  if cfg.precision is not Precision.BF16:
    return experts_quantized(x, routing.ids, routing.gates, w, cfg.precision, platform)
  dispatch = resolve_dispatch(cfg.moe_dispatch, platform)
  if dispatch is MoeDispatch.DENSE:
    return experts_dense(x, routing.ids, routing.gates, w)
  if dispatch is MoeDispatch.RAGGED:
    return experts_ragged(x, routing.ids, routing.gates, w)
  if dispatch is MoeDispatch.TILES:
    return experts_tiles(x, routing.ids, routing.gates, w)
  return experts_slots(x, routing.ids, routing.gates, w, cfg.moe_capacity_factor)


@dataclasses.dataclass(frozen=True)
class MoeOutput:
  """Output of one MoE FFN.

  Attributes:
    y: [B, T, D] the FFN output.
    expert_ids: [B, T, K] int32 experts chosen (or replayed).
    load: [E] float32 fraction of the B*T*K assignments each expert received (counts only tokens with
      weight > 0 in `token_mask`), the input of the balancing-bias update.
    dropped: scalar float32, assignments dropped for lack of expert capacity (always 0 unless an
      expert-parallel layout was given a capacity factor).
  """

  y: jax.Array
  expert_ids: jax.Array
  load: jax.Array
  dropped: jax.Array


jax.tree_util.register_dataclass(MoeOutput, data_fields=["y", "expert_ids", "load", "dropped"], meta_fields=[])


def moe_ffn(p: dict, x: jax.Array, cfg: ModelConfig, forced_ids: jax.Array | None = None,
            token_mask: jax.Array | None = None) -> MoeOutput:
  """The DeepSeek-V3 MoE FFN on x [B, T, D]; forced_ids [B, T, K] replays routing; token_mask [B, T] for load.

  Under a `Layout` with expert parallelism the routed experts run there (tokens exchanged between expert
  shards, in `cfg.precision`); otherwise locally with `cfg.moe_dispatch` (or the quantized recipe).
  """
  b, t, d = x.shape
  layout = current_layout()
  if layout is not None and layout.routed_experts is not None:
    routed = layout.routed_experts(p, x, cfg, forced_ids)
    y, ids, dropped = routed.y, routed.ids.reshape(b * t, -1), routed.dropped
  else:
    flat = x.reshape(b * t, d)
    routing = route(flat, p["router"], p["router_bias"], cfg,
                    None if forced_ids is None else forced_ids.reshape(b * t, -1))
    y = routed_experts(flat, routing, p["experts"], cfg).reshape(b, t, d)
    ids, dropped = routing.ids, jnp.zeros((), jnp.float32)
  if "shared" in p:
    s = p["shared"]
    y = y + swiglu(x, s["gate"], s["up"], s["down"])
  y = constrain(y, ("batch", "seq", "embed"))
  weight = jnp.ones((b * t,), jnp.float32) if token_mask is None else token_mask.reshape(-1).astype(jnp.float32)
  counts = jnp.zeros((cfg.n_routed_experts,), jnp.float32).at[ids].add(jnp.broadcast_to(weight[:, None], ids.shape))
  load = counts / jnp.maximum(jnp.sum(counts), 1.0)
  return MoeOutput(y=y, expert_ids=ids.reshape(b, t, -1), load=load, dropped=dropped)


def update_correction_bias(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
  """Auxiliary-loss-free balancing (DeepSeek-V3): b_e += u * sign(mean_load - load_e).

  Overloaded experts become less likely to be chosen, underloaded ones more; gates are unaffected (the bias
  enters only the choice). Works on any leading dims.

  Args:
    bias: [..., E] e_score_correction_bias (e.g. stacked over layers [Lm, E]).
    load: [..., E] per-expert load (counts or fractions) of the last step.
    rate: u, the bias update speed.
  Returns:
    the new bias [..., E] (float32).
  """
  mean = jnp.mean(load, axis=-1, keepdims=True)
  return (bias + rate * jnp.sign(mean - load)).astype(bias.dtype)
