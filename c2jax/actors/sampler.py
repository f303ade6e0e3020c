"""The actors' sampler: jitted prefill and decode over an MLA latent KV cache, with MTP speculative decoding
(report sections 4 and 6: actors generate most of the tokens in RL; Composer 2 serves with MTP drafts).

  out = generate(params, prompts, prompt_lengths, key, cfg=cfg, sampling=SamplingConfig(max_new_tokens=128))
  out.samples          # tokens, loss_mask, logprobs (sampling distribution), expert_ids, lengths, stopped
  out.policy_version   # [B, T] the weights version that produced each token

Or chunk by chunk, swapping weights in between as an actor does with in-flight updates (PipelineRL: the cache
computed by older weights is kept):

  state = prefill(params_v0, prompts, prompt_lengths, key, version=0, cfg=cfg, sampling=sampling)
  state = decode(params_v0, state, version=0, steps=32, cfg=cfg, sampling=sampling)
  state = decode(params_v1, state, version=1, steps=32, cfg=cfg, sampling=sampling)   # new weights, same cache
  out = finish(params_v1, state, cfg=cfg)

Sampling matches `c2jax.actors.reference_sampler` token for token (same per-row keys: row b's i-th token draws
with fold_in(fold_in(key, b), i)), and reports the same per-token quantities: the log-prob under the sampling
distribution, and every MoE layer's expert ids for routing replay.

Speculative decoding (`speculative=k`, any sampling settings): the MTP module drafts k tokens (module 1,
reused recursively on its own hidden state for drafts 2..k), the main model scores the k + 1 positions in one
cached step, and the standard rejection rule (Leviathan et al. 2023; Chen et al. 2023) accepts draft j with
probability min(1, p_j(d_j) / q_j(d_j)), resampling a rejected position from norm(max(0, p_j - q_j)) and drawing a
bonus token from p_{k+1} when all are accepted. The output distribution is exactly the main model's sampling
distribution; under greedy decoding the output is identical to plain decoding. (On CPU at the tiny sizes it is
still slower than plain decoding: docs/benchmarks.md, tools/bench_sampler.py, and docs/limitations.md.)

Shapes: B rows, P prompt buffer, N = max_new_tokens, T = P + N, V vocab, Lm MoE layers, K experts per token,
D model width.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from c2jax.actors.sampling import DrawMode, SamplingConfig, check_inputs, draw, log_distribution, row_keys, stop_hit
from c2jax.actors.reference_sampler import Samples
from c2jax.model import decode as decode_lib
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params
from c2jax.model.sharding import Layout, use_layout


@dataclasses.dataclass(frozen=True)
class DecodeState:
  """Everything a generation in progress carries between jitted chunks (a pytree).

  Attributes:
    cache: the latent KV cache (main model and MTP modules), T slots (+ k for speculative drafts).
    tokens: [B, T] int32 prompt + generated tokens (pad_id elsewhere).
    logprobs: [B, T] float32 sampling log-probs of generated tokens.
    versions: [B, T] int32 policy version of each generated token.
    expert_ids: [Lm, B, T, K] int32 routing of every fed position.
    prompt_lengths: [B] int32.
    pos: [B] int32 position of each row's newest token (sampled, not yet fed to the model).
    draft_logits: [B, V] float32 speculative decoding: MTP module 1's logits for the token after pos (its first
      draft), computed with the previous step's MTP pass; zeros [B, 0] otherwise.
    draft_hidden: [B, D] speculative decoding: that module's output hidden state (the input of drafts 2..k).
    lengths: [B] int32 generated tokens so far.
    done / stopped: [B] bool: the row ended (stop token or budget) / ended on a stop token.
    step: int32 draw counter (plain decoding: the index of the next token to draw).
    keys: [B] typed per-row PRNG keys.
    knobs: [3] float32 temperature, top_k, top_p (traced: one program serves every setting of a `DrawMode`).
    drafted / accepted: int32 totals of draft tokens proposed and accepted (speculative decoding).
  """

  cache: decode_lib.KVCache
  tokens: jax.Array
  logprobs: jax.Array
  versions: jax.Array
  expert_ids: jax.Array
  prompt_lengths: jax.Array
  pos: jax.Array
  draft_logits: jax.Array
  draft_hidden: jax.Array
  lengths: jax.Array
  done: jax.Array
  stopped: jax.Array
  step: jax.Array
  keys: jax.Array
  knobs: jax.Array
  drafted: jax.Array
  accepted: jax.Array


jax.tree_util.register_dataclass(DecodeState, data_fields=[f.name for f in dataclasses.fields(DecodeState)],
                                 meta_fields=[])


@dataclasses.dataclass(frozen=True)
class SamplerOutput:
  """samples: `Samples` (the reference sampler's type); policy_version: [B, T] int32; drafted / accepted: int32
  speculative totals (acceptance rate = accepted / drafted)."""

  samples: Samples
  policy_version: jax.Array
  drafted: jax.Array
  accepted: jax.Array

  @property
  def acceptance_rate(self) -> float:
    return float(self.accepted) / max(float(self.drafted), 1.0)


jax.tree_util.register_dataclass(SamplerOutput, data_fields=["samples", "policy_version", "drafted", "accepted"],
                                 meta_fields=[])


def knobs(sampling: SamplingConfig) -> jax.Array:
  """[3] float32 temperature, top_k, top_p: traced, so one program serves every setting of a `DrawMode`."""
  return jnp.asarray([sampling.temperature, sampling.top_k, sampling.top_p], jnp.float32)


def _unpack(knobs: jax.Array):
  return knobs[0], knobs[1].astype(jnp.int32), knobs[2]


def check_decode_layout(layout: Layout | None, rows: int, what: str = "Batch") -> None:
  """Token-by-token decoding (this sampler, the agent engine) needs context = 1 and `rows` divisible by the mesh's
  data x fsdp x expert shards; one sentence otherwise."""
  if layout is None:
    return
  if layout.attention is not None or layout.sequence_order is not None:
    raise ValueError("Decoding goes token by token and cannot split the sequence: use a mesh with context=1 "
                     "(data, fsdp and expert axes shard rows and experts).")
  shards = 1
  for axis in ("data", "fsdp", "expert"):
    shards *= layout.mesh.shape[axis]
  if rows % shards:
    raise ValueError(f"{what}={rows} (rows) is not divisible by data x fsdp x expert = {shards} of the mesh.")


def _check_layout(layout: Layout | None, batch: int) -> None:
  check_decode_layout(layout, batch)


def prefill(params: Params, prompts: jax.Array, prompt_lengths: jax.Array, key: jax.Array, *, cfg: ModelConfig,
            sampling: SamplingConfig, version: int | jax.Array = 0, speculative: int = 0,
            layout: Layout | None = None) -> DecodeState:
  """Runs the prompts [B, P] (left-aligned, per-row lengths in [1, P]) through the model, fills the cache and draws
  each row's first token. `speculative` reserves cache slots for that many draft tokens.

  Under a mesh, pass its `Layout` (`c2jax.parallel.layout.make_layout`, context=1) and params placed with
  `param_shardings`: rows are split over data x fsdp x expert, experts over `expert` (expert-parallel MoE).
  """
  prompts, prompt_lengths = jnp.asarray(prompts), jnp.asarray(prompt_lengths)
  check_inputs(prompts, prompt_lengths)
  _check_layout(layout, prompts.shape[0])
  if speculative and not cfg.num_mtp_layers:
    raise ValueError("Speculative decoding drafts with the MTP modules, and this model has none (num_mtp_layers=0).")
  return _prefill(params, prompts, prompt_lengths.astype(jnp.int32), row_keys(key, prompts.shape[0]),
                  knobs(sampling), jnp.asarray(version, jnp.int32), cfg=cfg, sampling=sampling.structure(),
                  mode=sampling.mode,
                  speculative=speculative, layout=layout)


def in_layout(fn):
  """Runs a jitted body under its static `layout` argument (the model reads it while tracing)."""

  # Not functools.wraps: jit reads the signature, which must include `layout`.
  def wrapped(*args, layout, **kwargs):
    with use_layout(layout):
      return fn(*args, **kwargs)

  wrapped.__name__ = fn.__name__
  wrapped.__doc__ = fn.__doc__
  return wrapped


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "speculative", "layout"))
@in_layout
def _prefill(params, prompts, prompt_lengths, keys, knobs, version, *, cfg, sampling, mode, speculative):
  b, p = prompts.shape
  n = sampling.max_new_tokens
  t = p + n
  rows = jnp.arange(b)
  in_prompt = jnp.arange(p)[None, :] < prompt_lengths[:, None]
  prompts = jnp.where(in_prompt, prompts.astype(jnp.int32), sampling.pad_id)
  cache = decode_lib.init_cache(cfg, b, t + speculative)
  out = decode_lib.extend(params, cache, prompts, jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), cfg=cfg)
  last = prompt_lengths - 1
  logits = out.logits[rows, last]  # [B, V]
  token, logprob = draw(logits, keys, jnp.int32(0), *_unpack(knobs), mode)
  tokens = jnp.full((b, t), sampling.pad_id, jnp.int32).at[:, :p].set(prompts).at[rows, prompt_lengths].set(token)
  expert_ids = jnp.zeros((cfg.n_moe_layers, b, t, cfg.num_experts_per_tok), jnp.int32).at[:, :, :p].set(
      out.expert_ids)
  stopped = stop_hit(tokens, prompt_lengths, prompt_lengths, sampling)
  cache = out.cache
  draft_logits = jnp.zeros((b, 0), jnp.float32)
  draft_hidden = jnp.zeros((b, 0), out.hidden.dtype)
  if speculative:
    # The MTP modules' cache over the prompt (module 1 at position i sees h_i and token i + 1), which also gives the
    # first draft: at position len - 1 the next token is the one just drawn.
    mtp = decode_lib.extend_mtp(params, cache, out.hidden, tokens[None, :, 1:p + 1],
                                jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), cfg=cfg)
    cache, draft_logits, draft_hidden = mtp.cache, mtp.logits[0, rows, last], mtp.hidden[rows, last]
  return DecodeState(
      cache=cache, tokens=tokens, logprobs=jnp.zeros((b, t), jnp.float32).at[rows, prompt_lengths].set(logprob),
      versions=jnp.zeros((b, t), jnp.int32).at[rows, prompt_lengths].set(version), expert_ids=expert_ids,
      prompt_lengths=prompt_lengths, pos=prompt_lengths, draft_logits=draft_logits, draft_hidden=draft_hidden,
      lengths=jnp.ones((b,), jnp.int32), done=stopped | (n <= 1), stopped=stopped, step=jnp.int32(1), keys=keys,
      knobs=knobs, drafted=jnp.int32(0), accepted=jnp.int32(0))


def decode(params: Params, state: DecodeState, *, cfg: ModelConfig, sampling: SamplingConfig, steps: int,
           version: int | jax.Array = 0, speculative: int = 0, layout: Layout | None = None) -> DecodeState:
  """Up to `steps` more decoding steps (fewer if every row ends), stamping new tokens with `version`.

  `params` may differ from the previous chunk's (an in-flight weight update): the cache is kept. With
  `speculative=k` each step drafts k tokens with the MTP module and emits 1 to k + 1 tokens per row.
  """
  return _decode(params, state, jnp.asarray(version, jnp.int32), jnp.asarray(steps, jnp.int32), cfg=cfg,
                 sampling=sampling.structure(), mode=sampling.mode, speculative=speculative, layout=layout)


def _slot_mask(positions: jax.Array, valid: jax.Array, t: int) -> jax.Array:
  """[B, j, T] bool: update j of row b goes to slot positions[b, j] (if valid and < T)."""
  return (jnp.arange(t)[None, None, :] == positions[..., None]) & valid[..., None]


# Buffers are updated by a dense select over [B, j, T] rather than a scatter: XLA:CPU runs small scatters as serial
# loops with bounds checks, which cost more than the model's own work per decode step at small sizes.
def _write_rows(buf: jax.Array, positions: jax.Array, values: jax.Array, valid: jax.Array) -> jax.Array:
  """buf [B, T] with values [B, j] written at positions [B, j] where valid [B, j] (others untouched)."""
  mask = _slot_mask(positions, valid, buf.shape[1])
  written = jnp.sum(jnp.where(mask, values[..., None].astype(buf.dtype), 0), axis=1).astype(buf.dtype)
  return jnp.where(jnp.any(mask, axis=1), written, buf)


def _write_ids(ids: jax.Array, positions: jax.Array, values: jax.Array, valid: jax.Array) -> jax.Array:
  """ids [Lm, B, T, K] with values [Lm, B, j, K] written at positions [B, j] where valid [B, j]."""
  mask = _slot_mask(positions, valid, ids.shape[2])  # [B, j, T]
  written = jnp.sum(jnp.where(mask[None, :, :, :, None], values[:, :, :, None, :], 0), axis=2).astype(ids.dtype)
  return jnp.where(jnp.any(mask, axis=1)[None, :, :, None], written, ids)


def _plain_step(params, s: DecodeState, version, cfg: ModelConfig, sampling: SamplingConfig,
                mode: DrawMode, window: int | None = None) -> DecodeState:
  """Feeds each row's newest token, draws the next one (attending to the first `window` cache slots: every active
  row's fed position must be below it)."""
  b, t = s.tokens.shape
  rows = jnp.arange(b)
  feed_pos = jnp.minimum(s.pos, t - 1)
  out = decode_lib.extend(params, s.cache, s.tokens[rows, feed_pos][:, None], feed_pos[:, None], cfg=cfg,
                          window=window)
  token, logprob = draw(out.logits[:, 0], s.keys, s.step, *_unpack(s.knobs), mode)
  active = ~s.done
  new_pos = s.pos + 1
  write = (active & (new_pos < t))[:, None]
  tokens = _write_rows(s.tokens, new_pos[:, None], token[:, None], write)
  hit = active & stop_hit(tokens, new_pos, s.prompt_lengths, sampling)
  lengths = s.lengths + active.astype(jnp.int32)
  # The fed token's routing is final: positions up to a row's end are fed exactly once while it is active (the
  # last one by `finish`).
  return dataclasses.replace(
      s, cache=out.cache,
      tokens=tokens,
      logprobs=_write_rows(s.logprobs, new_pos[:, None], logprob[:, None], write),
      versions=_write_rows(s.versions, new_pos[:, None], jnp.broadcast_to(version, (b, 1)), write),
      expert_ids=_write_ids(s.expert_ids, feed_pos[:, None], out.expert_ids, active[:, None]),
      pos=jnp.where(active, new_pos, s.pos),
      lengths=lengths, done=s.done | hit | (lengths >= sampling.max_new_tokens), stopped=s.stopped | hit,
      step=s.step + 1)


@dataclasses.dataclass(frozen=True)
class _StepKeys:
  """A speculative step's randomness, [B] typed keys: the row's key folded with the step, split (fold_in 0, 1, 2)
  for the drafts, the acceptance tests and the final draw."""

  draft: jax.Array
  accept: jax.Array
  final: jax.Array


def _step_keys(s: DecodeState) -> _StepKeys:
  step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(s.keys, s.step)
  return _StepKeys(*(jax.vmap(lambda kk, i=i: jax.random.fold_in(kk, i))(step_keys) for i in range(3)))


@dataclasses.dataclass(frozen=True)
class _Drafts:
  """The MTP module's k drafts: tokens [B, k] int32 (d_1..d_k), logq [B, k, V] the log-distributions they were
  drawn from, and the cache with the slots of drafts 2..k written."""

  tokens: jax.Array
  logq: jax.Array
  cache: decode_lib.KVCache


def _draft(params, s: DecodeState, keys: jax.Array, dist, greedy: bool, k: int, cfg: ModelConfig) -> _Drafts:
  """Step 1, the drafts: module 1 at position pos - 1 sees (h_{pos-1}, x_pos) and predicts x_{pos+1}: those logits
  came with the previous step's MTP pass. Drafts 2..k reuse the module on its own output hidden state (their cache
  slots are rewritten by step 4). `keys`: [B] the drafts' keys; draft j draws with fold_in(key, j)."""
  cache, h_prev, logits_q = s.cache, s.draft_hidden, s.draft_logits
  drafts, draft_logq = [], []
  for j in range(k):
    if j:
      mtp = decode_lib.extend_mtp(params, cache, h_prev[:, None], drafts[-1][None, :, None],
                                  (s.pos - 1 + j)[:, None], cfg=cfg)
      cache, h_prev, logits_q = mtp.cache, mtp.hidden[:, 0], mtp.logits[0, :, 0]
    logq = dist(logits_q)
    if greedy:
      d = jnp.argmax(logits_q, axis=-1).astype(jnp.int32)
    else:
      d = jax.vmap(jax.random.categorical)(jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, j),
                                           logq).astype(jnp.int32)
    drafts.append(d)
    draft_logq.append(logq)
  return _Drafts(tokens=jnp.stack(drafts, axis=1), logq=jnp.stack(draft_logq, axis=1), cache=cache)


