"""Capacity planning of the train step on a mesh: an analytic memory / FLOP / communication model (the library side
of `tools/plan.py`; `c2jax.parallel.hlo_stats` reads the same figures out of XLA's compiled programs).

Everything here is per device and per optimizer step, and pure Python over shapes (no arrays are built), so that
the model can be checked against hand computations in tests and against XLA's own figures by the planner.

Notation (`c2jax.model.config`): B global sequences per step, T tokens per sequence, b = B / (data fsdp expert)
sequences and t = T / context tokens per device, n = b t local tokens, D model width, N heads, Hqk = Hn + R and
Hv head dims, Lkv + R the MLA latent, E routed experts (E_l = E / P_e local), K top-k, F expert hidden, V vocab,
L layers (Ld dense + Lm MoE), M MTP modules, dt the compute dtype's bytes, P_* mesh axis sizes. The token axes
(data, fsdp, expert, context) split the tokens, so a parameter's gradient is a sum over all of them.

What the model assumes:

Parameters and optimizer state. A parameter's bytes on a device are its bytes over the product of the mesh axes
in its `layout.param_spec` (ZeRO-3 over fsdp, expert and context wherever they divide a dimension; the `data`
axis holds full replicas). c2jax's AdamW (`optax.adamw` with the default `mu_dtype=None`) keeps mu and nu in the
parameter dtype, for trainable leaves only (`router_bias` moves by the balancing rule), and keeps no separate
float32 master copy: for Kimi K2.5 (bf16 params) that is 2 + 4 bytes per parameter.
`StateMemory.f32_recipe_optimizer` gives, beside it, the usual mixed-precision recipe (f32 master, f32 mu and nu:
12 bytes per parameter) for planning. Gradients: one per parameter leaf in the parameter dtype, sharded like it.

Activations. The decoder stack is a `lax.scan` per layer group. What crosses layers (the scan residuals):
  Remat.FULL: each layer's input h [n, D] (factor 1 in units of n D dt) plus the stacked expert ids [n, K] int32.
  Remat.NONE: every residual of a layer (`layer_activation_items`: inputs of the matmuls, norms, the attention
    residuals of the block-causal custom VJP, the expert-parallel custom VJP's inputs, ...).
  Remat.DOTS_SAVEABLE: the outputs of matmuls without batch dimensions (projections), plus h.
On top of that, one layer's working set while its backward runs (its NONE residuals and their cotangents, x2),
the attention score blocks that this implementation materializes (float32 [b, N, rows, keys] per block; a fused
flash kernel would not), the expert-parallel slot buffers of one round, and the float32 logits (main + MTP) with
their gradient. These transient terms are rough (XLA's buffer assignment decides what is live together); the
planner prints XLA's `memory_analysis` beside them when it compiles.

FLOPs per token (`flops_per_token`). Nominal 6 x N_active (the usual rule, N_active as `count_params`, which
counts the embedding table). Model FLOPs: 6 x N_matmul (N_active without the embedding gather, plus the MTP
modules' matmuls when they run) + attention 3 x 2 x T_avg x N x (Hqk + Hv) per layer, T_avg = (T + 1) / 2 keys per
query under the causal mask (one document per row). Executed FLOPs add what the implementation really computes:
the block-causal over-coverage ((n_b + 1) / (2 n_b) of T^2 with n_b query blocks; (2cp + 1) / (2cp) under context
parallelism), the recomputed QK^T in the attention VJP, the recomputed expert FFN in the expert-parallel VJP,
slot padding (E C / (n K) of the routed FFN), the kv_b re-expansion of gathered latents under context parallelism,
and one more forward under Remat.FULL.

Communication (`communication`, bytes one device sends per step, with the wire convention of
`hlo_stats.ring_factor`: (g - 1) / g of the buffer for all-gather, reduce-scatter and all-to-all over a group of g,
2 (g - 1) / g of it for all-reduce). Each parameter's groups are read from its `layout.param_spec` (`ParamRow`):
  FSDP all-gather: a parameter is gathered, before use, over the axes of its spec that do not stay split where it
    is used (`ParamRow.gather_axes`), once in the forward and once in the backward (a Remat.FULL recompute shares
    the backward's gather). Under XLA's partitioner only tensor stays split (fsdp, expert and context split the
    tokens, so the weights are gathered over them). Two shard_map regions take parameters whole but for their
    in_specs: the expert-parallel one takes the routed experts as P(expert, None, tensor) / P(expert, tensor,
    None), so they are gathered over the rest of their spec (fsdp, and context where it shards them), and the
    router and its bias as P(); the context-parallel one takes kv_b as P(None, tensor, None).
  Gradients under XLA's partitioner: reduce-scattered over the gather axes and all-reduced over the token axes
    that do not shard the parameter (`ParamRow.replica_axes`: data, plus any of fsdp, expert, context that found
    no dimension it divides). In a region: the parameter enters invariant over the token axes its in_spec does
    not split it by and is cast to varying over them (explicitly for the experts, implicitly for the router and
    kv_b), whose transpose is a psum, i.e. an all-reduce of the whole per-device block over those axes
    (`ParamRow.region_reduce_axes`: data, fsdp, context for the experts; all four for the router and kv_b), out of
    which the parameter's shard is then sliced. The router bias gets no gradient.
  EP all-to-all per MoE layer and round (one round when balanced): the forward sends [E, C, D] and gets it back
    (2 exchanges), the backward re-sends x and the output cotangent and returns dx (3 [E, C, D]) plus 2 [E, C]
    gate-sized ones. C = `moe.slot_capacity(n K, E, cf)`. Remat.FULL adds none: the recomputed forward's
    exchanges only feed the discarded output (the hand-written VJP keeps x, gates and weights), and XLA drops them.
  CP all-gather per attention layer: c_kv and k_rope ((Lkv + R) dt per token) and positions (int32) in the
    forward, a reduce-scatter of the latent cotangents in the backward; Remat.FULL gathers again. The zig-zag
    reorder of the hidden state (a take along the context-sharded sequence, in and out of the stack and of each
    MTP block) is done by XLA as an all-gather of the whole sequence, in the forward and again in the backward.
  Tensor-axis collectives and XLA's own reshardings of activations are not modelled; the HLO accounting counts
  them.
  Checked against the HLO of the Kimi K2.5 step after SPMD partitioning (figures: docs/benchmarks.md,
  "tools/plan.py"). The non-expert gradients are not reduce-scattered at that stage: XLA all-reduces the whole
  gathered gradient over fsdp x expert and again over context, then slices it; XLA:GPU's reduce-scatter creation
  pass may rewrite part of it.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Mapping

from c2jax.model import mla
from c2jax.model import moe
from c2jax.model.config import ModelConfig, Remat
from c2jax.model.params import ParamSpec, count_params, param_specs, trainable_mask
from c2jax.parallel.hlo_stats import ring_factor
from c2jax.parallel.layout import param_spec
from c2jax.parallel.mesh import AXES, BATCH_AXES, CONTEXT, EXPERT, TENSOR

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}
GiB = float(1 << 30)


def _bytes(dtype: str) -> int:
  return DTYPE_BYTES[dtype]


@dataclasses.dataclass(frozen=True)
class Workload:
  """What one optimizer step processes.

  Attributes:
    global_batch: B, sequences per step (a multiple of data x fsdp x expert).
    seq_len: T, tokens per sequence (a multiple of 2 x context when context > 1).
    with_mtp: whether the MTP modules run (the LM step runs them when mtp_weight > 0 and the config has any).
    segments: whether batches carry segment ids (packed documents), which context parallelism also gathers.
    fused_attention: a what-if for planning: count no attention score buffers (as a fused flash-attention kernel
      would), where c2jax's attention materializes float32 score blocks.
  """

  global_batch: int
  seq_len: int
  with_mtp: bool = True
  segments: bool = False
  fused_attention: bool = False


def local_batch(mesh_shape: Mapping[str, int], work: Workload) -> tuple[int, int]:
  """(b, t): sequences and tokens per sequence on one device."""
  shards = math.prod(mesh_shape[a] for a in BATCH_AXES)
  if work.global_batch % shards:
    raise ValueError(f"Global batch {work.global_batch} is not divisible by data x fsdp x expert = {shards}; use a "
                     f"multiple of {shards}.")
  cp = mesh_shape[CONTEXT]
  if work.seq_len % (2 * cp if cp > 1 else 1):
    raise ValueError(f"Sequence length {work.seq_len} is not divisible by 2 x context = {2 * cp}; pad it.")
  return work.global_batch // shards, work.seq_len // cp


# ------------------------------------------------------------------------------------------------------------------
# Parameters, optimizer state, gradients.
# ------------------------------------------------------------------------------------------------------------------


# Mesh axes that split the tokens: every parameter's gradient is a sum over them.
TOKEN_AXES = (*BATCH_AXES, CONTEXT)
EXPERT_REGION = "expert-parallel"
CONTEXT_REGION = "context-parallel"
# What the shard_map regions that take parameters keep split of them (their in_specs), by logical axis; every other
# mesh axis of a parameter's spec is gathered at the region's boundary.
#   expert-parallel (`expert_parallel.make_expert_parallel`, under any mesh): the routed experts as
#     P(expert, None, tensor) / P(expert, tensor, None); the router and its bias ("expert_router") as P().
#   context-parallel (`context_parallel.make_context_parallel`, when context > 1): kv_b as P(None, tensor, None).
_REGION_KEEPS = {EXPERT_REGION: {"expert": EXPERT, "expert_mlp": TENSOR}, CONTEXT_REGION: {"heads": TENSOR}}


def _region(path: str, logical: tuple[str, ...], mesh_shape: Mapping[str, int]) -> str | None:
  """The shard_map region a parameter is used in, or None where XLA's partitioner places it."""
  if "expert" in logical or "expert_router" in logical:
    return EXPERT_REGION
  if path.endswith("attn/kv_b") and mesh_shape[CONTEXT] > 1:
    return CONTEXT_REGION
  return None


