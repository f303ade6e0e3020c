"""The agent engine's device half: S slots, each holding one trajectory's MLA latent KV cache for the trajectory's
whole life, with jitted operations to append tokens to slots (chunked prefill) and to decode every slot whose model
turn is running (report section 4: RL episodes are multi-turn agent sessions; section 6: actors generate most of
the tokens, with in-flight weight updates).

  state = init_state(cfg, engine=EngineConfig(slots=8, context=2048))
  state = append(params, state, chunk, chunk_lengths, reset=..., draw=..., turn_end=..., keys=..., version=v, ...)
  state = decode(params, state, steps=16, version=v, ...)     # until every running turn ends, or 16 steps
  state.tokens / length / decoding / stopped ...               # what the host loop (`agent_loop`) reads

A slot's buffers hold its positions 0 .. length - 1: the prompt, the model's turns and the observations appended
between them. Positions 0 .. fed - 1 are in the cache. A token the model has drawn but that was not yet fed (the
newest token of a turn) makes length = fed + 1; the next `append` feeds it ahead of the appended chunk, so an
observation costs exactly its own tokens and nothing cached is ever prefilled again.

  append: writes chunk [S, c] (chunk_lengths[s] tokens of slot s, 0 for slots left alone) at the slot's end and
          feeds positions fed .. new length - 1; then, where `draw`, starts a model turn: draws the token at the new
          end from the last fed position's logits. `reset` empties a slot first (a new episode: its prompt is the
          chunk). A slot with chunk_lengths 0 and draw False only feeds its pending token (an episode's end: the
          trainer's forward replays the routing of every position, the last one included). `keep` rewinds a slot
          to its first keep positions first (a new segment of a self-summary chain: the task's first observation
          stays cached, the rest is written over), keeping the episode's key and draw count.
  decode: for every slot with a running turn, feeds its newest token and draws the next, until a stop token or
          stop sequence (`SamplingConfig`) or the turn's end position `turn_end` (its token budget); at most
          `steps` steps, fewer once no turn is running. Other slots' caches are untouched.
  force:  for every slot whose running turn a script forces, what `decode` would do to it in up to `chunk` steps,
          in one forward over the chunk (teachers' and scripted policies' turns cost a prefill, not a decode loop).

Randomness is the slot's own: the d-th token drawn in an episode uses fold_in(key, d) of the episode's key, so a
trajectory does not depend on which slot holds it, what the other slots do, or how the steps are chunked (the
continuous-batching test). Slots that do not take part in a call are fed at position `context`, where every cache
write is dropped (`decode.cached_block`), so they change nothing. `params` may change between calls (an in-flight
weight update); every drawn token is stamped with the `version` of the call that drew it.

Attention reads only a window of the cache: the smallest of 256, 512, ... above the positions a call feeds
(`EngineConfig.window`, chosen by the host from the slots' lengths), so a decode step costs the slots' lengths,
not the context.

Shapes: S slots, C = context positions per slot, c a chunk bucket (`EngineConfig.chunk_sizes`), V vocab, Lm MoE
layers, K experts per token. One program per (chunk bucket, window) for append and force, one per window for
decode (and each per number of rows, for calls on a subset of the slots; `Shapes.FULL`: all slots, one window).
The stop tokens are a traced argument, not a compile-time constant: samplings that differ only in them (chat
formats' end-of-turn ids) share programs.
"""

from __future__ import annotations

import dataclasses
import enum
import functools

import jax
import jax.numpy as jnp

from c2jax.actors import sampler as sampler_lib
from c2jax.actors.sampling import DrawMode, SamplingConfig, draw, log_distribution, stop_hit
from c2jax.model import decode as decode_lib
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params
from c2jax.model.sharding import Layout