@dataclasses.dataclass(frozen=True)
class _Verified:
  """The main model's pass over [x_pos, d_1..d_k]: out (`decode_lib.ExtendOutput`: logits [B, k + 1, V], hidden,
  expert ids, cache), logp [B, k + 1, V] its log-distributions (greedy: the untempered model's, as plain decoding
  reports), positions [B, k + 1] the fed positions pos..pos+k."""

  out: decode_lib.ExtendOutput
  logp: jax.Array
  positions: jax.Array


def _verify(params, drafts: _Drafts, last: jax.Array, feed_pos: jax.Array, dist, k: int,
            cfg: ModelConfig) -> _Verified:
  """Step 2, verification: the main model on [x_pos, d_1..d_k] at pos..pos+k in one cached step. `last`: [B] x_pos,
  each row's newest token; `feed_pos`: [B] its position (clipped to the buffer)."""
  fed = jnp.concatenate([last[:, None], drafts.tokens], axis=1)  # [B, k + 1]
  positions = feed_pos[:, None] + jnp.arange(k + 1)[None, :]
  out = decode_lib.extend(params, drafts.cache, fed, positions, cfg=cfg)
  return _Verified(out=out, logp=dist(out.logits), positions=positions)


@dataclasses.dataclass(frozen=True)
class _Accepted:
  """n: [B] int32 the accepted prefix length a (0..k); tokens: [B, k + 1] int32 the token after each fed position
  pos + j: d_{j+1} while accepted, then the extra token at j = min(a, k) (zeros after it)."""

  n: jax.Array
  tokens: jax.Array