@dataclasses.dataclass(frozen=True)
class ParamRow:
  """One parameter leaf on the mesh.

  Attributes:
    path: '/'-joined dict keys.
    spec: the leaf's `ParamSpec`.
    itemsize: bytes per element.
    sharded_over: the mesh axes of its `layout.param_spec` (size > 1), in dimension order.
    kept_over: those of `sharded_over` that stay split where it is used: tensor under XLA's partitioner; in a
      shard_map region, what the region's in_spec keeps (`_REGION_KEEPS`).
    shards: how many ways it is split (the product of `sharded_over`).
    gathered_shards: how many ways it stays split where it is used (the product of `kept_over`).
    region: `EXPERT_REGION` or `CONTEXT_REGION` when a shard_map region takes it, else None.
    grad_itemsize: bytes per element of its gradient where the region sums it (the region casts kv_b to the
      compute dtype before the implicit cast to varying; the experts and the router are summed in their own dtype).
    expert: whether it is a routed-expert weight.
    trainable: whether it gets a gradient and AdamW keeps moments for it (all but `router_bias`).
  """

  path: str
  spec: ParamSpec
  itemsize: int
  sharded_over: tuple[str, ...]
  kept_over: tuple[str, ...]
  shards: int
  gathered_shards: int
  region: str | None
  grad_itemsize: int
  expert: bool
  trainable: bool

  @property
  def bytes(self) -> int:
    return math.prod(self.spec.shape) * self.itemsize

  @property
  def local_bytes(self) -> float:
    return self.bytes / self.shards

  @property
  def gathered_bytes(self) -> float:
    return self.bytes / self.gathered_shards

  @property
  def gather_axes(self) -> tuple[str, ...]:
    """Axes it is all-gathered over before use (and its gradient reduce-scattered over, outside the region)."""
    return tuple(a for a in self.sharded_over if a not in self.kept_over)

  @property
  def replica_axes(self) -> tuple[str, ...]:
    """Token axes that do not shard it: outside the region its gradient shards are all-reduced over them."""
    return tuple(a for a in TOKEN_AXES if a not in self.sharded_over)

  @property
  def region_reduce_axes(self) -> tuple[str, ...]:
    """Token axes its region psums its gradient over: those the region's in_spec does not split it by (the
    transpose of the cast to varying over them, explicit in the expert-parallel region, implicit elsewhere)."""
    return tuple(a for a in TOKEN_AXES if a not in self.kept_over)

  @property
  def region_grad_bytes(self) -> float:
    """Bytes of the per-device gradient block its region psums."""
    return math.prod(self.spec.shape) / self.gathered_shards * self.grad_itemsize


