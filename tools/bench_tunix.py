"""c2jax against tunix as a measured peer, on the same tiny model and the same batch: the RL update step and the
sampler.

  .venv/bin/python tools/bench_tunix.py                          # tiny preset, 4 groups x 4, prompts 16 + 32 new
  .venv/bin/python tools/bench_tunix.py --repeats=3 --steps_per_repeat=2 --new_tokens=16      # a quick look
  .venv/bin/python tools/bench_tunix.py --groups=8 --prompt_len=64 --new_tokens=64 --temperature=1

tunix (google-tunix, the `tunix` extra of setup.py) runs c2jax's model through `c2jax.model.tunix_adapter`, so
both sides compute the same math on the same weights; what differs is each framework's loop around it.

1. Update step on one batch of B = groups x group_size rollouts (prompts of --prompt_len random tokens, --new_tokens
   sampled by c2jax's sampler at temperature 1, random 0/1 outcome rewards), forward + backward + AdamW:
   - `c2jax_matched`: `c2jax.rl.update.update_step` set as close to tunix as tunix goes: Dr. GRPO advantage,
     ppo_clip with a symmetric range [0.8, 1.2], token-sum aggregation over C = B (tunix's normaliser), no KL,
     routing replay OFF, plausibility filter off, grad clip 1, AdamW (no decay, b1 0.9, b2 0.95). Before timing,
     its gradient and tunix's on the same weights and batch are compared (`grad_rel_diff`: the largest absolute
     difference over the largest gradient entry; float rounding only, if both optimise the same objective).
   - `c2jax_default`: c2jax's RL defaults on the same batch (routing replay ON, token plausibility filter, clip-higher
     0.28): the cost of the features tunix does not have.
   - `tunix`: tunix's GRPO learner's own jitted train step (`actor_trainer.jit_train_and_eval_step`, the loss it
     registers) on a `TrainExample` of the same tokens, with the Dr. GRPO advantage (r - group mean, registered in
     tunix's registry as "c2jax_dr_grpo" since tunix 0.1.5 has only std-normalised "grpo"), beta 0, epsilon 0.2,
     loss_agg_mode "sequence-mean-token-sum-norm" (the token sum over B), num_iterations 1, and the same clipped
     AdamW. Advantages are computed outside tunix's step (as its
     learner does), inside c2jax's.
2. Sampler: B rows of --prompt_len prompt tokens, exactly --new_tokens generated per row (no stop token on either
   side), greedy (--temperature=0, the default) or sampled: `c2jax.actors.sampler.generate` against
   `tunix.generate.sampler.Sampler.__call__` (which takes and returns text: its tokenize / detokenize of decimal
   ids is part of its time). Under greedy decoding the fraction of identical generated tokens is reported
   (the adapter test asserts equality; float rounding may flip near-ties).

Repeats interleave the sides (c2jax_matched, c2jax_default, tunix, then the samplers) after a warm-up that
compiles everything, so that a slow phase of a shared machine hurts all alike; medians of wall seconds (and of
process CPU seconds) per step / per generate call are reported, and ratios = tunix time / c2jax time (> 1: c2jax
faster). `tunix_lacks` lists what tunix 0.1.5 cannot do that c2jax's update or sampler does.

The last line printed is one JSON object with every figure; a readable table precedes it.
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from c2jax.actors import sampler as c2jax_sampler
from c2jax.actors.sampling import SamplingConfig
from c2jax.model import presets
from c2jax.model.params import init_params
from c2jax.model.tunix_adapter import TunixModel
from c2jax.optim.adamw import OptimizerConfig
from c2jax.rl import batch as batch_lib
from c2jax.rl import update as update_lib
from c2jax.rl.config import RLConfig, RoutingReplay
from c2jax.rl.filters import FilterMode, PlausibilityFilter

_MODEL = flags.DEFINE_string("model", "tiny", "A model preset of c2jax.model.presets.")
_LAYERS = flags.DEFINE_integer("n_layers", 2, "Decoder layers (the tiny preset's first is dense, the rest MoE).")
_GROUPS = flags.DEFINE_integer("groups", 4, "Prompt groups per batch.")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 4, "G, rollouts per prompt.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "P, prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "N, generated tokens per row.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "The timed samplers' temperature (0: greedy).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats per side (interleaved); medians are reported.")
_STEPS = flags.DEFINE_integer("steps_per_repeat", 3, "Update steps per timed repeat.")
_LR = flags.DEFINE_float("learning_rate", 1e-5, "AdamW learning rate of both sides.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights, prompts and rewards.")

PAD = 0
_UPDATE_SIDES = ("c2jax_matched", "c2jax_default", "tunix")
_SAMPLER_SIDES = ("c2jax", "tunix")

TUNIX_LACKS = {
    "routing_replay": "tunix's model call has no expert-id input and its sampler records no routing, so the "
                      "trainer re-routes every token (c2jax replays the actor's experts: RoutingReplay.REPLAY)",
    "behaviour_logprobs": "tunix 0.1.5's GRPO loss never sees the rollout's sampling log-probs (its vanilla sampler "
                          "returns none; with num_iterations=1 the ratio is taken against the trainer's own detached "
                          "log-probs, above 1 against the trainer's recomputed ones): a sampler/trainer mismatch is "
                          "invisible (c2jax: ratio against the actor's sampling log-probs, TIS, plausibility filter)",
    "in_flight_weight_updates": "tunix's GRPOLearner generates each batch with one set of weights and syncs them "
                                "between global steps (its experimental agentic learner overlaps production, but "
                                "0.1.5 still waits for it: a TODO); no per-token policy version (c2jax swaps weights "
                                "into running generations and stamps each token's version)",
    "dr_grpo_advantage": "tunix 0.1.5 registers only 'grpo' (std-normalised); this bench registers r - group mean",
    "constant_token_sum_normalisation": "tunix's 'sequence-mean-token-sum-norm' divides by B (its `norm` kwarg is "
                                        "not reachable from GRPOConfig); c2jax's token_sum_constant by any C "
                                        "(default B x T; this bench sets C = B to match tunix)",
    "clip_higher": "GRPOConfig 0.1.5 has one epsilon (symmetric clip); c2jax clips at [1 - 0.2, 1 + 0.28]",
    "mtp_speculative_decoding": "tunix's sampler has no draft model / MTP path",
    "latent_kv_cache": "tunix's own cache is per-layer, per-head K/V; the adapter passes c2jax's MLA latent cache "
                       "through (the vanilla sampler only threads it), beam search would need tunix's layout",
}


class IdTokenizer:
  """Token ids written as decimal words: tunix's sampler speaks text, c2jax speaks ids."""

  def encode(self, text: str, **kwargs) -> list[int]:
    del kwargs
    return [int(w) for w in str(text).split()]

  def decode(self, ids, **kwargs) -> str:
    del kwargs
    return " ".join(str(int(i)) for i in ids)

  def bos_id(self) -> int:
    return 0  # falsy: tunix prepends no BOS

  def eos_id(self) -> int:
    return -1  # never generated: every row runs the full N steps

  def pad_id(self) -> int:
    return PAD