class Shapes(enum.Enum):
  """Which shapes the host's calls take (`EngineConfig.shapes`)."""

  # A call computes its slots padded to a row bucket (`EngineConfig.rows`) and attends to the smallest window above
  # them: its cost follows the slots' work, at up to one program per (rows, chunk, window).
  FITTED = "fitted"
  # Every call computes all S slots over the whole context: one program per chunk, for a model whose forwards cost
  # little next to compiling a program (teacher traces' scorer: `c2jax.services.teacher_traces`).
  FULL = "full"


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """The engine's fixed shapes.

  Attributes:
    slots: S, trajectories held at once.
    context: C, positions per slot (prompt, turns and observations together).
    chunk_sizes: the buckets of an append (ascending); an append of n tokens (plus a pending one) uses the smallest
      bucket that holds them, and longer ones are split into chunks of the largest. Each bucket compiles once.
    max_forced: F, the longest turn a script may force through the engine (0: no forcing). A forced turn takes the
      script's tokens instead of drawing, with their log-probs under the model: `force` runs it a chunk per
      forward, `decode` step by step like a sampled one (scripted policies on the engine's real schedule).
    shapes: which shapes the host's calls take (`Shapes`): fitted to the slots they run, or all slots and the
      whole context.
    row_buckets: the row counts a call on some of the slots computes (`Shapes.FITTED`, one device): the slots it
      runs padded with idle ones to the smallest bucket that holds them, or all S past the largest below S. Empty:
      the powers of two. Each bucket is a program per chunk and window, so fewer buckets compile fewer programs
      for a little padded work.
  """

  slots: int = 8
  context: int = 2048
  chunk_sizes: tuple[int, ...] = (16, 64, 256)
  max_forced: int = 0
  shapes: Shapes = Shapes.FITTED
  row_buckets: tuple[int, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "chunk_sizes", tuple(sorted(int(c) for c in self.chunk_sizes)))
    object.__setattr__(self, "row_buckets", tuple(sorted(int(k) for k in self.row_buckets)))
    if self.slots < 1 or self.context < 2:
      raise ValueError(f"EngineConfig: slots={self.slots} must be >= 1 and context={self.context} >= 2.")
    if not self.chunk_sizes or self.chunk_sizes[0] < 2:
      raise ValueError(f"EngineConfig.chunk_sizes={self.chunk_sizes} must be non-empty, each >= 2 (a chunk carries "
                       "the pending token ahead of the appended ones).")
    if any(k < 1 for k in self.row_buckets) or len(set(self.row_buckets)) < len(self.row_buckets):
      raise ValueError(f"EngineConfig.row_buckets={self.row_buckets} must be distinct row counts >= 1.")

  def row_counts(self) -> tuple[int, ...]:
    """The row buckets below S, ascending (`Shapes.FULL`: none, every call computes all S)."""
    if self.shapes is Shapes.FULL:
      return ()
    buckets = self.row_buckets or tuple(2 ** i for i in range(self.slots.bit_length()))
    return tuple(k for k in buckets if k < self.slots)  # a bucket of S or more is all S

  def rows(self, n: int) -> int:
    """The rows a call on n of the slots computes: the smallest row bucket that holds them, else S (all slots)."""
    return next((k for k in self.row_counts() if k >= n), self.slots)

  def windows(self) -> tuple[int, ...]:
    """Every window a call may take (`window`), ascending."""
    return tuple(sorted({self.window(n) for n in (1, *(2 ** i for i in range(self.context.bit_length() + 1)),
                                                   self.context)}))

  def window(self, n: int) -> int:
    """The attention window of a call feeding positions < n: the smallest of 256, 512, 1024, ... (doubling) and the
    context that is >= n. Attention then costs the slots' lengths rather than the context; log2(C / 256) + 1
    windows compile per program. `Shapes.FULL`: the context."""
    if self.shapes is Shapes.FULL:
      return self.context
    w = 256
    while w < n and w < self.context:
      w *= 2
    return min(w, self.context)

  def bucket(self, n: int) -> int:
    """The chunk size of an append feeding n positions (n <= the largest bucket)."""
    for c in self.chunk_sizes:
      if n <= c:
        return c
    raise ValueError(f"An append of {n} positions exceeds the largest chunk {self.chunk_sizes[-1]}; split it.")


