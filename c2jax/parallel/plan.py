"""Capacity planning of the train step on a mesh: an analytic memory / FLOP / communication model, and the
accounting of collectives and matmul FLOPs in compiled HLO (the library side of `tools/plan.py`).

Everything here is per device and per optimizer step, and pure Python over shapes (no arrays are built), so that
the model can be checked against hand computations in tests and against XLA's own figures by the planner.

Notation (`c2jax.model.config`): B global sequences per step, T tokens per sequence, b = B / (data fsdp expert)
sequences and t = T / context tokens per device, n = b t local tokens, D model width, N heads, Hqk = Hn + R and
Hv head dims, Lkv + R the MLA latent, E routed experts (E_l = E / P_e local), K top-k, F expert hidden, V vocab,
L layers (Ld dense + Lm MoE), M MTP modules, dt the compute dtype's bytes, P_* mesh axis sizes.

What the model assumes:

Parameters and optimizer state. A parameter's bytes on a device are its bytes over the product of the mesh axes
in its `layout.param_spec` (the `data` axis holds full replicas). c2jax's AdamW (`optax.adamw` with the default
`mu_dtype=None`) keeps mu and nu in the parameter dtype, for trainable leaves only (`router_bias` moves by the
balancing rule), and keeps no separate float32 master copy: for Kimi K2.5 (bf16 params) that is 2 + 4 bytes per
parameter. `StateMemory.f32_recipe_optimizer` gives, beside it, the usual mixed-precision recipe (f32 master,
f32 mu and nu: 12 bytes per parameter) for planning. Gradients: one per parameter leaf in the parameter dtype,
sharded like it.

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

Communication (`communication`, bytes one device sends per step; for these ring / pairwise collectives it also
receives as much; "wire" below means (g - 1) / g of the buffer for all-gather, reduce-scatter and all-to-all over
a group of g, 2 (g - 1) / g of it for all-reduce):
  FSDP all-gather: every parameter is gathered over the axes that shard it (fsdp, and expert where expert does
    not split the experts' own dimension) before use, once in the forward and once in the backward (a Remat.FULL
    recompute shares the backward's gather). Expert weights are gathered over fsdp only: the expert axis keeps
    its experts (the expert-parallel shard_map takes them as P(expert, None, tensor)).
  Gradients: non-expert gradients are reduce-scattered over their shard group and all-reduced over the replica
    axes (data, context); expert gradients are all-reduced over data x fsdp x context inside the expert-parallel
    region (its `pcast` to varying transposes to a psum of the full local-expert gradient) and then sliced.
  EP all-to-all per MoE layer and round (one round when balanced): the forward sends [E, C, D] and gets it back
    (2 exchanges), the backward re-sends x and the output cotangent and returns dx (3 [E, C, D]) plus 2 [E, C]
    gate-sized ones. C = `moe.slot_capacity(n K, E, cf)`. Remat.FULL adds none: the recomputed forward's
    exchanges only feed the discarded output (the hand-written VJP keeps x, gates and weights), and XLA drops them.
  CP all-gather per attention layer: c_kv and k_rope ((Lkv + R) dt per token) and positions (int32) in the
    forward, a reduce-scatter of the latent cotangents in the backward; Remat.FULL gathers again. The zig-zag
    reorder of the hidden state (a take along the context-sharded sequence, in and out of the stack and of each
    MTP block) is done by XLA as an all-gather of the whole sequence, in the forward and again in the backward.
  Tensor-axis collectives (XLA's partitioner) are not modelled; the HLO accounting counts them.
  Checked against the HLO of the Kimi K2.5 step after SPMD partitioning (fsdp:8, expert:64, context:4, 32K
  tokens): all-to-all and expert all-gathers agree to within 1%; XLA emits the non-expert gradient reduction as
  all-reduce of the gathered gradient + slice (twice the reduce-scatter's bytes) at that stage, which XLA:GPU's
  reduce-scatter creation pass later rewrites.

HLO accounting (`hlo_collectives`, `hlo_dot_flops`): parses HLO text (compiled, dumped after SPMD partitioning, or
`lowered.as_text(dialect="hlo")`, where shard_map's explicit collectives already appear with per-device shapes),
multiplies every instruction by how often its computation runs (while bodies by their trip count: `known_trip_count` when XLA gives it,
else the loop bound read from the condition; unknown bounds, e.g. the data-dependent EP rounds, count once and
are reported), and sums the operand bytes and wire bytes of all-gather, reduce-scatter, all-reduce, all-to-all and
collective-permute, and 2 x M x N x K of every dot.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Iterable, Mapping

from c2jax.model import mla
from c2jax.model import moe
from c2jax.model.config import ModelConfig, Remat
from c2jax.model.params import ParamSpec, count_params, param_specs
from c2jax.parallel.layout import param_spec
from c2jax.parallel.mesh import AXES, BATCH_AXES, CONTEXT, DATA, EXPERT, FSDP, TENSOR

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


@dataclasses.dataclass(frozen=True)
class ParamRow:
  """One parameter leaf on the mesh.

  Attributes:
    path: '/'-joined dict keys.
    spec: the leaf's `ParamSpec`.
    itemsize: bytes per element.
    shards: how many ways `layout.param_spec` splits it.
    gathered_shards: how many ways it stays split where it is used (tensor, and expert on the experts' dim).
    expert: whether it is a routed-expert weight (used inside the expert-parallel region).
    trainable: whether AdamW keeps moments for it.
  """

  path: str
  spec: ParamSpec
  itemsize: int
  shards: int
  gathered_shards: int
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


def _flatten_specs(tree, prefix=""):
  for k, v in tree.items():
    path = f"{prefix}/{k}" if prefix else k
    if isinstance(v, ParamSpec):
      yield path, v
    else:
      yield from _flatten_specs(v, path)


def param_rows(cfg: ModelConfig, mesh_shape: Mapping[str, int]) -> list[ParamRow]:
  """Every parameter leaf with its shard counts on a mesh of `mesh_shape` (axis name -> size)."""
  shape = {a: mesh_shape.get(a, 1) for a in AXES}
  rows = []
  for path, s in _flatten_specs(param_specs(cfg)):
    spec = param_spec(s.shape, s.axes, shape)
    shards, kept = 1, 1
    for dim_axes, logical in zip(tuple(spec) + (None,) * (len(s.shape) - len(spec)), s.axes):
      names = () if dim_axes is None else (dim_axes,) if isinstance(dim_axes, str) else tuple(dim_axes)
      for a in names:
        shards *= shape[a]
        if a == TENSOR or (a == EXPERT and logical == "expert"):
          kept *= shape[a]
    rows.append(ParamRow(path=path, spec=s, itemsize=_bytes(s.dtype or cfg.param_dtype), shards=shards,
                         gathered_shards=kept, expert="expert" in s.axes, trainable=not path.endswith("router_bias")))
  return rows


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
    keep = lambda i: True  # noqa: E731
  elif cfg.remat is Remat.FULL:
    keep = lambda i: i.name.startswith("h (layer input)")  # noqa: E731
  else:
    keep = lambda i: i.dots or i.name.startswith("h (layer input)")  # noqa: E731
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


def _ring(group: int) -> float:
  return (group - 1) / group if group > 1 else 0.0


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
    gather_group = r.shards // r.gathered_shards
    if r.expert:
      items[("all-gather", "FSDP gather of expert weights (fwd + bwd)")] += 2 * r.gathered_bytes * _ring(gather_group)
      reduce_group = shape[DATA] * shape[FSDP] * shape[CONTEXT]
      items[("all-reduce", "expert gradients over data x fsdp x context")] += (
          2 * r.gathered_bytes * _ring(reduce_group))
    else:
      items[("all-gather", "FSDP gather of other weights (fwd + bwd)")] += 2 * r.gathered_bytes * _ring(gather_group)
      items[("reduce-scatter", "gradients over the shard group")] += r.gathered_bytes * _ring(gather_group)
      replicas = shape[DATA] * shape[CONTEXT]
      items[("all-reduce", "gradients over data x context")] += 2 * r.local_bytes * _ring(replicas)
  ld, lm = _layer_counts(cfg, work)
  pe = shape[EXPERT]
  if lm and pe > 1:
    slots = cfg.n_routed_experts * expert_capacity(cfg, n)
    big = slots * cfg.d_model * dt * _ring(pe)
    gate = slots * (4 + dt) * _ring(pe)
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
# HLO accounting.
# ------------------------------------------------------------------------------------------------------------------

_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
              "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 0.5, "u4": 0.5, "f8e4m3fn": 1, "f8e5m2": 1,
              "f8e4m3": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5, "token": 0}
_SHAPE_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
# Computation headers: 'ENTRY %main.1 (p: f32[2]) -> f32[2] {' (compiled text) or 'region_0.3 {' (lowered HLO).
_HEADER_RE = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)(\s*\(.*\)\s*->\s*.*)?\s*\{\s*$")
_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")


def shape_bytes(type_text: str) -> float:
  """Bytes of an HLO type: an array 'bf16[4,8]{1,0}' or a tuple of them."""
  total = 0.0
  for dtype, dims in _SHAPE_RE.findall(type_text):
    if dtype not in _HLO_BYTES:
      continue
    total += _HLO_BYTES[dtype] * math.prod(int(x) for x in dims.split(",") if x)
  return total


def _split_type(rest: str) -> tuple[str, str]:
  """'TYPE opcode(...), attrs' -> (TYPE, 'opcode(...), attrs')."""
  if rest.startswith("("):
    depth = 0
    for i, c in enumerate(rest):
      depth += c == "("
      depth -= c == ")"
      if depth == 0:
        return rest[:i + 1], rest[i + 1:].lstrip()
  head, _, tail = rest.partition(" ")
  return head, tail


def _split_call(text: str) -> tuple[str, str, str]:
  """'opcode(a, b), attrs' -> (opcode, 'a, b', attrs)."""
  op, paren, rest = text.partition("(")
  if not paren:
    return op.strip(), "", ""
  depth = 1
  for i, c in enumerate(rest):
    depth += c == "("
    depth -= c == ")"
    if depth == 0:
      return op.strip(), rest[:i], rest[i + 1:]
  return op.strip(), rest, ""


@dataclasses.dataclass(frozen=True)
class HloInstruction:
  name: str
  type_text: str
  opcode: str
  operands: tuple[str, ...]
  attrs: str


@dataclasses.dataclass
class HloModule:
  """Computations of an HLO text module: name -> instructions, the entry, and every instruction's type."""

  computations: dict[str, list[HloInstruction]]
  entry: str
  types: dict[str, str]


def parse_hlo(text: str) -> HloModule:
  """Parses HLO text into computations of instructions (name, result type, opcode, operand names, attributes)."""
  comps: dict[str, list[HloInstruction]] = {}
  types: dict[str, str] = {}
  entry, current = "", None
  for line in text.splitlines():
    if current is None:
      m = _HEADER_RE.match(line)
      if m:
        current = m.group(2)
        comps[current] = []
        if m.group(1):
          entry = current
      continue
    if line.startswith("}"):
      current = None
      continue
    m = _INSTR_RE.match(line)
    if not m:
      continue
    name, rest = m.groups()
    type_text, call = _split_type(rest)
    opcode, operands, attrs = _split_call(call)
    ops = tuple(o.strip().split(" ")[-1].lstrip("%") for o in _split_top(operands) if o.strip())
    types[name] = type_text
    comps[current].append(HloInstruction(name, type_text, opcode, ops, attrs))
  return HloModule(comps, entry, types)


def _split_top(text: str) -> list[str]:
  """Splits on commas outside brackets and braces."""
  out, depth, cur = [], 0, []
  for c in text:
    if c in "([{":
      depth += 1
    elif c in ")]}":
      depth -= 1
    if c == "," and depth == 0:
      out.append("".join(cur))
      cur = []
    else:
      cur.append(c)
  if cur:
    out.append("".join(cur))
  return out


_TRIP_RE = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')
_CALLEE_RE = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES_RE = re.compile(r"branch_computations=\{([^}]*)\}")
_CALLED_RE = re.compile(r"called_computations=\{([^}]*)\}")


def _loop_bound(module: HloModule, cond: str) -> int | None:
  """The constant a counter is compared against in a while condition (scan / fori_loop from 0), or None."""
  instrs = module.computations.get(cond, [])
  consts = {}
  for ins in instrs:
    if ins.opcode == "constant" and re.match(r"^s(32|64)\[\]", ins.type_text):
      consts[ins.name] = int(ins.operands[0]) if ins.operands and ins.operands[0].lstrip("-").isdigit() else None
  for ins in instrs:
    names = list(ins.operands)
    if ins.opcode == "fusion":  # the compare may sit inside a fusion; look for its constant there
      m = re.search(r"calls=%?([\w.\-]+)", ins.attrs)
      sub = _loop_bound(module, m.group(1)) if m else None
      if sub is not None:
        return sub
    if ins.opcode == "compare" and "direction=LT" in ins.attrs:
      for nm in names:
        if consts.get(nm) is not None:
          return consts[nm]
  if len([v for v in consts.values() if v]) == 1:
    return next(v for v in consts.values() if v)
  return None


def execution_counts(module: HloModule) -> tuple[dict[str, float], list[str]]:
  """How many times each computation runs per call of the entry, and the while loops of unknown trip count."""
  edges: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
  unknown = []
  for comp, instrs in module.computations.items():
    for ins in instrs:
      trip = 1.0
      if ins.opcode == "while":
        m = _TRIP_RE.search(ins.attrs)
        cond = re.search(r"condition=%?([\w.\-]+)", ins.attrs)
        bound = int(m.group(1)) if m else (_loop_bound(module, cond.group(1)) if cond else None)
        if bound is None:
          unknown.append(ins.name)
        trip = float(bound) if bound is not None else 1.0
      for kind, callee in _CALLEE_RE.findall(ins.attrs):
        # to_apply names both `call` targets (shard_map bodies before optimization) and reductions' scalar
        # computations (which hold neither collectives nor dots).
        edges[comp].append((callee, trip if kind in ("body", "condition") else 1.0))
      for group in _BRANCHES_RE.findall(ins.attrs) + _CALLED_RE.findall(ins.attrs):
        for callee in group.split(","):
          edges[comp].append((callee.strip().lstrip("%"), 1.0))
  counts: dict[str, float] = collections.defaultdict(float)
  # Computations form a DAG; accumulate in topological order (callers before callees).
  order: list[str] = []
  seen: set[str] = set()

  def visit(c: str):
    if c in seen:
      return
    seen.add(c)
    for callee, _ in edges.get(c, ()):
      visit(callee)
    order.append(c)

  visit(module.entry)
  counts[module.entry] = 1.0
  for c in reversed(order):
    for callee, factor in edges.get(c, ()):
      counts[callee] += counts[c] * factor
  return dict(counts), unknown


def group_size(attrs: str) -> int:
  """Devices per replica group of a collective's attributes (all three HLO spellings), 0 if none is given."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\][^{]*\{([^}]*)\}", attrs)
  if m:
    sizes = {k.strip("' "): int(v) for k, v in (kv.split("=") for kv in m.group(1).split(","))}
    return math.prod(sizes[a.strip("' ")] for a in m.group(2).split(",") if a.strip())
  m = re.search(r"replica_groups=\[([\d,]+)\]<=", attrs)
  if m:
    return int(m.group(1).split(",")[-1])
  m = re.search(r"replica_groups=\{(\{[^}]*\})", attrs)
  if m:
    return len([x for x in m.group(1).strip("{}").split(",") if x.strip()])
  m = re.search(r"source_target_pairs=\{(.*?)\}\s*(,|$)", attrs)
  if m:
    return 2 if m.group(1).strip() else 0
  return 0


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
  """One collective instruction of the compiled program.

  Attributes:
    kind: one of `COLLECTIVES`.
    name: instruction name.
    result_type: its HLO result type.
    operand_bytes / result_bytes: per execution, per device.
    group: devices per replica group.
    executions: how many times it runs per step (loop trip counts).
    op_name: the JAX op path from the metadata (fwd ops have 'jvp(', bwd ones 'transpose(').
  """

  kind: str
  name: str
  result_type: str
  operand_bytes: float
  result_bytes: float
  group: int
  executions: float
  op_name: str

  @property
  def wire_bytes(self) -> float:
    """Bytes this device sends per step (ring / pairwise algorithms)."""
    g = self.group
    if self.kind == "all-gather":
      per = self.result_bytes * _ring(g)
    elif self.kind == "reduce-scatter":
      per = self.operand_bytes * _ring(g)
    elif self.kind == "all-reduce":
      per = 2 * self.operand_bytes * _ring(g)
    elif self.kind == "all-to-all":
      per = self.operand_bytes * _ring(g)
    else:
      per = self.operand_bytes if g else 0.0
    return per * self.executions


def hlo_collectives(text: str) -> tuple[list[CollectiveRecord], list[str]]:
  """Every collective of an HLO text module with its per-step executions; also the loops of unknown trip count."""
  module = parse_hlo(text)
  counts, unknown = execution_counts(module)
  out = []
  for comp, instrs in module.computations.items():
    runs = counts.get(comp, 0.0)
    if not runs:
      continue
    for ins in instrs:
      kind = ins.opcode[:-len("-start")] if ins.opcode.endswith("-start") else ins.opcode
      if kind not in COLLECTIVES:
        continue
      operand_bytes = sum(shape_bytes(module.types.get(o, "")) for o in ins.operands)
      result_type = ins.type_text
      result_bytes = shape_bytes(result_type)
      if ins.opcode == "all-gather-start":  # returns (operands, results)
        result_bytes -= operand_bytes
      elif ins.opcode == "collective-permute-start":  # returns (operand, result, scratch)
        result_bytes = operand_bytes
      op_name = re.search(r'op_name="([^"]*)"', ins.attrs)
      out.append(CollectiveRecord(kind=kind, name=ins.name, result_type=result_type, operand_bytes=operand_bytes,
                                  result_bytes=result_bytes, group=group_size(ins.attrs), executions=runs,
                                  op_name=op_name.group(1) if op_name else ""))
  return out, unknown


def summarize_collectives(records: Iterable[CollectiveRecord]) -> dict[str, dict[str, float]]:
  """kind -> {count (instructions), executions, operand_bytes, wire_bytes} per step and device."""
  out: dict[str, dict[str, float]] = {}
  for r in records:
    s = out.setdefault(r.kind, {"count": 0, "executions": 0.0, "operand_bytes": 0.0, "wire_bytes": 0.0})
    s["count"] += 1
    s["executions"] += r.executions
    s["operand_bytes"] += r.operand_bytes * r.executions
    s["wire_bytes"] += r.wire_bytes
  return out


def _dims(type_text: str) -> list[int]:
  m = _SHAPE_RE.search(type_text)
  return [int(x) for x in m.group(2).split(",") if x] if m else []


def hlo_dot_flops(text: str) -> tuple[float, list[str]]:
  """2 x (result elements) x (contracted size) summed over every dot, times its executions per step."""
  module = parse_hlo(text)
  counts, unknown = execution_counts(module)
  total = 0.0
  for comp, instrs in module.computations.items():
    runs = counts.get(comp, 0.0)
    if not runs:
      continue
    for ins in instrs:
      if ins.opcode != "dot":
        continue
      lhs = _dims(module.types.get(ins.operands[0], "")) if ins.operands else []
      m = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", ins.attrs)
      contract = math.prod(lhs[int(i)] for i in m.group(1).split(",") if i) if m and lhs else 1
      total += 2.0 * math.prod(_dims(ins.type_text)) * contract * runs
  return total, unknown


def expert_weight_gathers(records: Iterable[CollectiveRecord], cfg: ModelConfig,
                          mesh_shape: Mapping[str, int]) -> dict[str, float]:
  """All-gathers whose result is a routed-expert weight block [.., X, D, F_t] or [.., X, F_t, D], X in {E_l, E}.

  Returns {bytes: result bytes x executions, wire_bytes, full_expert_bytes: of those, the ones that hold all E
  experts on a device (the degenerate case when the expert axis is split)}. A shape heuristic: another weight
  with the same trailing dims and a leading dim equal to E_l or E would count too.
  """
  e = cfg.n_routed_experts
  el = e // mesh_shape.get(EXPERT, 1)
  d, f = cfg.d_model, cfg.moe_intermediate_size // mesh_shape.get(TENSOR, 1)
  out = {"bytes": 0.0, "wire_bytes": 0.0, "full_expert_bytes": 0.0, "count": 0}
  for r in records:
    if r.kind != "all-gather":
      continue
    dims = _dims(r.result_type)
    if len(dims) < 3 or tuple(dims[-2:]) not in ((d, f), (f, d)) or dims[-3] not in (e, el):
      continue
    out["count"] += 1
    out["bytes"] += r.result_bytes * r.executions
    out["wire_bytes"] += r.wire_bytes
    if dims[-3] == e and mesh_shape.get(EXPERT, 1) > 1:
      out["full_expert_bytes"] += r.result_bytes * r.executions
  return out


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


_ALLOCATION_RE = re.compile(r"^allocation \d+: size (\d+), (parameter|preallocated-temp|output|maybe-live-out|"
                            r"thread-local|constant)?")


def buffer_assignment_bytes(text: str) -> dict[str, float]:
  """Sizes from XLA's buffer-assignment dump (`*-buffer-assignment.txt`): the figures of `memory_analysis`.

  Returns {argument_bytes: parameter allocations, temp_bytes: the preallocated temp buffer plus other
  non-parameter allocations, total_bytes: all allocations}.
  """
  out = {"argument_bytes": 0.0, "temp_bytes": 0.0, "total_bytes": 0.0}
  for line in text.splitlines():
    m = _ALLOCATION_RE.match(line)
    if not m:
      continue
    size = float(m.group(1))
    out["total_bytes"] += size
    if m.group(2) == "parameter":
      out["argument_bytes"] += size
    elif m.group(2) in ("preallocated-temp", "thread-local", None):
      out["temp_bytes"] += size
  return out