def timed(fn: Callable[[], object]) -> tuple[float, float]:
  """(wall seconds, process CPU seconds) of fn(), blocking on its result."""
  w, c = time.perf_counter(), time.process_time()
  jax.block_until_ready(fn())
  return time.perf_counter() - w, time.process_time() - c


def rl_config(cfg, batch_size: int, *, matched: bool) -> RLConfig:
  optim = OptimizerConfig(learning_rate=_LR.value, warmup_steps=0, total_steps=1, final_lr_fraction=1.0,
                          weight_decay=0.0, grad_clip=1.0)
  if not matched:
    return RLConfig(model=cfg, optim=optim, kl_coef=0.0)
  # C = B: tunix's "sequence-mean-token-sum-norm" divides the token sum by B, so both losses are the same number.
  return RLConfig(model=cfg, optim=optim, advantage="dr_grpo", policy_loss="ppo_clip", clip_eps_low=0.2,
                  clip_eps_high=0.2, aggregation="token_sum_constant", loss_constant=float(batch_size), kl_coef=0.0,
                  routing_replay=RoutingReplay.OFF, filter=PlausibilityFilter(mode=FilterMode.NONE))


class C2jaxUpdate:
  """c2jax's jitted `update_step` (state donated) on a fixed batch."""

  def __init__(self, rl_cfg: RLConfig, params, batch: dict):
    self.state = update_lib.init_state(rl_cfg, jax.random.key(0), params=jax.tree.map(jnp.copy, params))
    self.batch = jax.device_put(batch)
    self.step_fn = jax.jit(functools.partial(update_lib.update_step, cfg=rl_cfg), donate_argnums=0)

  def step(self) -> jax.Array:
    """One update; returns its loss."""
    self.state, metrics = self.step_fn(self.state, self.batch)
    return metrics["loss"]