def _accept(drafts: _Drafts, verified: _Verified, keys: _StepKeys, rows: jax.Array, greedy: bool,
            k: int) -> _Accepted:
  """Step 3: accepts a prefix of the drafts (draft j with probability min(1, p_j(d_j) / q_j(d_j)); greedy: while
  it is the model's argmax), then draws one more token: the residual draw at the first rejection, or a bonus."""
  logits, logp, logq = verified.out.logits, verified.logp, drafts.logq
  b = drafts.tokens.shape[0]
  if greedy:
    ok = drafts.tokens == jnp.argmax(logits[:, :k], axis=-1)
  else:
    p_d = jnp.take_along_axis(logp[:, :k], drafts.tokens[..., None], axis=-1)[..., 0]
    q_d = jnp.take_along_axis(logq, drafts.tokens[..., None], axis=-1)[..., 0]
    u = jax.vmap(lambda kk: jax.random.uniform(kk, (k,)))(keys.accept)
    ok = jnp.log(u) < p_d - q_d  # u < p / q
  n_acc = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)  # [B] accepted prefix length a
  at = jnp.minimum(n_acc, k)
  if greedy:
    extra = jnp.argmax(logits[rows, at], axis=-1).astype(jnp.int32)
  else:
    p_at = logp[rows, at]  # [B, V] target at the first rejected position (or the bonus position)
    q_at = jnp.where((n_acc < k)[:, None], logq[rows, jnp.minimum(at, k - 1)], -jnp.inf)
    residual = jnp.log(jnp.maximum(jnp.exp(p_at) - jnp.exp(q_at), 0.0))
    # If p <= q everywhere (only possible by rounding when p == q) fall back to p itself.
    residual = jnp.where(jnp.any(residual > -jnp.inf, axis=-1, keepdims=True), residual, p_at)
    extra = jax.vmap(jax.random.categorical)(keys.final, residual).astype(jnp.int32)
  new = jnp.concatenate([drafts.tokens, jnp.zeros((b, 1), jnp.int32)], axis=1).at[rows, at].set(extra)
  return _Accepted(n=n_acc, tokens=new)