@dataclasses.dataclass(frozen=True)
class SlotState:
  """The engine's device state (a pytree).

  Attributes:
    cache: the latent KV cache, [.., S, C, ..] per layer stack.
    tokens: [S, C] int32 each slot's tokens (positions >= length hold whatever an earlier episode left).
    logprobs: [S, C] float32 the sampling log-prob of each drawn token (0 elsewhere in the current episode).
    versions: [S, C] int32 the weights version that drew each token.
    expert_ids: [Lm, S, C, K] int32 routed experts of every fed position (routing replay).
    fed: [S] int32 positions in the cache.
    length: [S] int32 positions held (fed, or fed + 1 with a drawn token not yet fed).
    turn_start: [S] int32 first position of the current (or last) model turn.
    turn_end: [S] int32 the current turn draws only at positions < turn_end.
    decoding: [S] bool the slot's model turn is running.
    stopped: [S] bool the last turn ended on a stop token or sequence (not on its budget).
    keys: [S] typed PRNG keys, one per episode.
    drawn: [S] int32 tokens drawn in the slot's episode (the index of the next draw).
    knobs: [3] float32 temperature, top_k, top_p.
    forced: [S, F] int32 the current turn's forced tokens; forced_len [S] int32 how many (0: the turn samples).
  """

  cache: decode_lib.KVCache
  tokens: jax.Array
  logprobs: jax.Array
  versions: jax.Array
  expert_ids: jax.Array
  fed: jax.Array
  length: jax.Array
  turn_start: jax.Array
  turn_end: jax.Array
  decoding: jax.Array
  stopped: jax.Array
  keys: jax.Array
  drawn: jax.Array
  knobs: jax.Array
  forced: jax.Array
  forced_len: jax.Array


jax.tree_util.register_dataclass(SlotState, data_fields=[f.name for f in dataclasses.fields(SlotState)],
                                 meta_fields=[])


def _check_layout(layout: Layout | None, slots: int) -> None:
  sampler_lib.check_decode_layout(layout, slots, "EngineConfig.slots")


def init_state(cfg: ModelConfig, engine: EngineConfig, sampling: SamplingConfig, key: jax.Array | None = None,
               layout: Layout | None = None) -> SlotState:
  """Empty slots (every slot free: length 0, no turn running)."""
  _check_layout(layout, engine.slots)
  s, c = engine.slots, engine.context
  key = jax.random.key(0) if key is None else key
  zeros = lambda dt: jnp.zeros((s, c), dt)
  state = SlotState(
      cache=decode_lib.init_cache(cfg, s, c), tokens=zeros(jnp.int32), logprobs=zeros(jnp.float32),
      versions=zeros(jnp.int32), expert_ids=jnp.zeros((cfg.n_moe_layers, s, c, cfg.num_experts_per_tok), jnp.int32),
      fed=jnp.zeros((s,), jnp.int32), length=jnp.zeros((s,), jnp.int32), turn_start=jnp.zeros((s,), jnp.int32),
      turn_end=jnp.zeros((s,), jnp.int32), decoding=jnp.zeros((s,), bool), stopped=jnp.zeros((s,), bool),
      keys=jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(s)), drawn=jnp.zeros((s,), jnp.int32),
      knobs=sampler_lib.knobs(sampling), forced=jnp.zeros((s, engine.max_forced), jnp.int32),
      forced_len=jnp.zeros((s,), jnp.int32))
  if layout is not None:
    state = jax.device_put(state, _state_shardings(state, layout))
  return state


def _state_shardings(state: SlotState, layout: Layout):
  """Slots along the mesh's batch axes (data, fsdp, expert), as the sampler shards its rows."""
  from jax.sharding import NamedSharding, PartitionSpec
  rows = ("data", "fsdp", "expert")

  def spec(path, leaf):
    name = jax.tree_util.keystr(path)
    if leaf.ndim == 0 or "knobs" in name:
      return NamedSharding(layout.mesh, PartitionSpec())
    axis = 1 if ("cache" in name or "expert_ids" in name) else 0
    parts = [None] * leaf.ndim
    parts[axis] = rows
    return NamedSharding(layout.mesh, PartitionSpec(*parts))

  return jax.tree_util.tree_map_with_path(spec, state)