class TunixUpdate:
  """tunix's GRPO learner's jitted train step (`actor_trainer`, the loss GRPOLearner registers) on a fixed batch."""

  def __init__(self, cfg, params, tokens: np.ndarray, rewards: np.ndarray, group_size: int, prompt_len: int):
    import optax
    from tunix.rl import function_registry
    from tunix.rl import rl_cluster as cluster_lib
    from tunix.rl.grpo import grpo_learner
    from tunix.rl.rollout import base_rollout

    if "c2jax_dr_grpo" not in function_registry.default_registry.list_functions("advantage_estimator"):
      @function_registry.register_advantage_estimator("c2jax_dr_grpo")
      def _dr_grpo(rewards, num_generations):  # Dr. GRPO (Liu et al. 2025): r - mean of the group, no std
        grouped = rewards.reshape(-1, num_generations)
        return (grouped - grouped.mean(axis=-1, keepdims=True)).reshape(-1)

    model = TunixModel.from_params(cfg, jax.tree.map(jnp.copy, params))
    mesh = jax.sharding.Mesh(np.empty((0,), dtype=object), ("fsdp",))  # empty: tunix leaves placement alone
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(_LR.value, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.0))
    cluster = cluster_lib.RLCluster(
        actor=model, reference=None, tokenizer=IdTokenizer(),
        cluster_config=cluster_lib.ClusterConfig(
            role_to_mesh={cluster_lib.Role.ACTOR: mesh, cluster_lib.Role.REFERENCE: mesh,
                          cluster_lib.Role.ROLLOUT: mesh},
            rollout_engine="vanilla", offload_to_cpu=False,
            training_config=cluster_lib.RLTrainingConfig(actor_optimizer=tx, eval_every_n_steps=10**9),
            rollout_config=base_rollout.RolloutConfig(max_prompt_length=prompt_len,
                                                      kv_cache_size=tokens.shape[1])))
    algo = grpo_learner.GRPOConfig(num_generations=group_size, num_iterations=1, beta=0.0, epsilon=0.2,
                                   advantage_estimator="c2jax_dr_grpo",
                                   loss_agg_mode="sequence-mean-token-sum-norm")
    self.learner = grpo_learner.GRPOLearner(rl_cluster=cluster, reward_fns=lambda **kw: [], algo_config=algo)
    self.trainer = cluster.actor_trainer
    self.step_fn, _ = self.trainer.jit_train_and_eval_step()
    advantages = function_registry.get_advantage_estimator("c2jax_dr_grpo")(jnp.asarray(rewards), group_size)
    completion = jnp.asarray(tokens[:, prompt_len:])
    self.algo = algo
    self.example = grpo_learner.TrainExample(
        prompt_ids=jnp.asarray(tokens[:, :prompt_len]), prompt_mask=jnp.ones((tokens.shape[0], prompt_len), bool),
        completion_ids=completion, completion_mask=jnp.ones(completion.shape, jnp.int32), advantages=advantages,
        ref_per_token_logps=None, old_per_token_logps=None)

  def gradients(self):
    """The gradient of tunix's GRPO loss on the batch, as a pure c2jax param tree (the model is not updated)."""
    from flax import nnx

    loss_fn, algo, example = self.trainer.loss_fn, self.algo, self.example
    grad = nnx.jit(lambda m: nnx.grad(lambda mm: loss_fn(mm, example, algo), has_aux=True)(m))
    grads, _ = grad(self.trainer.model)
    return nnx.to_pure_dict(grads)["model"]

  def step(self) -> jax.Array:
    """One update; returns its loss."""
    loss, _ = self.step_fn(self.trainer.model, self.trainer.optimizer, self.example)
    return loss