def _flatten_specs(tree, prefix=""):
  """(path, leaf) of a nested dict of params-like leaves (`ParamSpec`s, or the bools of `trainable_mask`)."""
  for k, v in tree.items():
    path = f"{prefix}/{k}" if prefix else k
    if isinstance(v, dict):
      yield from _flatten_specs(v, path)
    else:
      yield path, v


def param_rows(cfg: ModelConfig, mesh_shape: Mapping[str, int]) -> list[ParamRow]:
  """Every parameter leaf with its shardings on a mesh of `mesh_shape` (axis name -> size), from `param_spec`."""
  shape = {a: mesh_shape.get(a, 1) for a in AXES}
  specs = param_specs(cfg)
  trainable = dict(_flatten_specs(trainable_mask(specs)))
  rows = []
  for path, s in _flatten_specs(specs):
    spec = param_spec(s.shape, s.axes, shape)
    region = _region(path, s.axes, shape)
    sharded, kept = [], []
    for dim_axes, logical in zip(tuple(spec) + (None,) * (len(s.shape) - len(spec)), s.axes):
      names = () if dim_axes is None else (dim_axes,) if isinstance(dim_axes, str) else tuple(dim_axes)
      for a in names:
        sharded.append(a)
        if (_REGION_KEEPS[region].get(logical) == a) if region else a == TENSOR:
          kept.append(a)
    itemsize = _bytes(s.dtype or cfg.param_dtype)
    rows.append(ParamRow(path=path, spec=s, itemsize=itemsize, sharded_over=tuple(sharded), kept_over=tuple(kept),
                         shards=_group(shape, sharded), gathered_shards=_group(shape, kept), region=region,
                         grad_itemsize=_bytes(cfg.dtype) if region == CONTEXT_REGION else itemsize,
                         expert="expert" in s.axes, trainable=trainable[path]))
  return rows