# Buffers are written by scatters whose invalid entries point past the context and are dropped: O(S x j) work per
# write, where a dense select over [S, j, C] (what the sampler does, for its short rows) would cost O(S x j x C) and
# dominate a decode step at long contexts.
def _write(buf: jax.Array, positions: jax.Array, values: jax.Array, valid: jax.Array) -> jax.Array:
  """buf [S, C] with values [S, j] at positions [S, j] where valid [S, j] (others untouched)."""
  rows = jnp.arange(buf.shape[0])[:, None]
  return buf.at[rows, jnp.where(valid, positions, buf.shape[1])].set(values.astype(buf.dtype), mode="drop")


def _write_ids(ids: jax.Array, positions: jax.Array, values: jax.Array, valid: jax.Array) -> jax.Array:
  """ids [Lm, S, C, K] with values [Lm, S, j, K] at positions [S, j] where valid [S, j]."""
  rows = jnp.arange(ids.shape[1])[:, None]
  return ids.at[:, rows, jnp.where(valid, positions, ids.shape[2])].set(values.astype(ids.dtype), mode="drop")


def _draw(logits, s: SlotState, k: jax.Array, mode: DrawMode):
  """One token per slot from logits [S, V] with the slot's own key and draw index, or the k-th forced token of the
  turn where the slot has one; returns (token [S], its log-prob under the sampling distribution [S], forced [S])."""
  knobs = (s.knobs[0], s.knobs[1].astype(jnp.int32), s.knobs[2])
  step_keys = jax.vmap(jax.random.fold_in)(s.keys, s.drawn)
  token, logprob = draw(logits, step_keys, jnp.int32(0), *knobs, mode)
  if s.forced.shape[1] == 0:
    return token, logprob, jnp.zeros_like(token, bool)
  forced = k < s.forced_len
  script = jnp.take_along_axis(s.forced, jnp.clip(k, 0, s.forced.shape[1] - 1)[:, None], axis=1)[:, 0]
  token = jnp.where(forced, script, token)
  logprob = jnp.where(forced, jnp.take_along_axis(log_distribution(logits, *knobs, mode), token[:, None],
                                                  axis=-1)[:, 0], logprob)
  return token, logprob, forced


def _turn_over(tokens, end, start, st: SlotState, was_forced, count, sampling: SamplingConfig,
               stop_tokens: jax.Array) -> jax.Array:
  """[S] the token at `end` ends its turn: a stop token (of `stop_tokens`) or sequence of a sampled turn, or the
  last token of a forced one (`count` tokens of the turn written so far)."""
  sampled = ~was_forced & stop_hit(tokens, end, start, sampling, stop_tokens=stop_tokens)
  return sampled | (was_forced & (count >= st.forced_len))


def _static(sampling: SamplingConfig) -> SamplingConfig:
  """The compile-time part of `sampling` for the engine's programs: `SamplingConfig.structure` less the stop
  tokens, which travel as a traced [n] array (`_stops`), so that samplings differing only in their stop tokens
  (chat formats with different end-of-turn ids) share every program."""
  return dataclasses.replace(sampling.structure(), stop_tokens=())


def _stops(sampling: SamplingConfig) -> jax.Array:
  return jnp.asarray(sampling.stop_tokens, jnp.int32).reshape(-1)


