"""The reference sampler: autoregressive generation by re-running the full, uncached forward at every step.

It is slow on purpose (O(N) full forwards over the whole [B, P + N] buffer, no KV cache): it is the plain
reference that the fast KV-cached sampler is tested against (DESIGN.md convention 5), and what small synchronous
RL tests use to produce rollouts. Its output carries what the trainer needs from an actor (report section 4):
the behaviour log-probs of the sampled tokens under the *sampling* distribution, and the routed experts of every
MoE layer for routing replay.

Shapes: B rows, P prompt-buffer length, N = max_new_tokens, T = P + N, V vocab, Lm MoE layers, K experts per
token.

Mapping onto the RL batch (`c2jax.rl.batch`): tokens -> tokens, loss_mask -> loss_mask, logprobs ->
behaviour_logprobs, expert_ids -> expert_ids, ~stopped -> truncated.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.model.config import ModelConfig
from c2jax.model.params import Params
from c2jax.model.transformer import forward


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How tokens are drawn; hashable, so it is a static jit argument.

  The sampling distribution is softmax(logits / temperature), truncated to the top-k logits, then to the nucleus
  (top-p) of that renormalized distribution, then renormalized (the order of HF `generate` and vLLM).

  Attributes:
    max_new_tokens: N, the number of generation steps (the response budget of every row).
    temperature: divides the logits; 0 means greedy (argmax of the logits; top_k / top_p then change nothing).
    top_k: keep the k largest logits (ties with the k-th are all kept); 0 (or k >= V) disables.
    top_p: keep the smallest set of most probable tokens whose cumulative probability is >= top_p (always at
      least the most probable token; ties with the last kept probability are all kept); 1 disables.
    stop_tokens: a row ends after it emits one of these; the stop token is kept and counts as generated.
    pad_id: written after the end of every row.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  stop_tokens: tuple[int, ...] = ()
  pad_id: int = 0

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"SamplingConfig: max_new_tokens={self.max_new_tokens} must be >= 1.")
    if self.temperature < 0:
      raise ValueError(f"SamplingConfig: temperature={self.temperature} must be >= 0 (0 means greedy).")
    if self.top_k < 0:
      raise ValueError(f"SamplingConfig: top_k={self.top_k} must be >= 0 (0 disables top-k).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"SamplingConfig: top_p={self.top_p} must lie in (0, 1] (1 disables nucleus sampling).")
    # A list would make the config unhashable, and so unusable as a static jit argument.
    object.__setattr__(self, "stop_tokens", tuple(int(s) for s in self.stop_tokens))


@dataclasses.dataclass(frozen=True)
class Samples:
  """What `sample` returns; T = P + max_new_tokens.

  Attributes:
    tokens: [B, T] int32 prompt + generated tokens; row b holds them contiguously in
      [0, prompt_lengths[b] + lengths[b]) and pad_id after.
    loss_mask: [B, T] float32, 1 on generated tokens (a stop token included), 0 on prompt and padding.
    logprobs: [B, T] float32, entry t = log pi(tokens[t] | tokens[:t]) under the sampling distribution (after
      temperature, top-k and top-p); 0 off the loss mask. Greedy (temperature 0) has no sampling distribution
      (it is a point mass, log-prob 0): it reports log softmax(logits) of the untempered, untruncated model
      instead, which is what a trainer's importance ratio at temperature 1 wants.
    expert_ids: [Lm, B, T, K] int32 routed experts of every MoE layer at every input position, as the forward
      that sampled the next token routed them (past a row's end: whatever the final forward routed).
    lengths: [B] int32 number of generated tokens per row.
    stopped: [B] bool, True if the row ended on a stop token, False if it hit max_new_tokens (truncated).
  """

  tokens: jax.Array
  loss_mask: jax.Array
  logprobs: jax.Array
  expert_ids: jax.Array
  lengths: jax.Array
  stopped: jax.Array


jax.tree_util.register_dataclass(
    Samples, data_fields=["tokens", "loss_mask", "logprobs", "expert_ids", "lengths", "stopped"], meta_fields=[])


def sampling_logits(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
  """The sampling distribution's logits: [B, V] model logits -> [B, V] float32, -inf outside the kept set.

  log_softmax of the result is the truncated, renormalized sampling distribution: softmax(logits / temperature)
  cut to the top_k largest logits, then to the nucleus of that renormalized distribution. The knobs are scalars
  (Python numbers or traced arrays: one compiled program serves every temperature, top_k and top_p), with the
  meanings of `SamplingConfig`; temperature must be > 0. Ties at a cut (equal logits at the k-th place, equal
  probabilities at the nucleus edge) are all kept: the kept set is defined by a threshold value, which needs no
  tie-breaking index and is equally valid.
  """
  x = logits.astype(jnp.float32) / temperature
  v = x.shape[-1]
  neg_inf = jnp.float32(-jnp.inf)
  sorted_x = jnp.sort(x, axis=-1)[..., ::-1]  # [B, V] descending
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
  kth = jax.lax.dynamic_index_in_dim(sorted_x, k - 1, axis=-1)  # [B, 1]; the smallest kept logit
  sorted_x = jnp.where(sorted_x >= kth, sorted_x, neg_inf)
  probs = jax.nn.softmax(sorted_x, axis=-1)
  # Token i is kept while the mass before it is < top_p: the smallest prefix whose mass reaches top_p, and always
  # the first token (the mass before it is exactly 0). top_p = 1 bypasses the test, because a float32 cumsum can
  # reach 1 before the tail and would drop its tokens.
  mass_before = jnp.cumsum(probs, axis=-1) - probs
  kept = ((mass_before < top_p) | (top_p >= 1)) & (sorted_x > neg_inf)
  threshold = jnp.min(jnp.where(kept, sorted_x, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(x >= threshold, x, neg_inf)


def _row_keys(key: jax.Array, b: int) -> jax.Array:
  """[B] typed keys, one per row, from a single key () or per-row keys [B] (typed, or raw uint32 [..., 2])."""
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  if key.shape == ():
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(b, dtype=jnp.uint32))
  if key.shape != (b,):
    raise ValueError(f"sample: key has shape {key.shape}; give one key () or one key per row [B] = ({b},).")
  return key


def _check_inputs(prompts: jax.Array, prompt_lengths: jax.Array) -> None:
  if prompts.ndim != 2:
    raise ValueError(f"sample: prompts has shape {prompts.shape}; expected a left-aligned [B, P] token buffer.")
  b, p = prompts.shape
  if tuple(prompt_lengths.shape) != (b,):
    raise ValueError(f"sample: prompt_lengths has shape {tuple(prompt_lengths.shape)}; expected [B] = ({b},).")
  for name, a in (("prompts", prompts), ("prompt_lengths", prompt_lengths)):
    if not jnp.issubdtype(a.dtype, jnp.integer):
      raise ValueError(f"sample: {name} has dtype {a.dtype}; give integer token ids and lengths.")
  if isinstance(prompt_lengths, jax.core.Tracer):
    return  # Under an outer jit the values are unknown; eager calls (the usual way in) are checked below.
  lengths = np.asarray(prompt_lengths)
  if lengths.size and (lengths.min() < 1 or lengths.max() > p):
    raise ValueError(f"sample: prompt_lengths must lie in [1, P={p}] (generation starts after the prompt's last "
                     f"token), got min {lengths.min()} and max {lengths.max()}.")


def sample(params: Params, prompts: jax.Array, prompt_lengths: jax.Array, key: jax.Array, *, cfg: ModelConfig,
           sampling: SamplingConfig) -> Samples:
  """Generates up to `max_new_tokens` tokens per row by re-running the whole forward at every step.

  Jittable with `cfg` and `sampling` static. An eager call validates its inputs and runs a cached compiled
  program; temperature, top_k and top_p enter it as traced scalars, so the program is shared by every setting of
  them (a temperature sweep, or greedy and sampled decoding, compile once per cfg, shapes, max_new_tokens,
  stop_tokens and pad_id).

  Randomness is per row and per generated token: row b's i-th generated token draws from
  fold_in(row_key[b], i), where row_key[b] = fold_in(key, b) for a single key, or key[b] for per-row keys. So a
  row's samples depend on its own key, prompt and the params only, never on the other rows of the batch (their
  number, their prompt lengths, or when they stop), and results are reproducible from the seed. That is what lets
  the fast sampler, which batches and schedules rows differently, be compared with this one token for token.

  Args:
    params: model params (`c2jax.model.params`).
    prompts: [B, P] int left-aligned prompts; entries at and past prompt_lengths[b] are ignored.
    prompt_lengths: [B] int in [1, P]; row b generates from position prompt_lengths[b].
    key: a PRNG key (typed or raw), or per-row keys [B].
    cfg: the architecture.
    sampling: how tokens are drawn.
  Returns:
    `Samples` with T = P + max_new_tokens.
  """
  prompts, prompt_lengths = jnp.asarray(prompts), jnp.asarray(prompt_lengths)
  _check_inputs(prompts, prompt_lengths)
  # Only the shape-giving fields stay static; the numeric knobs travel as traced scalars (see above).
  structure = dataclasses.replace(sampling, temperature=1.0, top_k=0, top_p=1.0)
  return _sample(params, prompts, prompt_lengths, _row_keys(key, prompts.shape[0]),
                 jnp.float32(sampling.temperature), jnp.int32(sampling.top_k), jnp.float32(sampling.top_p), cfg=cfg,
                 sampling=structure)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling"))
def _sample(params: Params, prompts: jax.Array, prompt_lengths: jax.Array, row_keys: jax.Array,
            temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, cfg: ModelConfig,
            sampling: SamplingConfig) -> Samples:
  """`sample` after validation: row_keys [B] typed keys; the scalar knobs replace those of `sampling`."""
  b, p = prompts.shape
  n = sampling.max_new_tokens
  t = p + n
  prompt_lengths = prompt_lengths.astype(jnp.int32)
  rows = jnp.arange(b)
  in_prompt = jnp.arange(p)[None, :] < prompt_lengths[:, None]
  tokens = jnp.full((b, t), sampling.pad_id, jnp.int32).at[:, :p].set(
      jnp.where(in_prompt, prompts.astype(jnp.int32), sampling.pad_id))
  stop_tokens = jnp.asarray(sampling.stop_tokens, jnp.int32)

  def step(carry):
    i, tokens, logprobs, lengths, done, stopped = carry
    pos = prompt_lengths + i  # [B] where row b writes its i-th generated token
    # Positions are plain arange: the pad past each row's end sits after `pos` and, under the causal mask, does not
    # reach the logits at pos - 1.
    all_logits = forward(params, tokens, cfg=cfg, with_mtp=False).logits  # [B, T, V]
    logits = jnp.take_along_axis(all_logits, (pos - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    greedy = temperature == 0
    # Both branches are computed and one is selected: cheap next to the forward, and the knob stays traced.
    x = sampling_logits(logits, jnp.where(greedy, 1.0, temperature), top_k, top_p)
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(row_keys, i)
    drawn = jax.vmap(jax.random.categorical)(step_keys, x)
    token = jnp.where(greedy, jnp.argmax(logits, axis=-1), drawn).astype(jnp.int32)
    # Greedy's own distribution is a point mass (log-prob 0); it reports the untempered model's log-prob instead.
    log_dist = jax.nn.log_softmax(jnp.where(greedy, logits, x), axis=-1)
    token_logprob = jnp.take_along_axis(log_dist, token[:, None], axis=-1)[:, 0]
    active = ~done
    # Finished rows keep their pad: they write their current value back.
    tokens = tokens.at[rows, pos].set(jnp.where(active, token, tokens[rows, pos]))
    logprobs = logprobs.at[rows, pos].set(jnp.where(active, token_logprob, 0.0))
    lengths = lengths + active.astype(jnp.int32)
    hit_stop = active & jnp.any(token[:, None] == stop_tokens[None, :], axis=-1)
    return i + 1, tokens, logprobs, lengths, done | hit_stop, stopped | hit_stop

  def not_finished(carry):
    i, *_, done, _ = carry
    return (i < n) & ~jnp.all(done)  # Stops early once every row has emitted a stop token.

  init = (jnp.int32(0), tokens, jnp.zeros((b, t), jnp.float32), jnp.zeros((b,), jnp.int32),
          jnp.zeros((b,), bool), jnp.zeros((b,), bool))
  _, tokens, logprobs, lengths, _, stopped = jax.lax.while_loop(not_finished, step, init)
  # One more forward for the routing of all positions, instead of collecting it step by step. The model is causal,
  # so the routing of position t depends only on tokens[:t + 1], which are final once token t + 1 was sampled:
  # these are the ids of the forward that sampled the token after t (same buffer shape, so the same program), and
  # also exactly what the trainer's forward on this buffer routes, which is what routing replay must reproduce.
  expert_ids = forward(params, tokens, cfg=cfg, with_mtp=False).expert_ids
  positions = jnp.arange(t)[None, :]
  generated = (positions >= prompt_lengths[:, None]) & (positions < (prompt_lengths + lengths)[:, None])
  return Samples(tokens=tokens, loss_mask=generated.astype(jnp.float32), logprobs=logprobs,
                 expert_ids=expert_ids.astype(jnp.int32), lengths=lengths, stopped=stopped)