def _group(mesh_shape: Mapping[str, int], axes) -> int:
  """Devices in a group spanning `axes`."""
  return math.prod(mesh_shape[a] for a in axes)


@dataclasses.dataclass(frozen=True)
class StateMemory:
  """Bytes per device of the persistent train state and of the gradients.

  Attributes:
    params: the parameters as stored (param_dtype).
    optimizer: AdamW mu and nu as c2jax keeps them (param dtype, trainable leaves, no master copy).
    grads: one gradient per parameter, param dtype, sharded like the parameters.
    f32_recipe_optimizer: what mu, nu and a master copy would take in float32 (12 bytes per trainable param).
    local_params: parameters (elements) per device.
  """

  params: float
  optimizer: float
  grads: float
  f32_recipe_optimizer: float
  local_params: float

  @property
  def total(self) -> float:
    return self.params + self.optimizer + self.grads


def state_memory(cfg: ModelConfig, mesh_shape: Mapping[str, int]) -> StateMemory:
  """Parameters, AdamW state and gradients per device on a mesh of `mesh_shape` (axis name -> size)."""
  rows = param_rows(cfg, mesh_shape)
  params = sum(r.local_bytes for r in rows)
  optimizer = sum(2 * r.local_bytes for r in rows if r.trainable)
  local = sum(math.prod(r.spec.shape) / r.shards for r in rows)
  f32 = sum(12 * math.prod(r.spec.shape) / r.shards for r in rows if r.trainable)
  return StateMemory(params=params, optimizer=optimizer, grads=params, f32_recipe_optimizer=f32, local_params=local)


# ------------------------------------------------------------------------------------------------------------------
# Activations.
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ActivationItem:
  """One per-token residual of a decoder layer: `elements` numbers of `itemsize` bytes per local token.

  `dots` marks outputs of matmuls without batch dimensions (kept by Remat.DOTS_SAVEABLE).
  """

  name: str
  elements: float
  itemsize: int
  dots: bool = False

  @property
  def bytes(self) -> float:
    return self.elements * self.itemsize


def attention_key_factor(seq_len: int, cp: int) -> float:
  """Keys whose K/V the attention VJP keeps, per local query token.

  Without context parallelism `mla.attend` runs n_b query blocks, block i over keys [0, end of block i), and each
  block's custom VJP keeps its own K/V slice: sum_i (i + 1) / n_b = (n_b + 1) / 2 sequences' worth. Under context
  parallelism each rank keeps the 2cp + 1 key chunks of T / (2cp) tokens it pairs with: (2cp + 1) / 2 local
  sequences' worth.
  """
  if cp > 1:
    return (2 * cp + 1) / 2
  block = mla.query_block_size(seq_len)
  return sum(min(i + block, seq_len) for i in range(0, seq_len, block)) / seq_len


