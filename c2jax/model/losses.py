"""Language-model losses: masked next-token cross-entropy, the MTP loss, and the z-loss.

Each returns a `LossTerms(sum, weight)` pair rather than a mean, so that callers choose the normalization (per
token, per sequence, or by a constant as Dr. GRPO does) and sums can be added across micro-batches and devices.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class LossTerms:
  """sum: weighted loss sum (float32 scalar); weight: sum of the weights. mean = sum / max(weight, 1)."""

  sum: jax.Array
  weight: jax.Array

  @property
  def mean(self) -> jax.Array:
    return self.sum / jnp.maximum(self.weight, 1e-9)


jax.tree_util.register_dataclass(LossTerms, data_fields=["sum", "weight"], meta_fields=[])


def token_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[targets]: logits [..., V], targets [...] int -> [...] float32."""
  logits = logits.astype(jnp.float32)
  lse = jax.nn.logsumexp(logits, axis=-1)
  return jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0] - lse


def cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array | None = None) -> LossTerms:
  """Weighted cross-entropy: logits [B, T, V], targets [B, T] int, weights [B, T] (default 1)."""
  nll = -token_log_probs(logits, targets)
  w = jnp.ones_like(nll) if weights is None else weights.astype(jnp.float32)
  return LossTerms(sum=jnp.sum(nll * w), weight=jnp.sum(w))


def next_token_loss(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array | None = None) -> LossTerms:
  """Next-token CE: logits[:, i] predicts tokens[:, i + 1].

  Args:
    logits: [B, T, V].
    tokens: [B, T] the input tokens.
    loss_mask: [B, T] weight of predicting tokens[:, i] (e.g. 0 on prompts, padding and document starts of
      packed rows). Position 0 is never a target.
  """
  w = None if loss_mask is None else loss_mask[:, 1:]
  return cross_entropy(logits[:, :-1], tokens[:, 1:], w)


def mtp_pair_weights(k: int, loss_mask: jax.Array | None, segment_ids: jax.Array | None, shape: tuple[int, int]
                     ) -> jax.Array:
  """[B, T - k - 1] weight of MTP depth k at position i predicting token i + k + 1.

  The target's `loss_mask` weight, times 0 where position i and its target lie in different documents of a
  packed row (segments are contiguous, so equal ids at both ends mean one document throughout).
  """
  b, t = shape
  w = jnp.ones((b, t - k - 1), jnp.float32) if loss_mask is None else loss_mask[:, k + 1:].astype(jnp.float32)
  if segment_ids is not None:
    w = w * (segment_ids[:, :t - k - 1] == segment_ids[:, k + 1:])
  return w


def mtp_loss(mtp_logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array | None = None,
             segment_ids: jax.Array | None = None) -> LossTerms:
  """MTP CE summed over depths: mtp_logits [M, B, T, V]; depth k at position i predicts tokens[:, i + k + 1].

  Args:
    mtp_logits: [M, B, T, V].
    tokens: [B, T].
    loss_mask: [B, T] weight of each target token (as `next_token_loss`).
    segment_ids: [B, T] document ids of packed rows: pairs across documents get weight 0.

  Returns the sum over depths and positions with its weight; DeepSeek-V3 scales the mean by lambda / M.
  """
  m, b, t, _ = mtp_logits.shape
  total = LossTerms(sum=jnp.zeros((), jnp.float32), weight=jnp.zeros((), jnp.float32))
  for k in range(1, m + 1):
    if k + 1 >= t:
      break
    w = mtp_pair_weights(k, loss_mask, segment_ids, (b, t))
    term = cross_entropy(mtp_logits[k - 1, :, :t - k - 1], tokens[:, k + 1:], w)
    total = LossTerms(sum=total.sum + term.sum, weight=total.weight + term.weight)
  return total


@dataclasses.dataclass(frozen=True)
class DistillTerms:
  """ce: soft cross-entropy H(teacher, student), the loss; kl: KL(teacher || student) = ce - H(teacher), a metric
  that reaches 0 when the MTP head reproduces the main model exactly."""

  ce: LossTerms
  kl: LossTerms


jax.tree_util.register_dataclass(DistillTerms, data_fields=["ce", "kl"], meta_fields=[])

def mtp_distill_loss(mtp_logits: jax.Array, logits: jax.Array, loss_mask: jax.Array | None = None,
                     segment_ids: jax.Array | None = None) -> DistillTerms:
  """MTP self-distillation (report section 3): depth k learns the main model's own next-token distribution.

  MTP depth k at position i predicts token i + k + 1; the main model predicts that same token at position
  i + k, so the teacher is softmax(logits[:, i + k]) under stop-gradient: no gradient reaches the main model
  through the teacher (the student side, MTP module plus the trunk's hidden state it reads, trains as in
  DeepSeek-V3's MTP).

  Args:
    mtp_logits: [M, B, T, V] student logits.
    logits: [B, T, V] main-model logits (the teacher).
    loss_mask: [B, T] weight of each target token.
    segment_ids: [B, T] document ids of packed rows.
  """
  m, b, t, _ = mtp_logits.shape
  zero = jnp.zeros((), jnp.float32)
  ce_sum, kl_sum, weight = zero, zero, zero
  for k in range(1, m + 1):
    if k + 1 >= t:
      break
    w = mtp_pair_weights(k, loss_mask, segment_ids, (b, t))
    teacher = jax.lax.stop_gradient(jax.nn.log_softmax(logits[:, k:t - 1].astype(jnp.float32), axis=-1))
    student = jax.nn.log_softmax(mtp_logits[k - 1, :, :t - k - 1].astype(jnp.float32), axis=-1)
    p = jnp.exp(teacher)
    ce = -jnp.sum(p * student, axis=-1)
    entropy = -jnp.sum(p * teacher, axis=-1)
    ce_sum += jnp.sum(ce * w)
    kl_sum += jnp.sum((ce - entropy) * w)
    weight += jnp.sum(w)
  return DistillTerms(ce=LossTerms(sum=ce_sum, weight=weight), kl=LossTerms(sum=kl_sum, weight=weight))


def z_loss(logits: jax.Array, weights: jax.Array | None = None) -> LossTerms:
  """PaLM z-loss, logsumexp(logits)^2, which keeps the softmax normalizer near 1: logits [B, T, V]."""
  lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
  w = jnp.ones_like(lse) if weights is None else weights.astype(jnp.float32)
  return LossTerms(sum=jnp.sum(lse * lse * w), weight=jnp.sum(w))