def append(params: Params, state: SlotState, chunk: jax.Array, chunk_lengths: jax.Array, *, take_part: jax.Array,
           reset: jax.Array, draw: jax.Array, turn_end: jax.Array, keys: jax.Array, version: int | jax.Array,
           forced: jax.Array | None = None, forced_len: jax.Array | None = None, keep: jax.Array | None = None,
           window: int | None = None, rows: jax.Array | None = None, cfg: ModelConfig, sampling: SamplingConfig,
           layout: Layout | None = None) -> SlotState:
  """Appends chunk [S, c] (chunk_lengths [S] tokens per slot) and feeds every unfed position; see the module
  docstring.

  Args:
    params: the weights of this call.
    state: the engine state.
    chunk: [S, c] int token ids, left-aligned; c is a bucket (c >= chunk_lengths + 1 where a pending token is fed).
    chunk_lengths: [S] int tokens of each slot's chunk (0: nothing appended).
    take_part: [S] bool the slots this call appends to (or only feeds); the others are left exactly as they are
      (a running turn, a slot waiting for its tools with its pending token, a free slot).
    reset: [S] bool empty the slot first (a new episode), taking `keys[s]` as its episode key.
    draw: [S] bool start a model turn after the chunk: draw the token at the new end.
    turn_end: [S] int the started turn's end position (<= C; the turn draws at positions < turn_end).
    keys: [S] typed episode keys (read where `reset`).
    version: the weights version stamped on drawn tokens.
    forced: [S, F] int the started turn's forced tokens (EngineConfig.max_forced = F > 0), forced_len [S] how many
      (0: the turn samples). A forced turn ends after its last forced token.
    keep: [S] int, where >= 0: rewind the slot to its first keep positions (at most those in its cache) before
      the chunk, dropping the rest, a pending token included; the episode's key and draw count go on (a new
      segment of the same episode: `agent_loop`'s self-summaries). -1 or None: no rewind.
    window: attend to the first `window` positions only (a bucket of `EngineConfig.window`, static): must exceed
      every position this call feeds (the taking-part slots' new lengths); None: the whole context.
    rows: [k] distinct slot indices (k < S, one program per k): the call computes only these slots, and every
      per-slot argument above is given for them, in this order ([k, c], [k], ...). An append to one slot of
      eight then costs an eighth (the others are not run through the model at all). None: all S slots.
    cfg, sampling, layout: the model, how tokens are drawn (stop tokens and sequences end a turn), the mesh.
  """
  take_part = jnp.asarray(take_part, bool)
  s, f = (state.forced.shape[0] if rows is None else len(rows)), state.forced.shape[1]
  forced = jnp.zeros((s, f), jnp.int32) if forced is None else jnp.asarray(forced, jnp.int32)
  forced_len = jnp.zeros((s,), jnp.int32) if forced_len is None else jnp.asarray(forced_len, jnp.int32)
  keep = jnp.full((s,), -1, jnp.int32) if keep is None else jnp.asarray(keep, jnp.int32)
  if forced.shape != (s, f):
    raise ValueError(f"append: forced has shape {forced.shape}; expected [S, F] = ({s}, {f}) "
                     "(EngineConfig.max_forced).")
  args = (jnp.asarray(chunk, jnp.int32), jnp.asarray(chunk_lengths, jnp.int32) * take_part,
          jnp.asarray(reset, bool) & take_part, jnp.asarray(draw, bool) & take_part, take_part,
          jnp.asarray(turn_end, jnp.int32), keys, forced, forced_len, jnp.where(take_part, keep, -1),
          jnp.asarray(version, jnp.int32), _stops(sampling))
  static = dict(cfg=cfg, sampling=_static(sampling), mode=sampling.mode, window=window, layout=layout)
  if rows is None:
    return _append(params, state, *args, **static)
  if layout is not None:
    raise ValueError("append: rows (a subset of the slots) is for one device; under a mesh append to all slots.")
  return _append_rows(params, state, jnp.asarray(rows, jnp.int32), *args, **static)


_in_layout = sampler_lib.in_layout


def _slot_axis(path) -> int | None:
  """The slot axis of a `SlotState` leaf: 1 for the cache and the expert ids, none for the knobs, else 0."""
  name = jax.tree_util.keystr(path)
  if "knobs" in name:
    return None
  return 1 if ("cache" in name or "expert_ids" in name) else 0


def _take_rows(state: SlotState, rows: jax.Array) -> SlotState:
  def take(path, a):
    axis = _slot_axis(path)
    return a if axis is None else jnp.take(a, rows, axis=axis)
  return jax.tree_util.tree_map_with_path(take, state)


def _put_rows(state: SlotState, rows: jax.Array, sub: SlotState) -> SlotState:
  def put(path, a, b):
    axis = _slot_axis(path)
    if axis is None:
      return a
    return a.at[rows].set(b) if axis == 0 else a.at[:, rows].set(b)
  return jax.tree_util.tree_map_with_path(put, state, sub)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "window", "layout"), donate_argnums=(1,))