def layer_activation_items(cfg: ModelConfig, mesh_shape: Mapping[str, int], seq_len: int,
                           moe_layer: bool) -> list[ActivationItem]:
  """What autodiff keeps per local token of one layer under Remat.NONE (the itemized layer factor).

  Heads, MLP hidden and expert hidden are divided by the tensor axis. The routed experts keep only their inputs
  (the expert-parallel and slot paths have hand-written VJPs that recompute each round), so no dispatch buffer
  crosses layers.
  """
  dt = _bytes(cfg.dtype)
  tp = mesh_shape.get(TENSOR, 1)
  cp = mesh_shape.get(CONTEXT, 1)
  d, nh = cfg.d_model, cfg.n_heads / tp
  hqk, hv = cfg.qk_head_dim, cfg.v_head_dim
  lkv, r = cfg.kv_lora_rank, cfg.qk_rope_head_dim
  # Under context parallelism each of the 2cp + 1 (query half, key chunk) pairs keeps its own copy of its queries
  # and output: (2cp + 1) / 2 of the local tokens' worth; `mla.attend`'s query blocks partition the queries.
  qf = (2 * cp + 1) / 2 if cp > 1 else 1.0
  items = [
      ActivationItem("h (layer input)", d, dt),
      ActivationItem("attn rms_norm f32 input", d, 4),
      ActivationItem("attn normed x", d, dt),
  ]
  if cfg.q_lora_rank:
    items += [ActivationItem("q_a out", cfg.q_lora_rank, dt, dots=True),
              ActivationItem("q_a normed", cfg.q_lora_rank, dt)]
  items += [
      ActivationItem("q (q_b out)", nh * hqk, dt, dots=True),
      ActivationItem("kv_a out", lkv + r, dt, dots=True),
      ActivationItem("c_kv normed", lkv, dt),
      ActivationItem("kv_b out (k_nope, v)", nh * (cfg.qk_nope_head_dim + hv), dt, dots=True),
      ActivationItem("attention q [nope|rope] kept by the block VJPs", qf * nh * hqk, dt),
      ActivationItem("attention K, V kept by the block VJPs", attention_key_factor(seq_len, cp) * nh * (hqk + hv),
                     dt),
      ActivationItem("attention out + lse kept by the block VJPs", qf * (nh * hv + 2 * nh), dt),
      ActivationItem("o out", d, dt, dots=True),
      ActivationItem("h after attention", d, dt),
      ActivationItem("mlp rms_norm f32 input", d, 4),
      ActivationItem("mlp normed x", d, dt),
  ]
  if moe_layer:
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    fs = cfg.shared_intermediate_size / tp
    items += [
        ActivationItem("router input f32", d, 4),
        ActivationItem("router scores f32", e, 4, dots=True),
        ActivationItem("gates, ids, sort", 3 * k, 4),
        ActivationItem("shared expert gate, up, act", 3 * fs, dt, dots=True),
        ActivationItem("moe out", d, dt),
    ]
  else:
    f = cfg.intermediate_size / tp
    items += [ActivationItem("mlp gate, up, act", 3 * f, dt, dots=True), ActivationItem("mlp out", d, dt)]
  return items


@dataclasses.dataclass(frozen=True)
class ActivationMemory:
  """Bytes per device of activations (see the module docstring).

  Attributes:
    tokens: n, local tokens per step.
    saved: residuals kept across all layers for the backward pass (depends on remat).
    layer_factor_none / layer_factor_saved: per-layer residual bytes per token over D dt (Remat.NONE; as configured).
    layer_working: one layer's residuals and cotangents while its backward runs.
    attention_scores: float32 score blocks live at once in the attention backward (x4: logits, probabilities,
      their cotangent and the logits'; under context parallelism all 2cp + 1 blocks at once, else the largest
      query block).
    moe_buffers: one expert-parallel round's slot buffers in the backward (x, cotangent, y, dx at [E, C, D];
      hidden gate, up, act and their cotangents at [E, C, F_t]).
    logits: float32 logits of the LM head and the MTP heads, and their gradient.
  """

  tokens: int
  saved: float
  layer_factor_none: float
  layer_factor_saved: float
  layer_working: float
  attention_scores: float
  moe_buffers: float
  logits: float

  @property
  def peak(self) -> float:
    """Rough peak: residuals of all layers + one layer's backward + the larger of its transient buffers + logits."""
    return self.saved + self.layer_working + max(self.attention_scores, self.moe_buffers) + self.logits


def _layer_counts(cfg: ModelConfig, work: Workload) -> tuple[int, int]:
  """(dense-FFN layers, MoE-FFN layers) that run, counting the MTP blocks when they run."""
  m = cfg.num_mtp_layers if work.with_mtp else 0
  moe_mtp = m if cfg.n_moe_layers else 0
  return cfg.n_dense_layers + (m - moe_mtp), cfg.n_moe_layers + moe_mtp


def expert_capacity(cfg: ModelConfig, tokens: int) -> int:
  """C, slots per (source device, expert) per round: `moe.slot_capacity(n K, E, cf)`."""
  return moe.slot_capacity(tokens * cfg.num_experts_per_tok, cfg.n_routed_experts, cfg.moe_capacity_factor)


