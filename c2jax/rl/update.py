"""The RL update: one pure, jitted policy-gradient step on a batch of rollouts (report section 4).

  state = init_state(cfg, key)                        # or from pretrained params: init_state(cfg, key, params)
  step = jax.jit(functools.partial(update_step, cfg=cfg), donate_argnums=0)
  state, metrics = step(state, batch)                 # batch: c2jax/rl/batch.py

What one step does, in order:
  1. rewards      r_i = sum_j w_j term_j - lambda C_{k,q}(chain length)                      (`rewards`)
  2. reference    log pi_ref of every action token, when the KL is on (no gradient; micro-batched)
  3. KL in reward r_i -= beta sum_t k(log pi_ref - log mu) over the chain, for KlPlacement.IN_REWARD (`kl`)
  4. advantages   A_i from the group of the row's prompt, each chain counted once              (`advantages`)
  5. weights      w_{i,t} of each action token for the whole batch, before micro-batching      (`policy_loss`)
  6. per micro-batch: forward with the actor's expert ids (routing replay), log pi_theta, the plausibility
     filter, the per-token policy loss and the KL loss term; gradients summed over micro-batches
  7. AdamW (`c2jax.optim`); the reference params are carried unchanged.

Self-summary chains (report section 4: the final reward is applied to every token of the chain). An episode that
summarized is a chain c of segments s = 1..S_c, one row each, sharing its `chain_id` within group g. With the
defaults (dr_grpo, token_sum_constant) the update computes

  R_c  = sum_j w_j term_j(c) - lambda C_{k,q}(sum_s |y_{c,s}| / scale)    the chain's reward, on each of its rows
  A_c  = R_c - (1 / n_g) sum_{c' in g} R_{c'}                              n_g = chains in g, not rows
  loss = -(1 / C) sum_c sum_s sum_t m_{c,s,t} min(rho A_c, clip(rho) A_c)  C = N x T, a constant

so every token of every segment, summaries included (unless `SummaryTokens.MASKED` left them out of m), carries the
chain's advantage; a chain with more segments weighs more by its tokens only, never by its count of rows, and the
baseline is the mean over the group's episodes (tests/rl/summary_chain_test.py checks these against the actor's
rows). Other estimators and aggregations replace A_c and 1 / C as `advantages` and `policy_loss` state, always over
chains (`SequenceUnit.CHAIN`) or rows as configured.

A sequence is a row of the padded layout or a segment of a packed row (`c2jax.rl.batch`); per-sequence terms (rewards,
advantages, the length penalty, the KL in the reward, C) are computed on the [N] sequence fields and reach the
tokens through `segment_ids`, so the two layouts give the same update.

The step is a function of (state, batch) only: under a mesh (`c2jax.rl.sharded`) it runs unchanged with
FSDP/EP/CP-sharded params and a batch sharded over rows and sequence.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import optax

from c2jax.model.losses import token_log_probs
from c2jax.model.params import Params, init_params
from c2jax.model.transformer import forward
from c2jax.optim import make_optimizer
from c2jax.rl import advantages as advantages_lib
from c2jax.rl import batch as batch_lib
from c2jax.rl import filters
from c2jax.rl import group_metrics
from c2jax.rl import kl as kl_lib
from c2jax.rl import policy_loss as policy_loss_lib
from c2jax.rl import rewards as rewards_lib
from c2jax.rl.config import Overlong, RLConfig, RoutingReplay, ZeroVarianceGroups
from c2jax.rl.kl import KlPlacement
from c2jax.rl.policy_loss import SequenceUnit


@dataclasses.dataclass(frozen=True)
class RLState:
  """step: int32 scalar, the trainer's policy version (weights after `step` updates); params; opt_state;
  ref_params: the frozen reference policy (None when the KL is off)."""

  step: jax.Array
  params: Params
  opt_state: Any
  ref_params: Params | None


jax.tree_util.register_dataclass(RLState, data_fields=["step", "params", "opt_state", "ref_params"], meta_fields=[])


def optimizer(cfg: RLConfig) -> optax.GradientTransformation:
  """The update's AdamW; the RL loss has no MTP term, so weight decay leaves the MTP modules as they are."""
  return make_optimizer(cfg.optim, untrained=("mtp",))


