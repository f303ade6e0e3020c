"""The held-out evaluation of an RL run, shared by the trainer (before and after RL) and the evaluator process (every
`eval.every_versions` versions): pass@k and best-of-K on the suite's held-out split (report section 5).

  run_eval = held_out_evaluation(cfg)          # cfg: an RLRunConfig
  result = run_eval(params)                    # {"pass@1": ..., "best_of_8": ..., "reward/mean": ..., ...}
  result = run_eval(params, label="held-out evaluation before RL 3/5")     # the progress bar's label

Single-turn actors are evaluated by the token-level sampler on the suite's verifier
(`c2jax.eval.policy_eval.evaluate`); multi-turn actors by the same agent loop they sample with
(`c2jax.eval.policy_eval.evaluate_episodes`, with the actors' engine shapes, budgets and sampling), so what is
evaluated is what is trained, on the environments the run config's `env_service` places (in-process, or on the
environment servers). This wiring stays in services, not in `c2jax.eval`: it reads the RL run config, and the
trainer and the evaluator process import it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

from c2jax.actors.actor import EpisodeKind, suite_chat_format, text_tokenizer
from c2jax.actors.agent_loop import AgentRunner
from c2jax.envs.service.factory import env_factory
from c2jax.eval.policy_eval import evaluate, evaluate_episodes
from c2jax.services.rl_run_config import RLRunConfig


@dataclasses.dataclass(frozen=True)
class HeldOutEvaluation:
  """`run(params, label=None)` -> the held-out figures; `runner`: the agent loop a multi-turn evaluation runs its
  episodes through (its engine's programs: `AgentRunner.compile_programs`), None for a single-turn one."""

  run: Callable[..., dict]
  runner: AgentRunner | None = None

  def __call__(self, params, label: str | None = None) -> dict:
    return self.run(params, label=label)


def held_out_evaluation(cfg: RLRunConfig) -> HeldOutEvaluation:
  """(params, label=None) -> the held-out figures of `cfg`'s suite (see the module docstring); `label` names the
  episodes' progress bar (single-turn evaluation is one sampler call, without a bar)."""
  actor = cfg.actor_config
  suite = cfg.task_suite()
  common = dict(suite=suite, tasks=cfg.eval.tasks, samples=cfg.eval.samples, seed=cfg.seed,
                success_threshold=cfg.rl.success_threshold, pass_k=cfg.eval_pass_k)
  if actor.episodes is EpisodeKind.MULTI_TURN:
    runner = AgentRunner(cfg.model_config, actor.engine_config(), cfg.eval_sampling, actor.agent_config(),
                         text_tokenizer(suite), chat_format=suite_chat_format(suite))
    return HeldOutEvaluation(functools.partial(evaluate_episodes, runner=runner,
                                               envs=env_factory(cfg.env_service, suite), **common), runner)
  single_turn = functools.partial(evaluate, model=cfg.model_config, sampling=cfg.eval_sampling,
                                  prompt_len=actor.prompt_len, **common)
  return HeldOutEvaluation(lambda params, label=None: single_turn(params))