def activation_memory(cfg: ModelConfig, mesh_shape: Mapping[str, int], work: Workload) -> ActivationMemory:
  """Activation bytes per device of one step of `work` (remat as `cfg.remat`; see `ActivationMemory`)."""
  shape = {a: mesh_shape.get(a, 1) for a in AXES}
  b, t = local_batch(shape, work)
  n = b * t
  dt = _bytes(cfg.dtype)
  tp, cp = shape[TENSOR], shape[CONTEXT]
  ld, lm = _layer_counts(cfg, work)
  dense_items = layer_activation_items(cfg, shape, work.seq_len, moe_layer=False)
  moe_items = layer_activation_items(cfg, shape, work.seq_len, moe_layer=True) if lm else []

  def total(items, keep):
    return sum(i.bytes for i in items if keep(i))

  if cfg.remat is Remat.NONE:
    keep = lambda i: True
  elif cfg.remat is Remat.FULL:
    keep = lambda i: i.name.startswith("h (layer input)")
  else:
    keep = lambda i: i.dots or i.name.startswith("h (layer input)")
  ids = 4 * cfg.num_experts_per_tok  # the stacked expert ids [Lm, n, K] int32 the scan outputs
  per_token = ld * total(dense_items, keep) + lm * (total(moe_items, keep) + ids)
  big = moe_items or dense_items
  unit = cfg.d_model * dt
  layer_none = total(big, lambda i: True)

  nh = cfg.n_heads / tp
  if cp > 1:
    ch = t // 2
    scores = b * (2 * cp + 1) * nh * ch * ch * 4 * 4
  else:
    block = mla.query_block_size(work.seq_len)
    scores = b * nh * block * work.seq_len * 4 * 4
  if work.fused_attention:
    scores = 0.0
  moe_buf = 0.0
  if lm:
    slots = cfg.n_routed_experts * expert_capacity(cfg, n)
    moe_buf = slots * (4 * cfg.d_model + 6 * cfg.moe_intermediate_size / tp) * dt
  m = cfg.num_mtp_layers if work.with_mtp else 0
  logits = 2 * (1 + m) * n * cfg.vocab_size / tp * 4
  return ActivationMemory(tokens=n, saved=n * per_token, layer_factor_none=layer_none / unit,
                          layer_factor_saved=total(big, keep) / unit, layer_working=2 * n * layer_none,
                          attention_scores=scores, moe_buffers=moe_buf, logits=logits)


# ------------------------------------------------------------------------------------------------------------------
# FLOPs.
# ------------------------------------------------------------------------------------------------------------------


def _size(tree) -> int:
  return sum(math.prod(s.shape) for _, s in _flatten_specs(tree))


@dataclasses.dataclass(frozen=True)
class Flops:
  """FLOPs per token of one training step (forward + backward).

  Attributes:
    active_params: N_active (`count_params`, embedding and LM head included, MTP excluded).
    nominal: 6 N_active.
    matmul_params: parameters one token multiplies by (no embedding gather; MTP modules when they run).
    dense: 6 x matmul_params.
    attention: 3 x 2 x T_avg x N x (Hqk + Hv) x attention layers.
    model: dense + attention.
    executed: what this implementation computes (see the module docstring).
  """

  active_params: int
  nominal: float
  matmul_params: float
  dense: float
  attention: float
  model: float
  executed: float


def keys_per_query(seq_len: int, cp: int) -> float:
  """Keys each query's scores are computed against by this implementation (T_avg = (T + 1) / 2 is the model's).

  `mla.attend`: n_b query blocks of T / n_b rows, block i over keys [0, (i + 1) T / n_b): T (n_b + 1) / (2 n_b).
  Context parallelism: 2cp + 1 blocks of ch x ch per rank for its 2 ch queries, ch = T / (2cp): (2cp + 1) T / (4cp).
  """
  if cp > 1:
    return (2 * cp + 1) * seq_len / (4 * cp)
  block = mla.query_block_size(seq_len)
  return sum((min(i + block, seq_len) - i) * min(i + block, seq_len) for i in range(0, seq_len, block)) / seq_len