@_in_layout
def _append_rows(params, state: SlotState, rows, *args, cfg, sampling, mode, window):
  """`_append_body` on the slots `rows` only: gathered, appended, written back in place."""
  sub = _append_body(params, _take_rows(state, rows), *args, cfg=cfg, sampling=sampling, mode=mode, window=window)
  return _put_rows(state, rows, sub)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "window", "layout"), donate_argnums=(1,))
@_in_layout
def _append(params, state: SlotState, *args, cfg, sampling, mode, window):
  return _append_body(params, state, *args, cfg=cfg, sampling=sampling, mode=mode, window=window)


def _append_body(params, state: SlotState, chunk, chunk_lengths, reset, draw_mask, take_part, turn_end, keys, forced,
                 forced_len, keep, version, stop_tokens, *, cfg, sampling, mode, window):
  s, c = chunk.shape
  context = state.tokens.shape[1]
  slots = jnp.arange(s)
  turn_end = jnp.minimum(turn_end, context)
  # A rewind keeps cached positions only; the positions after them are written over before anything attends to
  # them (attention is causal over positions, so what the earlier segment left there is never read).
  rewound = jnp.minimum(keep, state.fed)
  fed = jnp.where(reset, 0, jnp.where(keep >= 0, rewound, state.fed))
  length = jnp.where(reset, 0, jnp.where(keep >= 0, rewound, state.length))
  st = dataclasses.replace(state, keys=jnp.where(reset, keys, state.keys), drawn=jnp.where(reset, 0, state.drawn),
                           forced=jnp.where(draw_mask[:, None], forced, state.forced),
                           forced_len=jnp.where(draw_mask, forced_len, state.forced_len))
  j = jnp.arange(c)[None, :]
  # 1. The chunk's tokens go to positions length .. length + n - 1 of the token buffer.
  tokens = _write(st.tokens, length[:, None] + j, chunk, j < chunk_lengths[:, None])
  new_length = length + chunk_lengths
  # 2. Feed every unfed position of the slots taking part: the pending token (if any) and the chunk, m <= c of them.
  m = jnp.where(take_part, new_length - fed, 0)
  feed_pos = fed[:, None] + j
  valid = j < m[:, None]
  feed_tokens = jnp.take_along_axis(tokens, jnp.minimum(feed_pos, context - 1), axis=1)
  out = decode_lib.extend(params, st.cache, feed_tokens, jnp.where(valid, feed_pos, context), cfg=cfg,
                          window=window)
  expert_ids = _write_ids(st.expert_ids, feed_pos, out.expert_ids, valid)
  # 3. Start a turn: the token at new_length, from the logits of the last fed position.
  can_draw = draw_mask & (m > 0) & (new_length < turn_end)
  logits = out.logits[slots, jnp.maximum(m - 1, 0)]
  token, logprob, was_forced = _draw(logits, st, jnp.zeros((s,), jnp.int32), mode)
  at = new_length[:, None]
  write = can_draw[:, None]
  tokens = _write(tokens, at, token[:, None], write)
  hit = _turn_over(tokens, new_length, new_length, st, was_forced, 1, sampling, stop_tokens)
  return dataclasses.replace(
      st, cache=out.cache, tokens=tokens,
      logprobs=_write(st.logprobs, at, logprob[:, None], write),
      versions=_write(st.versions, at, jnp.broadcast_to(version, (s, 1)), write),
      expert_ids=expert_ids, fed=fed + m, length=new_length + can_draw,
      turn_start=jnp.where(draw_mask, new_length, st.turn_start),
      turn_end=jnp.where(draw_mask, turn_end, st.turn_end),
      decoding=jnp.where(draw_mask, can_draw & ~hit & (new_length + 1 < turn_end), st.decoding & ~reset),
      stopped=jnp.where(draw_mask, can_draw & hit, st.stopped & ~reset),
      drawn=st.drawn + can_draw)