@dataclasses.dataclass(frozen=True)
class _Emitted:
  """Which of the k + 1 candidates (`_Accepted.tokens`) a step emits: positions [B, k + 1] their places in the
  buffer (pos + 1 + j), emit [B, k + 1] bool, stop [B, k + 1] bool a stop token at that candidate (among those the
  acceptance emits), count [B] int32 how many are emitted."""

  positions: jax.Array
  emit: jax.Array
  stop: jax.Array
  count: jax.Array


def _emit(s: DecodeState, accepted: _Accepted, sampling: SamplingConfig, k: int) -> _Emitted:
  """The tokens emitted this step: the accepted drafts and the extra token, cut at a stop token and at the budget
  (none for a row already done)."""
  t = s.tokens.shape[1]
  new = accepted.tokens
  emit = (jnp.arange(k + 1)[None, :] <= accepted.n[:, None]) & ~s.done[:, None]
  new_pos = s.pos[:, None] + 1 + jnp.arange(k + 1)[None, :]
  # Stop checks on the buffer with every candidate written: the check at a position reads only tokens up to it.
  tentative = _write_rows(s.tokens, new_pos, new, emit & (new_pos < t))
  stop = jnp.stack([stop_hit(tentative, new_pos[:, e], s.prompt_lengths, sampling) for e in range(k + 1)],
                   axis=1) & emit
  first_stop = jnp.argmax(stop, axis=1)
  emit = emit & ((jnp.arange(k + 1)[None, :] <= first_stop[:, None]) | ~jnp.any(stop, axis=1)[:, None])
  budget = sampling.max_new_tokens - s.lengths
  emit = emit & (jnp.arange(k + 1)[None, :] < budget[:, None]) & ~s.done[:, None]
  return _Emitted(positions=new_pos, emit=emit, stop=stop, count=jnp.sum(emit, axis=1))