def flops_per_token(cfg: ModelConfig, seq_len: int, *, with_mtp: bool = True, mesh_shape: Mapping[str, int] | None
                    = None, local_tokens: int | None = None) -> Flops:
  """FLOPs per token (see `Flops`).

  Args:
    cfg: the architecture (its remat and capacity factor enter the executed figure).
    seq_len: T.
    with_mtp: whether the MTP modules run.
    mesh_shape: the mesh (the executed figure's CP blocks); default one device.
    local_tokens: n, tokens per device, for the slot padding of the executed figure (default T / context).
  """
  shape = {a: (mesh_shape or {}).get(a, 1) for a in AXES}
  counts = count_params(cfg)
  specs = param_specs(cfg)
  m = cfg.num_mtp_layers if with_mtp else 0
  routed_frac = cfg.num_experts_per_tok / cfg.n_routed_experts if cfg.n_moe_layers else 0.0
  matmul = counts.active - _size({"embed": specs["embed"]})
  routed_per_layer = 0.0  # R_l: routed-expert parameters one token multiplies by in one MoE layer
  if cfg.n_moe_layers:
    routed_per_layer = _size(specs["moe_layers"]["moe"]["experts"]) / cfg.n_moe_layers * routed_frac
  if m:
    mtp = specs["mtp"]
    mtp_routed = _size(mtp["block"]["moe"]["experts"]) if "moe" in mtp["block"] else 0
    matmul += _size(mtp) - mtp_routed * (1 - routed_frac) + m * _size({"lm_head": specs["lm_head"]})
  layers = cfg.n_layers + m
  moe_layers = cfg.n_moe_layers + (m if cfg.n_moe_layers else 0)
  nh, hqk, hv = cfg.n_heads, cfg.qk_head_dim, cfg.v_head_dim
  t_avg = (seq_len + 1) / 2
  dense = 6 * matmul
  attention = 3 * 2 * t_avg * nh * (hqk + hv) * layers

  cp = shape[CONTEXT]
  keys = keys_per_query(seq_len, cp)
  # Attention: forward QK^T + PV; the VJP recomputes QK^T, then dV, dP, dQ, dK: 2 K_vis N (4 Hqk + 3 Hv).
  attn_exec = layers * 2 * keys * nh * (4 * hqk + 3 * hv)
  n = local_tokens or seq_len // cp
  pad = 1.0
  if cfg.n_moe_layers:
    pad = cfg.n_routed_experts * expert_capacity(cfg, n) / (n * cfg.num_experts_per_tok)
  routed = moe_layers * routed_per_layer
  # Routed experts over E C slots: forward 2, VJP recomputes the forward (2) then 4: 8 R_l pad per layer.
  executed = 6 * (matmul - routed) + 8 * routed * pad + attn_exec
  kv_b = 2 * cfg.kv_lora_rank * nh * (cfg.qk_nope_head_dim + hv)  # forward FLOPs of one key's expansion
  cp_extra = kv_b * ((2 * cp + 1) / 2 - 1) * layers if cp > 1 else 0.0
  executed += 3 * cp_extra
  if cfg.remat is Remat.FULL:
    executed += 2 * (matmul - routed) + 2 * routed * pad + layers * 2 * keys * nh * (hqk + hv) + cp_extra
  return Flops(active_params=counts.active, nominal=6.0 * counts.active, matmul_params=matmul, dense=dense,
               attention=attention, model=dense + attention, executed=executed)


# ------------------------------------------------------------------------------------------------------------------
# Communication.
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Communication:
  """Bytes one device sends per step, by collective and purpose (see the module docstring)."""

  items: dict  # (kind, purpose) -> bytes

  def by_kind(self) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for (kind, _), v in self.items.items():
      out[kind] += v
    return dict(out)

  @property
  def total(self) -> float:
    return sum(self.items.values())


