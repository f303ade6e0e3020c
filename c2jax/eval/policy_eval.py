"""Held-out evaluation of a policy on a token task suite (report section 5): K samples per task, by the token-level
sampler on the suite's verifier (`evaluate`) or as whole episodes of the agent loop the multi-turn actors sample with
(`evaluate_episodes`), scored by the estimators of `c2jax.eval.metrics` (pass@k, best-of-K).

  result = evaluate(params, model=cfg, suite=suite, tasks=16, samples=8, sampling=SamplingConfig(8))
  result["pass@1"], result["best_of_8"]
"""

from __future__ import annotations

import jax
import numpy as np
import tqdm

from c2jax.actors import behaviour
from c2jax.actors import sampler as sampler_lib
from c2jax.actors.agent_loop import AgentRunner, Episode
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.service.factory import EnvFactory, InProcessEnvs
from c2jax.envs.tasks import interruptions
from c2jax.envs.token_tasks import suite as tasks_lib
from c2jax.envs.token_tasks.suite import TokenTaskSuite
from c2jax.eval.metrics import summary
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params


def evaluate(params: Params, *, model: ModelConfig, suite: TokenTaskSuite, tasks: int, samples: int,
             sampling: SamplingConfig, prompt_len: int = 16, split: str = "heldout", seed: int = 0,
             success_threshold: float = 1.0, pass_k: tuple[int, ...] = (1,)) -> dict:
  """Samples `samples` completions of each of the first `tasks` tasks of `split` in one sampler batch.

  Returns: {"pass@k" and "best_of_k" for k in pass_k (k <= samples), f"best_of_{samples}", "reward/mean", "tasks",
  "samples"}.
  """
  chosen = [suite.task(split, i) for i in range(tasks)]
  rows = tasks * samples
  prompts = np.zeros((rows, prompt_len), np.int32)
  lengths = np.zeros((rows,), np.int32)
  for r in range(rows):
    prompt = chosen[r // samples].prompt
    if len(prompt) > prompt_len:
      raise ValueError(f"Task {chosen[r // samples].task_id} has a {len(prompt)}-token prompt > prompt_len="
                       f"{prompt_len}.")
    prompts[r, :len(prompt)] = prompt
    lengths[r] = len(prompt)
  out = jax.device_get(sampler_lib.generate(params, prompts, lengths, jax.random.key(seed), cfg=model,
                                            sampling=sampling))
  tokens, n_gen = np.asarray(out.samples.tokens), np.asarray(out.samples.lengths)
  terms = tasks_lib.rewards(suite, [chosen[r // samples] for r in range(rows)],
                            [tokens[r, lengths[r]:lengths[r] + n_gen[r]] for r in range(rows)])
  outcome = np.array([t["outcome"] for t in terms], np.float64).reshape(tasks, samples)
  return summary(outcome, success_threshold, pass_k)


def evaluate_episodes(params: Params, *, runner: AgentRunner, suite: TokenTaskSuite, tasks: int, samples: int,
                      split: str = "heldout", seed: int = 0, success_threshold: float = 1.0,
                      pass_k: tuple[int, ...] = (1,), version: int = 0, envs: EnvFactory | None = None,
                      label: str | None = None) -> dict:
  """`evaluate` with every sample a whole episode of the agent loop (the runner the multi-turn actors use, so what
  is evaluated is what is trained): multi-turn where the suite has an environment, one turn otherwise. `envs`: where
  the environments run (`c2jax.envs.service.factory`; default: in this process). `label`: the progress bar's
  (default "evaluate v<version> (<split>)").

  Returns `evaluate`'s figures plus "turns/mean", "cut/fraction" (episodes ended by a budget),
  "compactions/mean" (self-summaries that started a new segment, per episode) and the agent's behaviour over all
  the episodes (`behaviour.METRICS`: turns and tokens per episode, read-before-edit, tests-before-finish, recovery
  after failing tests, malformed-call rate; NaN where no episode applies), read from the trajectories with the
  runner's tokenizer and, where the suite has them (`suite.coding_task`), the tasks' declared relevant files.
  """
  chosen = [suite.task(split, i) for i in range(tasks)]
  envs = envs if envs is not None else InProcessEnvs(suite)
  coding_task = getattr(suite, "coding_task", None)
  # A coding task whose user interrupts a turn mid-way has that turn cut (`interruptions.turn_tokens`).
  budgets = [interruptions.turn_tokens(coding_task(task), runner.agent.max_turn_tokens) if coding_task else ()
             for task in chosen]
  episodes = [Episode(prompt=task.prompt, make_env=envs(task, split, t),
                      key=jax.random.fold_in(jax.random.key(seed), t * samples + i), first_observation=task.text,
                      turn_tokens=budgets[t])
              for t, task in enumerate(chosen) for i in range(samples)]
  # A progress bar: an evaluation of hundreds of episodes takes minutes on a CPU.
  desc = label or f"evaluate v{version} ({split})"
  with tqdm.tqdm(total=len(episodes), desc=desc, unit="episode", leave=False) as bar:

    start = runner.stats.episodes  # the runner's counts add up over its runs

    def progress():
      bar.update(runner.stats.episodes - start - bar.n)

    out = runner.run(episodes, weights=lambda: (params, version), on_chunk=progress)
  outcome = np.array([traj.reward_terms["outcome"] for traj in out], np.float64).reshape(tasks, samples)
  result = summary(outcome, success_threshold, pass_k)
  result["turns/mean"] = float(np.mean([traj.turns for traj in out]))
  result["cut/fraction"] = float(np.mean([traj.cut for traj in out]))
  result["compactions/mean"] = float(np.mean([traj.compactions for traj in out]))
  coding_task = getattr(suite, "coding_task", None)
  result.update(behaviour.summarize([
      behaviour.episode_behaviour(traj, runner.tokenizer, coding_task(chosen[i // samples]) if coding_task else None,
                                  runner.chat)
      for i, traj in enumerate(out)]))
  return result