def _speculative_step(params, s: DecodeState, version, cfg: ModelConfig, sampling: SamplingConfig, mode: DrawMode,
                      k: int) -> DecodeState:
  """Drafts k tokens with the MTP module (`_draft`), verifies them with one main-model step (`_verify`), accepts a
  prefix and draws one more token (`_accept`), emits 1..k+1 tokens per row (`_emit`), and runs the MTP pass that
  fixes the drafts' cache slots and gives the next step's first draft (step 4, here)."""
  b, t = s.tokens.shape
  rows = jnp.arange(b)
  temperature, top_k, top_p = _unpack(s.knobs)
  greedy = mode is DrawMode.GREEDY
  dist = lambda logits: log_distribution(logits, temperature, top_k, top_p, mode)
  keys = _step_keys(s)
  feed_pos = jnp.minimum(s.pos, t - 1)
  last = s.tokens[rows, feed_pos]
  drafts = _draft(params, s, keys.draft, dist, greedy, k, cfg)
  verified = _verify(params, drafts, last, feed_pos, dist, k, cfg)
  accepted = _accept(drafts, verified, keys, rows, greedy, k)
  emitted = _emit(s, accepted, sampling, k)
  new, new_pos, emit, n_emit, out = accepted.tokens, emitted.positions, emitted.emit, emitted.count, verified.out
  new_logp = jnp.take_along_axis(verified.logp, new[..., None], axis=-1)[..., 0]
  write = emit & (new_pos < t)
  # Routing of the fed positions pos..pos+n_emit-1 is final (their inputs were accepted).
  fed_final = (jnp.arange(k + 1)[None, :] < n_emit[:, None])
  hit = jnp.any(emitted.stop & emit, axis=1)
  lengths = s.lengths + n_emit
  active = ~s.done
  pos = s.pos + n_emit
  last_fed = jnp.maximum(n_emit - 1, 0)

  # 4. The MTP pass over pos..pos+k from the true hidden states and tokens: it rewrites the slots the drafts'
  # recursion wrote approximately (slots past the emitted tokens are rewritten again before they are read), and
  # at the new frontier's position pos' - 1 = pos + n_emit - 1 it gives the next step's first draft.
  # The token after fed position pos + j is new[:, j]: d_{j+1} while accepted, then the extra token.
  fix = decode_lib.extend_mtp(params, out.cache, out.hidden, new[None], verified.positions, cfg=cfg)

  return dataclasses.replace(
      s, cache=fix.cache,
      tokens=_write_rows(s.tokens, new_pos, new, write),
      logprobs=_write_rows(s.logprobs, new_pos, new_logp, write),
      versions=_write_rows(s.versions, new_pos, jnp.broadcast_to(version, (b, k + 1)), write),
      expert_ids=_write_ids(s.expert_ids, verified.positions, out.expert_ids, fed_final & active[:, None]),
      pos=pos, draft_logits=jnp.where(active[:, None], fix.logits[0, rows, last_fed], s.draft_logits),
      draft_hidden=jnp.where(active[:, None], fix.hidden[rows, last_fed], s.draft_hidden), lengths=lengths,
      done=s.done | hit | (lengths >= sampling.max_new_tokens), stopped=s.stopped | hit, step=s.step + 1,
      drafted=s.drafted + jnp.sum(jnp.where(active, k, 0)),
      accepted=s.accepted + jnp.sum(jnp.where(active, jnp.minimum(accepted.n, n_emit), 0)))


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode", "speculative", "layout"))
@in_layout
def _decode(params, state, version, steps, *, cfg, sampling, mode, speculative):
  if speculative:
    body = lambda s: _speculative_step(params, s, version, cfg, sampling, mode, speculative)
    _, state = jax.lax.while_loop(lambda c: (c[0] < steps) & ~jnp.all(c[1].done),
                                  lambda c: (c[0] + 1, body(c[1])), (jnp.int32(0), state))
    return state
  # Plain decoding attends to a window of the cache that grows with the rows' positions: one loop per window
  # (static), each running while every active row's fed position is below it. Slots past a position are masked
  # out of the softmax anyway; reading only the window cuts the cache reads, which dominate a decode step at a
  # wide latent (DeepSeek-V3's 576 numbers per token and layer: docs/benchmarks.md, tools/bench_sampler.py).
  t = state.tokens.shape[1]
  carry = (jnp.int32(0), state)
  for window in decode_windows(t):

    def cond(c, window=window):
      i, s = c
      fed = jnp.where(s.done, 0, jnp.minimum(s.pos, t - 1))
      return (i < steps) & ~jnp.all(s.done) & (jnp.max(fed) < window)

    carry = jax.lax.while_loop(
        cond, lambda c, window=window: (c[0] + 1, _plain_step(params, c[1], version, cfg, sampling, mode,
                                                               window if window < t else None)), carry)
  return carry[1]