def communication(cfg: ModelConfig, mesh_shape: Mapping[str, int], work: Workload) -> Communication:
  """Bytes each device sends per step of `work`, by collective and purpose (see the module docstring)."""
  shape = {a: mesh_shape.get(a, 1) for a in AXES}
  b, t = local_batch(shape, work)
  n = b * t
  dt = _bytes(cfg.dtype)
  items: dict[tuple[str, str], float] = collections.defaultdict(float)
  remat = cfg.remat is not Remat.NONE
  m = cfg.num_mtp_layers if work.with_mtp else 0
  for r in param_rows(cfg, shape):
    if r.path.startswith("mtp/") and not m:
      continue
    what = ("expert weight" if r.expert else "router" if r.region == EXPERT_REGION else "kv_b" if r.region
            else "other weight")
    items[("all-gather", f"FSDP gather of {what} leaves (fwd + bwd)")] += (
        2 * r.gathered_bytes * ring_factor(_group(shape, r.gather_axes)))
    if not r.trainable:
      continue
    if r.region:
      # The region's psum of the whole per-device block; the parameter's shard is then sliced out of it.
      items[("all-reduce", f"{what} gradients, psum in the {r.region} region")] += (
          2 * r.region_grad_bytes * ring_factor(_group(shape, r.region_reduce_axes)))
    else:
      items[("reduce-scatter", "gradients over the gather axes")] += (
          r.gathered_bytes * ring_factor(_group(shape, r.gather_axes)))
      items[("all-reduce", "gradient shards over the replica axes")] += (
          2 * r.local_bytes * ring_factor(_group(shape, r.replica_axes)))
  ld, lm = _layer_counts(cfg, work)
  pe = shape[EXPERT]
  if lm and pe > 1:
    slots = cfg.n_routed_experts * expert_capacity(cfg, n)
    big = slots * cfg.d_model * dt * ring_factor(pe)
    gate = slots * (4 + dt) * ring_factor(pe)
    # Remat does not repeat these: the recomputed forward's exchanges feed only the discarded output (the VJP
    # keeps x, gates and weights), so XLA removes them as dead code.
    items[("all-to-all", "EP dispatch + combine (fwd)")] += lm * 2 * big
    items[("all-to-all", "EP x, cotangent, dx + gates (bwd)")] += lm * (3 * big + gate)
  cp = shape[CONTEXT]
  if cp > 1:
    per_token = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * dt
    extra = 4 * (2 if work.segments else 1)
    layers = ld + lm
    items[("all-gather", "CP latents c_kv + k_rope + positions (fwd)")] += (
        layers * (cp - 1) * n * (per_token + extra) * (2 if remat else 1))
    items[("reduce-scatter", "CP latent cotangents (bwd)")] += layers * (cp - 1) * n * per_token
    # `forward` moves the hidden state into and out of the zig-zag order (once for the stack, twice per MTP
    # block): a take along the context-sharded axis, which XLA's partitioner does by gathering the whole
    # sequence over `context`; the backward's scatter-adds do it again.
    items[("all-gather", "CP zig-zag sequence reorders (fwd + bwd)")] += (
        2 * (1 + 2 * m) * (cp - 1) * n * cfg.d_model * dt)
  return Communication(items=dict(items))


# ------------------------------------------------------------------------------------------------------------------
# The whole plan.
# ------------------------------------------------------------------------------------------------------------------


def analytic_plan(cfg: ModelConfig, mesh_shape: Mapping[str, int], work: Workload) -> dict:
  """Every analytic figure for (cfg, mesh, workload) as a JSON-ready dict (bytes per device, FLOPs per token)."""
  shape = {a: mesh_shape.get(a, 1) for a in AXES}
  b, t = local_batch(shape, work)
  state = state_memory(cfg, shape)
  act = activation_memory(cfg, shape, work)
  fl = flops_per_token(cfg, work.seq_len, with_mtp=work.with_mtp, mesh_shape=shape, local_tokens=b * t)
  comm = communication(cfg, shape, work)
  tokens = work.global_batch * work.seq_len
  return {
      "local_batch": b, "local_seq": t, "local_tokens": b * t, "global_tokens": tokens,
      "param_bytes": state.params, "optimizer_bytes": state.optimizer, "grad_bytes": state.grads,
      "f32_recipe_optimizer_bytes": state.f32_recipe_optimizer, "local_params": state.local_params,
      "activation_saved_bytes": act.saved, "activation_layer_working_bytes": act.layer_working,
      "attention_scores_bytes": act.attention_scores, "moe_buffer_bytes": act.moe_buffers,
      "logits_bytes": act.logits, "activation_peak_bytes": act.peak,
      "layer_factor_none": act.layer_factor_none, "layer_factor_saved": act.layer_factor_saved,
      "total_peak_bytes": state.total + act.peak,
      "flops_per_token_nominal_6n": fl.nominal, "flops_per_token_model": fl.model,
      "flops_per_token_dense": fl.dense, "flops_per_token_attention": fl.attention,
      "flops_per_token_executed": fl.executed, "active_params": fl.active_params,
      "flops_per_device_step_model": fl.model * tokens / math.prod(shape.values()),
      "flops_per_device_step_executed": fl.executed * tokens / math.prod(shape.values()),
      "comm_bytes_by_kind": comm.by_kind(), "comm_bytes_items": {f"{k}: {p}": v for (k, p), v in comm.items.items()},
  }
