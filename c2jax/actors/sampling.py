"""Token sampling shared by the samplers: the sampling distribution (temperature, top-k, top-p), per-row keys,
and the draw of one token per row with its log-prob (report section 4: actors stamp each token with the log-prob
of the distribution it was drawn from, the behaviour policy of the RL update).

Shapes: B rows, V vocab.
"""

from __future__ import annotations

import dataclasses
import enum

import jax
import jax.numpy as jnp
import numpy as np


class DrawMode(enum.Enum):
  """Which work a draw needs, decided when compiling: GREEDY takes the argmax (no sort, no random draw), SAMPLE
  draws from softmax(logits / temperature), SAMPLE_TRUNCATED first cuts to top-k / top-p (a sort over V)."""

  GREEDY = "greedy"
  SAMPLE = "sample"
  SAMPLE_TRUNCATED = "sample_truncated"


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
    stop_sequences: a row ends once its generated tokens end with one of these token sequences (a stop string's
      tokens, e.g. `ByteTokenizer.encode("\n```")`); kept and counted as generated, like stop tokens. A sequence
      must lie entirely within the generated tokens.
    pad_id: written after the end of every row.
  """

  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  stop_tokens: tuple[int, ...] = ()
  stop_sequences: tuple[tuple[int, ...], ...] = ()
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
    sequences = tuple(tuple(int(t) for t in seq) for seq in self.stop_sequences)
    if any(not seq for seq in sequences):
      raise ValueError("SamplingConfig: stop_sequences must not contain an empty sequence.")
    object.__setattr__(self, "stop_sequences", sequences)

  @property
  def mode(self) -> DrawMode:
    if self.temperature == 0:
      return DrawMode.GREEDY
    return DrawMode.SAMPLE_TRUNCATED if (self.top_k > 0 or self.top_p < 1) else DrawMode.SAMPLE

  def structure(self) -> SamplingConfig:
    """The compile-time part: the knobs (temperature, top-k, top-p) travel as traced scalars, and `mode` says
    which of them matter."""
    return dataclasses.replace(self, temperature=1.0, top_k=0, top_p=1.0)


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


def row_keys(key: jax.Array, b: int) -> jax.Array:
  """[B] typed keys, one per row, from a single key () or per-row keys [B] (typed, or raw uint32 [..., 2])."""
  if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    key = jax.random.wrap_key_data(key)
  if key.shape == ():
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(b, dtype=jnp.uint32))
  if key.shape != (b,):
    raise ValueError(f"sample: key has shape {key.shape}; give one key () or one key per row [B] = ({b},).")
  return key


def check_inputs(prompts: jax.Array, prompt_lengths: jax.Array) -> None:
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


def log_distribution(logits: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                     mode: DrawMode) -> jax.Array:
  """[..., V] float32 log-probs of the sampling distribution (GREEDY: of the untempered model, which is what a
  greedy token's log-prob is reported under; its own distribution is a point mass)."""
  if mode is DrawMode.GREEDY:
    return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  if mode is DrawMode.SAMPLE:
    return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  return jax.nn.log_softmax(sampling_logits(logits, temperature, top_k, top_p), axis=-1)


def draw(logits: jax.Array, keys: jax.Array, step: jax.Array, temperature: jax.Array, top_k: jax.Array,
         top_p: jax.Array, mode: DrawMode) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row: logits [B, V] -> (token [B] int32, its log-prob under the sampling distribution [B]).

  Row b's draw uses fold_in(keys[b], step): a row's randomness depends on its own key and how many tokens it has
  generated, never on the other rows (so differently batched samplers agree token for token). Greedy takes the
  argmax and reports the untempered model's log-prob. SAMPLE and SAMPLE_TRUNCATED with top_k = 0, top_p = 1 draw
  the same tokens (the truncation keeps everything), so `mode` changes cost, never results.
  """
  log_dist = log_distribution(logits, temperature, top_k, top_p, mode)
  if mode is DrawMode.GREEDY:
    token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
  else:
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)
    token = jax.vmap(jax.random.categorical)(step_keys, log_dist).astype(jnp.int32)
  return token, jnp.take_along_axis(log_dist, token[:, None], axis=-1)[:, 0]


def stop_hit(tokens: jax.Array, end: jax.Array, start: jax.Array, sampling: SamplingConfig,
             stop_tokens: jax.Array | None = None) -> jax.Array:
  """Whether each row's generation stops at position `end`: tokens [B, T], end / start [B] (start: the first
  generated position) -> [B] bool. True when tokens[end] is a stop token, or tokens[.. end] ends with a stop
  sequence lying at or after `start`. `stop_tokens` [n], where given, replaces `sampling.stop_tokens` (a traced
  array: one compiled program for any stop tokens)."""
  b, t = tokens.shape
  rows = jnp.arange(b)
  last = tokens[rows, jnp.clip(end, 0, t - 1)]
  stops = jnp.asarray(sampling.stop_tokens if stop_tokens is None else stop_tokens, jnp.int32).reshape(-1)
  hit = jnp.any(last[:, None] == stops[None, :], axis=-1)
  for seq in sampling.stop_sequences:
    n = len(seq)
    idx = end[:, None] - (n - 1) + jnp.arange(n)[None, :]
    window = jnp.take_along_axis(tokens, jnp.clip(idx, 0, t - 1), axis=1)
    hit = hit | (jnp.all(window == jnp.asarray(seq, jnp.int32)[None, :], axis=1) & (end - (n - 1) >= start))
  return hit