# Cache windows of plain decoding: multiples of this many slots, then the whole cache; at most
# `MAX_DECODE_WINDOWS` of them, since each window is one more compiled copy of the decode step (a long cache
# widens the step between windows instead of multiplying the compile time).
DECODE_WINDOW_STEP = 32
MAX_DECODE_WINDOWS = 16


def decode_windows(t: int) -> list[int]:
  """The static attention windows of plain decoding over a T-slot cache, ascending, the last T: every
  DECODE_WINDOW_STEP slots up to 16 x DECODE_WINDOW_STEP, evenly spaced multiples of it beyond."""
  step = DECODE_WINDOW_STEP * max(1, -(-t // (DECODE_WINDOW_STEP * MAX_DECODE_WINDOWS)))
  return list(range(step, t, step)) + [t]


def finish(params: Params, state: DecodeState, *, cfg: ModelConfig, layout: Layout | None = None) -> SamplerOutput:
  """Feeds each row's last token once more for its routing and packs the result (see `_finish`)."""
  return _finish(params, state, cfg=cfg, layout=layout)


@functools.partial(jax.jit, static_argnames=("cfg", "layout"))
@in_layout
def _finish(params: Params, state: DecodeState, *, cfg: ModelConfig) -> SamplerOutput:
  """Feeds each row's last token once more for its routing (the trainer's forward replays every position), and
  packs the result."""
  b, t = state.tokens.shape
  rows = jnp.arange(b)
  feed_pos = jnp.minimum(state.pos, t - 1)
  out = decode_lib.extend(params, state.cache, state.tokens[rows, feed_pos][:, None], feed_pos[:, None], cfg=cfg)
  expert_ids = _write_ids(state.expert_ids, feed_pos[:, None], out.expert_ids, (state.pos < t)[:, None])
  positions = jnp.arange(t)[None, :]
  generated = ((positions >= state.prompt_lengths[:, None]) &
               (positions < (state.prompt_lengths + state.lengths)[:, None]))
  # Tokens outside prompts and generations are still prefill's pad_id: only emitted tokens are ever written.
  samples = Samples(tokens=state.tokens, loss_mask=generated.astype(jnp.float32),
                    logprobs=jnp.where(generated, state.logprobs, 0.0), expert_ids=expert_ids,
                    lengths=state.lengths, stopped=state.stopped)
  return SamplerOutput(samples=samples, policy_version=jnp.where(generated, state.versions, 0),
                       drafted=state.drafted, accepted=state.accepted)


def generate(params: Params, prompts: jax.Array, prompt_lengths: jax.Array, key: jax.Array, *, cfg: ModelConfig,
             sampling: SamplingConfig, version: int = 0, speculative: int = 0,
             layout: Layout | None = None) -> SamplerOutput:
  """Prefill, decode to the end, finish: the whole generation with one set of weights."""
  state = prefill(params, prompts, prompt_lengths, key, cfg=cfg, sampling=sampling, version=version,
                  speculative=speculative, layout=layout)
  state = decode(params, state, cfg=cfg, sampling=sampling, steps=sampling.max_new_tokens, version=version,
                 speculative=speculative, layout=layout)
  return finish(params, state, cfg=cfg, layout=layout)
