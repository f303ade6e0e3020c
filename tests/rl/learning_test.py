"""A tiny model trained synchronously with `update_step` on a verifiable task learns it within a minute on CPU.

The task: after a random two-token prompt, emit tokens from the first eighth of the vocabulary (ids < V/8). The
reward is the fraction of generated tokens that do, so a random policy scores ~1/8. Rollouts come from the
reference sampler (the behaviour log-probs and expert ids an actor would stamp), with the report's defaults:
Dr. GRPO, k1 KL in the reward, routing replay, the plausibility filter, overlong rollouts kept.
"""

import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2jax.actors.reference_sampler import SamplingConfig, sample
from c2jax.optim import OptimizerConfig
from c2jax.rl import batch as batch_lib
from c2jax.rl.config import RLConfig
from c2jax.rl.update import init_state, update_step
from tests import tiny

PROMPTS, GROUP, PROMPT_LEN, NEW_TOKENS, STEPS = 4, 8, 2, 8, 30


class LearningTest(absltest.TestCase):

  @pytest.mark.slow
  def test_mean_reward_rises(self):
    model = tiny.MODEL
    target = model.vocab_size // 8
    optim = OptimizerConfig(learning_rate=1e-2, warmup_steps=1, total_steps=1, final_lr_fraction=1.0,
                            weight_decay=0.0, grad_clip=1.0)
    cfg = RLConfig(model=model, optim=optim)
    state = init_state(cfg, jax.random.key(0), params=jax.tree.map(jnp.copy, tiny.params(model)))  # donated below
    step = jax.jit(functools.partial(update_step, cfg=cfg), donate_argnums=0)
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    rng = np.random.default_rng(0)
    rows = PROMPTS * GROUP
    rewards, metrics = [], None
    for i in range(STEPS):
      prompts = np.repeat(rng.integers(target, model.vocab_size, (PROMPTS, PROMPT_LEN)), GROUP, axis=0)
      samples = sample(state.params, prompts.astype(np.int32), np.full(rows, PROMPT_LEN, np.int32),
                       jax.random.key(1000 + i), cfg=model, sampling=sampling)
      generated = np.asarray(samples.loss_mask) > 0
      reward = ((np.asarray(samples.tokens) < target) & generated).sum(1) / generated.sum(1)
      batch = batch_lib.from_samples(samples, group_id=np.arange(rows) // GROUP, chain_id=np.arange(rows),
                                     reward_terms={"outcome": reward}, policy_version=i)
      state, metrics = step(state, batch)
      rewards.append(float(reward.mean()))
      # The trainer sees the rollouts as the sampler produced them (same weights, replayed experts): nothing is
      # filtered and the trainer/actor KL is float32 rounding.
      self.assertEqual(float(metrics["filtered_fraction"]), 0.0)
      self.assertLess(float(metrics["kl_behaviour_k3"]), 1e-6)
    print("mean reward per step:", " ".join(f"{r:.2f}" for r in rewards))
    self.assertLess(np.mean(rewards[:5]), 0.3)
    self.assertGreater(np.mean(rewards[-5:]), 0.8)
    self.assertEqual(int(state.step), STEPS)


if __name__ == "__main__":
  absltest.main()
