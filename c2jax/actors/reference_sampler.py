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

from c2jax.actors.sampling import DrawMode, SamplingConfig, check_inputs, draw, row_keys, stop_hit
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params
from c2jax.model.transformer import forward


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


def sample(params: Params, prompts: jax.Array, prompt_lengths: jax.Array, key: jax.Array, *, cfg: ModelConfig,
           sampling: SamplingConfig) -> Samples:
  """Generates up to `max_new_tokens` tokens per row by re-running the whole forward at every step.

  Jittable with `cfg` and `sampling` static. An eager call validates its inputs and runs a cached compiled
  program; temperature, top_k and top_p enter it as traced scalars, so the program is shared by every setting of
  them with the same `DrawMode` (a temperature sweep compiles once per cfg, shapes, max_new_tokens,
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
  check_inputs(prompts, prompt_lengths)
  # Only the shape-giving fields stay static; the numeric knobs travel as traced scalars (see above).
  structure = sampling.structure()
  return _sample(params, prompts, prompt_lengths, row_keys(key, prompts.shape[0]),
                 jnp.float32(sampling.temperature), jnp.int32(sampling.top_k), jnp.float32(sampling.top_p), cfg=cfg,
                 sampling=structure, mode=sampling.mode)


@functools.partial(jax.jit, static_argnames=("cfg", "sampling", "mode"))
def _sample(params: Params, prompts: jax.Array, prompt_lengths: jax.Array, keys: jax.Array,
            temperature: jax.Array, top_k: jax.Array, top_p: jax.Array, *, cfg: ModelConfig,
            sampling: SamplingConfig, mode: DrawMode) -> Samples:
  """`sample` after validation: keys [B] typed per-row keys; the scalar knobs replace those of `sampling`."""
  b, p = prompts.shape
  n = sampling.max_new_tokens
  t = p + n
  prompt_lengths = prompt_lengths.astype(jnp.int32)
  rows = jnp.arange(b)
  in_prompt = jnp.arange(p)[None, :] < prompt_lengths[:, None]
  tokens = jnp.full((b, t), sampling.pad_id, jnp.int32).at[:, :p].set(
      jnp.where(in_prompt, prompts.astype(jnp.int32), sampling.pad_id))

  def step(carry):
    i, tokens, logprobs, lengths, done, stopped = carry
    pos = prompt_lengths + i  # [B] where row b writes its i-th generated token
    # Positions are plain arange: the pad past each row's end sits after `pos` and, under the causal mask, does not
    # reach the logits at pos - 1.
    all_logits = forward(params, tokens, cfg=cfg, with_mtp=False).logits  # [B, T, V]
    logits = jnp.take_along_axis(all_logits, (pos - 1)[:, None, None], axis=1)[:, 0]  # [B, V]
    token, token_logprob = draw(logits, keys, i, temperature, top_k, top_p, mode)
    active = ~done
    # Finished rows keep their pad: they write their current value back.
    tokens = tokens.at[rows, pos].set(jnp.where(active, token, tokens[rows, pos]))
    logprobs = logprobs.at[rows, pos].set(jnp.where(active, token_logprob, 0.0))
    lengths = lengths + active.astype(jnp.int32)
    hit_stop = active & stop_hit(tokens, pos, prompt_lengths, sampling)
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