def init_state(cfg: RLConfig, key: jax.Array, params: Params | None = None) -> RLState:
  """A fresh state from `params` (e.g. the SFT checkpoint) or a random init; the reference policy is a copy.

  The state takes `params` over: a step that donates the state also frees them (copy them first to keep them).
  """
  if params is None:
    params = init_params(cfg.model, key)
  ref = jax.tree.map(jnp.copy, params) if cfg.uses_reference else None
  return RLState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer(cfg).init(params),
                 ref_params=ref)


@dataclasses.dataclass(frozen=True)
class TokenLogProbs:
  """The trainer's view of a batch: logp [B, T] (aligned to tokens, 0 at t = 0), entropy [B, T] of the next-token
  distribution that produced token t, expert_ids [Lm, B, T, K] the routing used."""

  logp: jax.Array
  entropy: jax.Array
  expert_ids: jax.Array


jax.tree_util.register_dataclass(TokenLogProbs, data_fields=["logp", "entropy", "expert_ids"], meta_fields=[])


def policy_log_probs(params: Params, batch: Mapping, cfg: RLConfig) -> TokenLogProbs:
  """Runs the model on a batch (with routing replay when configured) and reads per-token log-probs.

  Log-probs are those of softmax(logits / cfg.sampling_temperature), the distribution the actor sampled from, so
  that the importance ratio compares like with like.
  """
  forced = None
  if cfg.routing_replay is RoutingReplay.REPLAY and cfg.model.n_moe_layers:
    if "expert_ids" not in batch:
      raise ValueError("routing_replay=REPLAY needs the actor's expert_ids in the batch; record them in the actor or "
                       "set routing_replay=OFF.")
    forced = batch["expert_ids"]
  tokens = batch["tokens"]
  out = forward(params, tokens, cfg=cfg.model, positions=batch.get("positions"),
                segment_ids=batch.get("segment_ids"), forced_expert_ids=forced,
                token_mask=batch.get("token_mask"), with_mtp=False)
  logits = out.logits[:, :-1]
  if cfg.sampling_temperature != 1.0:
    logits = logits / cfg.sampling_temperature
  lp = token_log_probs(logits, tokens[:, 1:])
  logz = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  ent = -jnp.sum(jnp.exp(logz) * logz, axis=-1)
  pad = lambda a: jnp.pad(a, ((0, 0), (1, 0)))
  return TokenLogProbs(logp=pad(lp), entropy=pad(jax.lax.stop_gradient(ent)), expert_ids=out.expert_ids)