def decode(params: Params, state: SlotState, *, steps: int, version: int | jax.Array, cfg: ModelConfig,
           sampling: SamplingConfig, window: int | None = None, rows: jax.Array | None = None,
           layout: Layout | None = None) -> SlotState:
  """Up to `steps` decode steps of every running turn (fewer once none runs); see the module docstring.

  `window` (static) must exceed every position fed: the running slots' lengths + steps - 1 (None: the context).
  `rows`: [k] distinct slot indices holding every running turn (k < S, one program per k): only they are computed,
  so slots waiting for their tools cost nothing; None: all S slots.
  """
  static = dict(cfg=cfg, sampling=_static(sampling), mode=sampling.mode, window=window, layout=layout)
  args = (jnp.asarray(steps, jnp.int32), jnp.asarray(version, jnp.int32), _stops(sampling))
  if rows is None:
    return _decode(params, state, *args, **static)
  if layout is not None:
    raise ValueError("decode: rows (a subset of the slots) is for one device; under a mesh decode all slots.")
  return _decode_rows(params, state, jnp.asarray(rows, jnp.int32), *args, **static)


def _decode_step(params, st: SlotState, version, stop_tokens, cfg: ModelConfig, sampling: SamplingConfig,
                 mode: DrawMode, window: int | None) -> SlotState:
  s, context = st.tokens.shape
  slots = jnp.arange(s)
  run = st.decoding
  pos = jnp.maximum(st.length - 1, 0)  # the newest token, drawn and not yet fed (== fed while decoding)
  out = decode_lib.extend(params, st.cache, st.tokens[slots, pos][:, None], jnp.where(run, pos, context)[:, None],
                          cfg=cfg, window=window)
  k = st.length - st.turn_start  # the index of this token in its turn
  token, logprob, was_forced = _draw(out.logits[:, 0], st, k, mode)
  at = st.length[:, None]
  write = run[:, None]
  tokens = _write(st.tokens, at, token[:, None], write)
  hit = run & _turn_over(tokens, st.length, st.turn_start, st, was_forced, k + 1, sampling, stop_tokens)
  length = st.length + run
  return dataclasses.replace(
      st, cache=out.cache, tokens=tokens,
      logprobs=_write(st.logprobs, at, logprob[:, None], write),
      versions=_write(st.versions, at, jnp.broadcast_to(version, (s, 1)), write),
      expert_ids=_write_ids(st.expert_ids, pos[:, None], out.expert_ids, write),
      fed=st.fed + run, length=length, decoding=run & ~hit & (length < st.turn_end),
      stopped=st.stopped | hit, drawn=st.drawn + run)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "window", "layout"), donate_argnums=(1,))
@_in_layout
def _decode_rows(params, state, rows, steps, version, stop_tokens, *, cfg, sampling, mode, window):
  """`_decode_loop` on the slots `rows` only: gathered, decoded, written back in place."""
  sub = _decode_loop(params, _take_rows(state, rows), steps, version, stop_tokens, cfg=cfg, sampling=sampling,
                     mode=mode, window=window)
  return _put_rows(state, rows, sub)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "window", "layout"), donate_argnums=(1,))
@_in_layout
def _decode(params, state, steps, version, stop_tokens, *, cfg, sampling, mode, window):
  return _decode_loop(params, state, steps, version, stop_tokens, cfg=cfg, sampling=sampling, mode=mode,
                      window=window)


def force(params: Params, state: SlotState, *, chunk: int, version: int | jax.Array, cfg: ModelConfig,
          sampling: SamplingConfig, window: int | None = None, rows: jax.Array | None = None,
          layout: Layout | None = None) -> SlotState:
  """Every running forced turn advanced by up to `chunk` tokens in one forward: what `decode` does to it in as many
  steps, as a prefill (a scripted or recorded turn costs one chunk's forward, not one decode step per token).

  A forced slot of length L (its turn's newest token pending at L - 1, the next forced index k = L - turn_start)
  feeds positions L - 1 .. L + n - 2 (the pending token, then forced[k .. k + n - 2]) and writes forced[k ..
  k + n - 1] at positions L .. L + n - 1, each with its log-prob under the sampling distribution from the logits of
  the position before it, the call's `version`, and the expert ids of every fed position: n = min(chunk, the
  forced tokens left, turn_end - L). The turn then ends as `decode` ends it (after its last forced token: stopped;
  at its budget: not), and the episode's draw count advances by n, so a later sampled turn draws what it would
  have. Sampled turns and idle slots are left exactly as they are.

  `chunk` (static, a bucket of `EngineConfig.chunk_sizes`) and `window` (static, above every position fed: the
  forced slots' lengths + chunk - 1) each compile once; `rows` and `layout` as for `decode`.
  """
  static = dict(cfg=cfg, sampling=_static(sampling), mode=sampling.mode, window=window, chunk=chunk,
                layout=layout)
  version = jnp.asarray(version, jnp.int32)
  if rows is None:
    return _force(params, state, version, **static)
  if layout is not None:
    raise ValueError("force: rows (a subset of the slots) is for one device; under a mesh force all slots.")
  return _force_rows(params, state, jnp.asarray(rows, jnp.int32), version, **static)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "window", "chunk", "layout"),
                   donate_argnums=(1,))