def main(argv: list[str]) -> None:
  del argv
  cfg = presets.model_config(_MODEL.value, {"n_layers": _LAYERS.value, "num_mtp_layers": 0})
  b, g, p, n = _GROUPS.value * _GROUP_SIZE.value, _GROUP_SIZE.value, _PROMPT_LEN.value, _NEW_TOKENS.value
  rng = np.random.default_rng(_SEED.value)
  params = jax.jit(init_params, static_argnums=0)(cfg, jax.random.key(_SEED.value))
  # Ids from 2 up: 0 is the pad, and tunix's text round trip needs none of them inside a prompt.
  prompts = rng.integers(2, cfg.vocab_size, (b, p)).astype(np.int32)
  lengths = np.full((b,), p, np.int32)
  try:
    from tunix.generate import sampler as tunix_sampler
    tunix_error = None
  except ImportError as e:
    tunix_error = f"tunix is not importable ({e}); pip install -e .[tunix]"
    print(f"bench_tunix: {tunix_error}; timing c2jax alone.", file=sys.stderr)

  # The update batch: B rollouts sampled by c2jax at temperature 1, outcome rewards 0/1.
  rollout = c2jax_sampler.generate(params, prompts, lengths, jax.random.key(_SEED.value + 1), cfg=cfg,
                                   sampling=SamplingConfig(max_new_tokens=n, temperature=1.0, pad_id=PAD))
  rewards = rng.integers(0, 2, b).astype(np.float32)
  batch = batch_lib.from_samples(rollout.samples, group_id=np.arange(b) // g, chain_id=np.arange(b),
                                 reward_terms={"outcome": rewards}, policy_version=0)
  tokens = np.asarray(batch["tokens"])

  updates: dict[str, object] = {
      "c2jax_matched": C2jaxUpdate(rl_config(cfg, b, matched=True), params, batch),
      "c2jax_default": C2jaxUpdate(rl_config(cfg, b, matched=False), params, batch)}
  sampling = SamplingConfig(max_new_tokens=n, temperature=_TEMPERATURE.value, pad_id=PAD)
  key = jax.random.key(_SEED.value + 2)
  samplers: dict[str, Callable[[], object]] = {
      "c2jax": lambda: c2jax_sampler.generate(params, prompts, lengths, key, cfg=cfg, sampling=sampling)}
  if tunix_error is None:
    updates["tunix"] = TunixUpdate(cfg, params, tokens, rewards, g, p)
    sampler = tunix_sampler.Sampler(
        TunixModel.from_params(cfg, params), IdTokenizer(),
        tunix_sampler.CacheConfig(cache_size=p + n, num_layers=cfg.n_layers, num_kv_heads=1,
                                  head_dim=cfg.kv_lora_rank + cfg.qk_rope_head_dim))
    texts = [IdTokenizer().decode(row) for row in prompts]
    top_p = None if _TEMPERATURE.value == 0 else 1.0  # tunix samples only in its top-p mode

    def tunix_generate():
      return sampler(texts, max_generation_steps=n, max_prompt_length=p, eos_tokens=[-1],
                     temperature=_TEMPERATURE.value, top_p=top_p, seed=_SEED.value + 2, pad_output=True)
    samplers["tunix"] = tunix_generate

  # Same objective? The matched c2jax gradient and tunix's on the same weights and batch, before any update.
  grad_diff = None
  if "tunix" in updates:
    ours = jax.jit(functools.partial(update_lib.rl_gradients, cfg=rl_config(cfg, b, matched=True)))(
        params, None, jnp.zeros((), jnp.int32), jax.device_put(batch))[0]
    theirs = updates["tunix"].gradients()
    scale = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(ours))
    grad_diff = max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)))
    grad_diff /= scale

  # Warm-up: every program compiles here, outside the timing.
  compile_s = {}
  for name, u in updates.items():
    compile_s[f"update_{name}"] = timed(u.step)[0]
    u.step()
  for name, fn in samplers.items():
    compile_s[f"sampler_{name}"] = timed(fn)[0]
  agreement = None
  if "tunix" in samplers and _TEMPERATURE.value == 0:
    ours = np.asarray(samplers["c2jax"]().samples.tokens)[:, p:p + n]
    theirs = np.asarray([np.asarray(t) for t in samplers["tunix"]().tokens])[:, :n]
    agreement = float((ours == theirs).mean())

  upd = {s: [] for s in updates}
  smp = {s: [] for s in samplers}
  for _ in range(_REPEATS.value):
    for name, u in updates.items():
      w, c = timed(lambda u=u: [u.step() for _ in range(_STEPS.value)])
      upd[name].append((w / _STEPS.value, c / _STEPS.value))
    for name, fn in samplers.items():
      smp[name].append(timed(fn))

  def med(xs, i):
    return statistics.median(x[i] for x in xs)

  out = {"update": {s: {"step_s": med(v, 0), "cpu_s": med(v, 1), "tokens_per_s": b * (p + n) / med(v, 0)}
                    for s, v in upd.items()},
         "sampler": {s: {"generate_s": med(v, 0), "cpu_s": med(v, 1), "new_tokens_per_s": b * n / med(v, 0)}
                     for s, v in smp.items()}}
  print(f"\nmodel {_MODEL.value} ({cfg.n_layers} layers, V={cfg.vocab_size}), B={b} (G={g}), P={p}, N={n}, "
        f"{_REPEATS.value} repeats, medians (wall; process CPU):")
  for s, m in out["update"].items():
    print(f"  update  {s:<14} {m['step_s'] * 1e3:9.1f} ms/step  ({m['cpu_s'] * 1e3:8.1f} ms CPU)")
  for s, m in out["sampler"].items():
    print(f"  sampler {s:<14} {m['generate_s'] * 1e3:9.1f} ms/call  ({m['new_tokens_per_s']:8.1f} new tok/s)")
  if "tunix" in updates:
    out["update_ratio"] = out["update"]["tunix"]["step_s"] / out["update"]["c2jax_matched"]["step_s"]
    out["update_ratio_default"] = out["update"]["tunix"]["step_s"] / out["update"]["c2jax_default"]["step_s"]
    out["sampler_ratio"] = out["sampler"]["tunix"]["generate_s"] / out["sampler"]["c2jax"]["generate_s"]
    print(f"  tunix / c2jax time: update {out['update_ratio']:.2f}x (matched), {out['update_ratio_default']:.2f}x "
          f"(c2jax defaults); sampler {out['sampler_ratio']:.2f}x" +
          (f"; greedy agreement {agreement:.1%}" if agreement is not None else "") +
          f"; gradient max |c2jax - tunix| / max |c2jax| = {grad_diff:.1e}")
  out.update({"peers": {"update": list(updates), "sampler": list(samplers)}, "tunix_skipped": tunix_error,
              "greedy_agreement": agreement, "grad_rel_diff": grad_diff, "compile_s": compile_s,
              "tunix_lacks": TUNIX_LACKS,
              "model": _MODEL.value, "n_layers": cfg.n_layers, "batch": b, "group_size": g, "prompt_len": p,
              "new_tokens": n, "temperature": _TEMPERATURE.value, "repeats": _REPEATS.value,
              "steps_per_repeat": _STEPS.value, "device": jax.devices()[0].device_kind})
  print(json.dumps(out))


if __name__ == "__main__":
  app.run(main)