def _split(tree: Any, n: int, axis_of: Any) -> Any:
  """Splits every array's row axis into n micro-batches, stacked first: [.., B, ..] -> [n, .., B/n, ..].

  Micro-batch j takes rows j, j + n, j + 2n, ...: rows sharded in contiguous blocks over devices then stay on
  their devices (the reshape splits the row axis as [B/n, n]), so no micro-batch moves data between devices.
  """

  def split(x, axis):
    b = x.shape[axis]
    x = x.reshape(x.shape[:axis] + (b // n, n) + x.shape[axis + 1:])
    return jnp.moveaxis(x, axis + 1, 0)

  return jax.tree.map(split, tree, axis_of)


def _model_inputs(batch: Mapping) -> dict:
  keys = ("tokens", "positions", "segment_ids", "expert_ids", "token_mask")
  return {k: batch[k] for k in keys if k in batch}


def _row_axes(tree: Mapping) -> dict:
  return {k: (1 if k == "expert_ids" else 0) for k in tree}


def reference_log_probs(ref_params: Params, batch: Mapping, cfg: RLConfig) -> jax.Array:
  """log pi_ref [B, T] of the batch's tokens (constant), computed micro-batch by micro-batch.

  The reference model routes with its own router: routing replay exists to make the *trained* policy compute
  what the actor computed, while pi_ref is a different model that no actor ran.
  """
  cfg = dataclasses.replace(cfg, routing_replay=RoutingReplay.OFF)
  inputs = _model_inputs(batch)
  n = cfg.micro_batches
  chunks = _split(inputs, n, _row_axes(inputs))
  lp = jax.lax.map(lambda mb: policy_log_probs(ref_params, mb, cfg).logp, chunks)  # [n, B/n, T]
  b, t = batch["tokens"].shape
  return jax.lax.stop_gradient(jnp.moveaxis(lp, 0, 1).reshape(b, t))


# Log-ratios beyond this are clamped before exp: a token e^20 times likelier under one engine than the other is
# a mismatch (the plausibility filter's business), and exp must not overflow into inf * 0 = NaN gradients.
_MAX_LOG_RATIO = 20.0


def _micro_loss(params: Params, mb: Mapping, cfg: RLConfig, n_seq: int):
  """Loss sum and metric sums of one micro-batch (everything pre-weighted for the whole batch; `mb["sequence"]`
  indexes the batch's n_seq sequences).

  Metric sums: diagnostics of the policies (entropy, KLs, ratio, filtered tokens) over all action tokens
  (`full_mask`), the clip fraction over the tokens in the loss (`mask`, after overlong / zero-variance masking).
  """
  view = policy_log_probs(params, mb, cfg)
  logp, mask, full_mask = view.logp, mb["mask"], mb["full_mask"]
  keep = filters.plausible(logp, mb["behaviour_logprobs"], full_mask, cfg.filter, mb["sequence"], n_seq)
  in_loss = mask * keep
  # Tokens outside the loss get the trainer's own log-prob as behaviour (ratio 1), so that a -inf or NaN there
  # cannot reach the gradient through a zero weight.
  sg_logp = jax.lax.stop_gradient(logp)
  behaviour = jnp.where(in_loss > 0, mb["behaviour_logprobs"], sg_logp)
  behaviour = jnp.clip(behaviour, sg_logp - _MAX_LOG_RATIO, sg_logp + _MAX_LOG_RATIO)
  per_token, clipped = policy_loss_lib.POLICY_LOSSES.get(cfg.policy_loss)(
      logp, behaviour, mb["advantage"], eps_low=cfg.clip_eps_low, eps_high=cfg.clip_eps_high,
      tis_cap=cfg.tis_cap)
  w = mb["weight"] * keep
  loss = jnp.sum(w * per_token)
  sums = {}
  if cfg.uses_reference:
    ref = mb["ref_logprobs"]
    if cfg.kl_placement in (KlPlacement.LOSS, KlPlacement.LOSS_STRAIGHT_THROUGH):
      term = kl_lib.kl_loss_term(cfg.kl_estimator, cfg.kl_placement, logp, ref, behaviour)
      loss = loss + cfg.kl_coef * jnp.sum(w * term)
    sums["kl_ref_k1"] = jnp.sum(full_mask * kl_lib.kl_estimate("k1", sg_logp, ref))
    sums["kl_ref_k3"] = jnp.sum(full_mask * kl_lib.kl_estimate("k3", sg_logp, ref))
  # Trainer-vs-actor mismatch on the action tokens the actor reported finite log-probs for: k3 of the behaviour
  # policy against the trainer (the usual engine-mismatch gauge), and the mean ratio (1 when they agree).
  finite = full_mask * jnp.isfinite(mb["behaviour_logprobs"])
  diag_behaviour = jnp.where(finite > 0, mb["behaviour_logprobs"], sg_logp)
  log_ratio = jnp.clip(sg_logp - diag_behaviour, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)
  sums["kl_behaviour_k3"] = jnp.sum(finite * kl_lib.KL_ESTIMATORS.get("k3")(log_ratio))  # KL(mu || pi_theta)
  sums["ratio_mean"] = jnp.sum(finite * jnp.exp(log_ratio))
  sums["entropy"] = jnp.sum(full_mask * view.entropy)
  sums["filtered_fraction"] = jnp.sum(full_mask * (1.0 - keep))
  # Sequences with a filtered token (a sequence lies in one row, so in one micro-batch).
  seq = mb["sequence"]  # indices into the whole batch's n_seq sequences
  filtered = jax.ops.segment_sum(jnp.where(seq >= 0, full_mask * (1.0 - keep), 0.0).reshape(-1),
                                 jnp.maximum(seq, 0).reshape(-1), num_segments=n_seq)
  sums["filtered_rows"] = jnp.sum((filtered > 0).astype(jnp.float32))
  sums["clip_fraction"] = jnp.sum(in_loss * clipped)
  if cfg.routing_replay is RoutingReplay.OFF and "expert_ids" in mb and cfg.model.n_moe_layers:
    # Without replay: how often the trainer's routing matches the actor's (under replay it is the actor's).
    same = jnp.all(view.expert_ids == mb["expert_ids"], axis=-1)  # [Lm, b, T]
    sums["routing_agreement"] = jnp.sum(full_mask[None] * same) / cfg.model.n_moe_layers
  return loss, sums


def _accumulate_grads(params: Params, micro: Mapping, cfg: RLConfig, n_seq: int):
  """Sums loss, gradients and metric sums over the n stacked micro-batches (a scan: one compiled body)."""
  grad_fn = jax.value_and_grad(functools.partial(_micro_loss, n_seq=n_seq), has_aux=True)
  n = cfg.micro_batches
  if n == 1:
    (loss, sums), grads = grad_fn(params, jax.tree.map(lambda x: x[0], micro), cfg)
    return loss, sums, grads

  def body(carry, mb):
    (loss, sums), grads = grad_fn(params, mb, cfg)
    acc_loss, acc_sums, acc_grads = carry
    acc_grads = jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc_grads, grads)
    return (acc_loss + loss, jax.tree.map(jnp.add, acc_sums, sums), acc_grads), None

  abstract = jax.eval_shape(functools.partial(grad_fn, cfg=cfg), params, jax.tree.map(lambda x: x[0], micro))
  zeros = jax.tree.map(lambda a: jnp.zeros(a.shape, jnp.float32), abstract)
  (_, zero_sums), zero_grads = zeros
  init = (jnp.zeros((), jnp.float32), zero_sums, zero_grads)
  (loss, sums, grads), _ = jax.lax.scan(body, init, micro)
  grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
  return loss, sums, grads


@dataclasses.dataclass(frozen=True)
class Prepared:
  """The batch's per-sequence ([N]) and per-token ([B, T]) quantities that need no gradient (stages 1, 3, 4, 5), for
  the whole batch (`c2jax.rl.batch`: N = B in the padded layout).

  Attributes:
    reward: `RewardOutput` of each sequence's chain (total [N] and the weighted parts).
    shaped_reward: [N] the reward the advantages see (minus beta x the chain's KL for KlPlacement.IN_REWARD).
    advantage: [N] A_i (0 on padding sequences); segments of one chain share their chain's.
    weight: [B, T] w_{i,t}, the aggregation weight of each action token.
    mask: [B, T] the action tokens in the loss (after overlong and zero-variance masking).
    full_mask: [B, T] all action tokens of real sequences (for metrics).
    first: [N] 1 on the first sequence of each chain (chain-level statistics count it once).
    chain_tokens: [N] action tokens of the sequence's whole chain (the length-penalty x).
    truncated: [N] 1 for overlong sequences.
    zero_variance: [N] 1 for sequences of groups whose rewards are all equal.
  """

  reward: rewards_lib.RewardOutput
  shaped_reward: jax.Array
  advantage: jax.Array
  weight: jax.Array
  mask: jax.Array
  full_mask: jax.Array
  first: jax.Array
  chain_tokens: jax.Array
  truncated: jax.Array
  zero_variance: jax.Array


jax.tree_util.register_dataclass(
    Prepared, data_fields=[f.name for f in dataclasses.fields(Prepared)], meta_fields=[])


def prepare(batch: Mapping, ref_logp: jax.Array | None, cfg: RLConfig) -> Prepared:
  """Rewards, the KL in the reward, advantages and token weights of a whole batch (no model involved).

  Args:
    batch: the RL batch (`c2jax.rl.batch`).
    ref_logp: [B, T] log pi_ref of the tokens, or None when the KL is off.
    cfg: the RL config.
  """
  n, t = batch["group_id"].shape[0], batch["tokens"].shape[1]
  valid = batch_lib.row_valid(batch)
  full_mask = batch_lib.action_mask(batch)
  # Overlong is a property of the chain: any truncated segment makes the whole chain truncated.
  truncated = (batch_lib.segment_sum_by(batch["chain_id"], batch["truncated"].astype(jnp.float32), valid) > 0)
  truncated = truncated.astype(jnp.float32) * valid
  _, first = batch_lib.chain_segments(batch["chain_id"], valid)
  chain_tokens = batch_lib.segment_sum_by(batch["chain_id"], batch_lib.per_sequence_sum(full_mask, batch), valid)

  # 1. Rewards of each chain (repeated on its rows).
  reward_out = rewards_lib.compose_rewards(batch["reward_terms"], chain_tokens, cfg.reward)

  # 3. The KL in the reward is taken at the sampled tokens with the behaviour log-probs (mu sampled them).
  shaped = reward_out.total
  if cfg.uses_reference and cfg.kl_placement is KlPlacement.IN_REWARD:
    if ref_logp is None:
      raise ValueError("The KL is in the reward (kl_placement=IN_REWARD) but prepare got no ref_logp; pass the "
                       "reference log-probs (reference_log_probs), or set kl_coef=0.")
    seq_kl = batch_lib.per_sequence_sum(
        full_mask * kl_lib.kl_estimate(cfg.kl_estimator, batch["behaviour_logprobs"], ref_logp), batch)
    shaped = shaped - cfg.kl_coef * batch_lib.segment_sum_by(batch["chain_id"], seq_kl, valid)

  # 4. Advantages over each group's chains. A group without signal is judged on the task's reward, before the KL
  # shaping (which would make every group's rewards differ by a little).
  adv, _ = advantages_lib.advantages(cfg.advantage, shaped, batch["group_id"], first, cfg.advantage_eps)
  adv = adv * valid
  zero_variance = advantages_lib.group_stats(reward_out.total, batch["group_id"], first).zero_variance

  # 5. Token weights for the whole batch.
  keep = jnp.ones_like(valid)
  if cfg.overlong is Overlong.MASK:
    keep = keep * (1.0 - truncated)
  if cfg.zero_variance_groups is ZeroVarianceGroups.DROP:
    keep = keep * (1.0 - zero_variance)
  mask = full_mask * batch_lib.to_tokens(keep, batch)
  unit = batch["chain_id"] if cfg.sequence_unit is SequenceUnit.CHAIN else jnp.arange(n)
  unit = jnp.where(valid > 0, unit, -1 - jnp.arange(n))  # padding sequences never share a unit with real ones
  # C's default is the padded layout's size, N x T, in both layouts: packing must not change the update.
  constant = cfg.loss_constant if cfg.loss_constant > 0 else float(n * t)
  scale = policy_loss_lib.AGGREGATIONS.get(cfg.aggregation)(batch_lib.per_sequence_sum(mask, batch), unit, constant)
  weight = mask * batch_lib.to_tokens(scale, batch)
  return Prepared(reward=reward_out, shaped_reward=shaped, advantage=adv, weight=weight, mask=mask,
                  full_mask=full_mask, first=first, chain_tokens=chain_tokens, truncated=truncated,
                  zero_variance=zero_variance)


def rl_gradients(params: Params, ref_params: Params | None, version: jax.Array, batch: Mapping,
                 cfg: RLConfig) -> tuple[Params, dict]:
  """Stages 1-6 of the update: the gradient of the RL loss on a batch, and the step's metrics.

  Args:
    params: the policy's params (differentiated).
    ref_params: the reference policy's params (None when the KL is off).
    version: int32 scalar, the trainer's policy version (for staleness).
    batch: the RL batch (`c2jax.rl.batch`, padded or packed); B divisible by cfg.micro_batches.
    cfg: the RL config (static).
  Returns:
    (grads with params' structure and dtypes, metrics: dict of float32 scalars).
  """
  model = cfg.model
  batch_lib.check_batch(batch, model.n_moe_layers, model.num_experts_per_tok)
  if batch["tokens"].shape[0] % cfg.micro_batches:
    raise ValueError(f"Batch of {batch['tokens'].shape[0]} rows does not split into "
                     f"micro_batches={cfg.micro_batches}.")
  # 2. Reference log-probs (no gradient).
  ref_logp: jax.Array | None = None
  if cfg.uses_reference:
    if ref_params is None:
      raise ValueError("The KL to the reference policy is on but the state has no ref_params; build the state with "
                       "c2jax.rl.update.init_state for this config, or set kl_coef=0.")
    ref_logp = reference_log_probs(ref_params, batch, cfg)
  prep = prepare(batch, ref_logp, cfg)

  # 6. Loss and gradients, micro-batch by micro-batch.
  per_row = {**_model_inputs(batch), "behaviour_logprobs": batch["behaviour_logprobs"], "mask": prep.mask,
             "full_mask": prep.full_mask, "weight": prep.weight,
             "advantage": batch_lib.to_tokens(prep.advantage, batch), "sequence": batch_lib.sequence_index(batch)}
  if ref_logp is not None:
    per_row["ref_logprobs"] = ref_logp
  micro = _split(per_row, cfg.micro_batches, _row_axes(per_row))
  loss, sums, grads = _accumulate_grads(params, micro, cfg, batch["group_id"].shape[0])
  return grads, _metrics(cfg, batch, version, loss, sums, grads, prep)


def update_step(state: RLState, batch: Mapping, *, cfg: RLConfig) -> tuple[RLState, dict]:
  """One policy-gradient update on a batch of rollouts (see the module docstring for the stages).

  Args:
    state: the RL state (donate it under jit).
    batch: the RL batch (`c2jax.rl.batch`); B divisible by cfg.micro_batches.
    cfg: the RL config (static).
  Returns:
    (new state, metrics: dict of float32 scalars).
  """
  grads, metrics = rl_gradients(state.params, state.ref_params, state.step, batch, cfg)
  updates, opt_state = optimizer(cfg).update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return RLState(step=state.step + 1, params=params, opt_state=opt_state, ref_params=state.ref_params), metrics


def _metrics(cfg: RLConfig, batch: Mapping, version: jax.Array, loss: jax.Array, sums: dict, grads: Params,
             prep: Prepared) -> dict:
  """Scalar metrics of the step; token averages are over the action tokens of the batch, reward and length
  statistics over chains (each counted once)."""
  full_mask, first = prep.full_mask, prep.first
  reward = prep.reward.total
  n_tokens = jnp.maximum(jnp.sum(full_mask), 1.0)
  m = {"loss": loss, "grad_norm": optax.tree.norm(grads), "tokens": jnp.sum(full_mask),
       "tokens_in_loss": jnp.sum(prep.mask)}
  n_in_loss = jnp.maximum(jnp.sum(prep.mask), 1.0)
  for k, v in sums.items():
    m[k] = v if k == "filtered_rows" else v / (n_in_loss if k == "clip_fraction" else n_tokens)
  n_chains = jnp.maximum(jnp.sum(first), 1.0)
  chain_mean = lambda x: jnp.sum(first * x) / n_chains
  m["reward/mean"] = chain_mean(reward)
  for name, part in prep.reward.parts.items():
    m[f"reward/{name}"] = chain_mean(part)  # weighted contribution to the reward
  for name, raw in prep.reward.raw.items():
    m[f"reward_raw/{name}"] = chain_mean(raw)  # the environment's signal, weighted or not
  m["advantage/mean"] = chain_mean(prep.advantage)
  m["advantage/abs_mean"] = chain_mean(jnp.abs(prep.advantage))
  group = group_metrics.group_reward_stats(reward, batch["group_id"], first)
  m.update({f"groups/{k}": v for k, v in group.items()})
  m["groups/zero_variance_rows"] = jnp.sum(first * prep.zero_variance)
  outcome = batch["reward_terms"].get("outcome")
  if outcome is not None:
    success = (outcome >= cfg.success_threshold).astype(jnp.float32)
    for k in cfg.pass_k:
      m[f"pass@{k}"], _ = group_metrics.pass_at_k(success, batch["group_id"], first, k)
      m[f"best_of_{k}"], _ = group_metrics.best_of_k(reward, batch["group_id"], first, k)
    lengths = group_metrics.length_by_outcome(prep.chain_tokens, success, first)
    m["length/correct"] = lengths["mean_length_success"]
    m["length/incorrect"] = lengths["mean_length_failure"]
  m["length/mean"] = chain_mean(prep.chain_tokens)
  m["truncated_fraction"] = chain_mean(prep.truncated)
  # Staleness: how many updates behind the trainer each action token's policy was (PipelineRL's lag).
  lag = (version - batch["policy_version"]).astype(jnp.float32)
  m["staleness/mean"] = jnp.sum(full_mask * lag) / n_tokens
  m["staleness/max"] = jnp.max(jnp.where(full_mask > 0, lag, 0.0))
  return {k: jnp.asarray(v, jnp.float32) for k, v in m.items()}