@_in_layout
def _force_rows(params, state, rows, version, *, cfg, sampling, mode, window, chunk):
  """`_force_body` on the slots `rows` only: gathered, advanced, written back in place."""
  sub = _force_body(params, _take_rows(state, rows), version, cfg=cfg, sampling=sampling, mode=mode, window=window,
                    chunk=chunk)
  return _put_rows(state, rows, sub)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "window", "chunk", "layout"),
                   donate_argnums=(1,))
@_in_layout
def _force(params, state, version, *, cfg, sampling, mode, window, chunk):
  return _force_body(params, state, version, cfg=cfg, sampling=sampling, mode=mode, window=window, chunk=chunk)


def _force_body(params, st: SlotState, version, *, cfg, sampling, mode, window, chunk):
  del sampling  # a forced turn ends after its last token, never on a stop token
  s, context = st.tokens.shape
  f = st.forced.shape[1]
  k = st.length - st.turn_start  # the turn's index of the next token
  run = st.decoding & (k < st.forced_len)
  n = jnp.where(run, jnp.minimum(jnp.minimum(st.forced_len - k, st.turn_end - st.length), chunk), 0)
  j = jnp.arange(chunk)[None, :]
  valid = j < n[:, None]
  script = jnp.take_along_axis(st.forced, jnp.clip(k[:, None] + j, 0, max(f - 1, 0)), axis=1)  # [S, chunk]
  at = st.length[:, None] + j  # where the forced tokens go
  tokens = _write(st.tokens, at, script, valid)
  feed_pos = at - 1  # the pending token, then every forced token but the newest
  feed_tokens = jnp.take_along_axis(tokens, jnp.clip(feed_pos, 0, context - 1), axis=1)
  out = decode_lib.extend(params, st.cache, feed_tokens, jnp.where(valid, feed_pos, context), cfg=cfg,
                          window=window)
  knobs = (st.knobs[0], st.knobs[1].astype(jnp.int32), st.knobs[2])
  v = out.logits.shape[-1]
  log_dist = log_distribution(out.logits.reshape(s * chunk, v), *knobs, mode).reshape(s, chunk, v)
  logprob = jnp.take_along_axis(log_dist, script[..., None], axis=-1)[..., 0]
  length = st.length + n
  hit = run & (k + n >= st.forced_len)
  return dataclasses.replace(
      st, cache=out.cache, tokens=tokens, logprobs=_write(st.logprobs, at, logprob, valid),
      versions=_write(st.versions, at, jnp.broadcast_to(version, (s, chunk)), valid),
      expert_ids=_write_ids(st.expert_ids, feed_pos, out.expert_ids, valid), fed=st.fed + n, length=length,
      decoding=jnp.where(run, ~hit & (length < st.turn_end), st.decoding), stopped=st.stopped | hit,
      drawn=st.drawn + n)


def _decode_loop(params, state, steps, version, stop_tokens, *, cfg, sampling, mode, window):

  def cond(carry):
    i, st = carry
    return (i < steps) & jnp.any(st.decoding)

  def body(carry):
    i, st = carry
    return i + 1, _decode_step(params, st, version, stop_tokens, cfg, sampling, mode, window)

  _, state = jax.lax.while_loop(cond, body, (jnp.int32(0), state))
  return state
