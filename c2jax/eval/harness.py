"""The evaluation harness: run a policy on a coding-task suite in sandboxes and report pass@1, best-of-K,
over-editing and per-category tables (report section 5: held-out coding tasks judged by hidden tests).

  report = evaluate(tasks, make_policy=lambda i: POLICIES.get("reference")(), samples=1, workers=2)
  report.summary["pass@1"], report.markdown(), report.plot("eval.png")

Each (task, sample) is one episode of `c2jax.envs.core.env.CodingEnv` (multi-turn until the policy finishes or a
budget runs out), graded by the hidden tests in a fresh sandbox; episodes run `workers` at a time in a
`SandboxPool`. A model is evaluated by `evaluate_model`, through the agent loop the multi-turn RL actors sample
with (`c2jax.actors.agent_loop`: the slot engine, tools on host workers), so what is evaluated is what is trained:

  runner = AgentRunner(model_cfg, EngineConfig(slots=4, context=4096), sampling, AgentConfig(max_turns=8), tok)
  report = evaluate_model(tasks, runner, params, samples=2, config=EnvConfig(max_turns=8))

pass@k is the unbiased estimator from n samples per task (Chen et al. 2021), best-of-K the mean over tasks of the
best pass fraction among the K = n samples, both by the estimators of `c2jax.eval.metrics`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import time
from typing import Callable, Sequence

import jax
import numpy as np

from c2jax.actors.agent_loop import AgentRunner
from c2jax.actors.agent_loop import Episode as AgentEpisode
from c2jax.envs.core.agent_env import CodingAgentEnv
from c2jax.envs.tasks import interruptions
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig, first_observation
from c2jax.sandbox.sandbox import SandboxPool, SandboxUnavailable
from c2jax.envs.teachers.scripted_policies import Policy
from c2jax.eval.metrics import best_of_k, pass_at_k


@dataclasses.dataclass(frozen=True)
class Complementary:
  """One of CursorBench's complementary evaluations (report section 5) as a row of the evaluation table.

  Attributes:
    name: the row's name (and, for a suite of its own, the tasks' metadata "evaluation").
    score: the term averaged into the score; "passed" marks an evaluation that is a suite of its own: the score is
      the pass rate of the tasks tagged with `name`.
    detail: terms averaged beside it.
    measures: what the score means, in the table.
  """

  name: str
  score: str
  detail: tuple[str, ...]
  measures: str


COMPLEMENTARY = (
    Complementary("code_quality", "quality_findings", ("complexity_findings", "quality_error"),
                  "linter findings the diff introduced per episode, lower is better (EnvConfig.code_quality)"),
    Complementary("instruction_following", "instructions_followed", ("constraint_violations", "passed"),
                  "episodes that passed and kept every constraint the prompt stated"),
    Complementary("intent", "passed", ("pass_fraction",),
                  "under-specified tasks solved as their reasonable reading"),
    Complementary("interruption", "passed", ("interruption_delivered", "pass_fraction"),
                  "tasks whose user changed the request mid-work, solved as changed"),
)
# Averaged into the summary and the category rows too, where some episode has them.
COMPLEMENTARY_TERMS = ("quality_findings", "complexity_findings", "constraint_violations", "instructions_followed",
                       "interruption_delivered")


@dataclasses.dataclass(frozen=True)
class Episode:
  """One graded episode: the reward terms of `CodingEnv.reward` plus bookkeeping."""

  task_id: str
  category: str
  sample: int
  terms: dict
  turns: int
  seconds: float
  error: str | None = None
  evaluation: str = ""  # the complementary evaluation the task belongs to (its metadata "evaluation"), if any

  @property
  def passed(self) -> bool:
    return self.terms.get("passed", 0.0) >= 1.0


def run_episode(task: CodingTask, policy: Policy, sample: int, config: EnvConfig) -> Episode:
  """Plays one episode; a failure of the policy or the task is recorded (it scores 0), never raised.

  Raises:
    SandboxUnavailable: the host cannot sandbox code: that is no score of the policy, and every later episode
      would fail the same way.
  """
  t0 = time.perf_counter()
  env = CodingEnv(config)
  turns, error = 0, None
  try:
    observations = [env.reset(task)]
    done = False
    while not done:
      # A user interrupting this turn mid-way cuts it (`interruptions.cut_turn`), as the agent loop does a model's.
      result = env.step(interruptions.cut_turn(task, turns + 1, policy.act(task, observations)))
      turns += 1
      observations.append(result.observation)
      done = result.done
    terms = dict(env.reward())
  except SandboxUnavailable:
    raise
  except Exception as e:  # noqa: BLE001  (a broken policy scores 0; the run goes on)
    terms, error = {"passed": 0.0, "pass_fraction": 0.0}, f"{type(e).__name__}: {e}"
  finally:
    env.close()
  category = getattr(task.category, "value", str(task.category))
  return Episode(task_id=task.task_id, category=category, sample=sample, terms=terms, turns=turns,
                 seconds=time.perf_counter() - t0, error=error, evaluation=task.metadata.get("evaluation", ""))


@dataclasses.dataclass
class Report:
  """Episodes and their aggregates."""

  episodes: list[Episode]
  samples: int
  ks: tuple[int, ...]
  seconds: float
  workers: int

  def _by_task(self) -> dict[str, list[Episode]]:
    out = collections.defaultdict(list)
    for e in self.episodes:
      out[e.task_id].append(e)
    return out

  def _aggregate(self, episodes: Sequence[Episode]) -> dict:
    by_task = collections.defaultdict(list)
    for e in episodes:
      by_task[e.task_id].append(e)
    n = self.samples
    row = {"num_tasks": len(by_task)}
    for k in self.ks:
      row[f"pass@{k}"] = float(np.mean([pass_at_k(n, sum(e.passed for e in eps), k) for eps in by_task.values()]))
    row[f"best_of_{n}"] = float(np.mean([best_of_k([e.terms.get("pass_fraction", 0.0) for e in eps], n)
                                         for eps in by_task.values()]))
    for key in ("pass_fraction", "over_editing", "malformed_tool_calls", "lint_errors", "hack_attempts"):
      values = [e.terms[key] for e in episodes if key in e.terms]
      row[key] = float(np.mean(values)) if values else None
    for key in COMPLEMENTARY_TERMS:  # only where some episode was scored for it
      values = [e.terms[key] for e in episodes if key in e.terms]
      if values:
        row[key] = float(np.mean(values))
    row["errors"] = sum(e.error is not None for e in episodes)
    return row

  @property
  def summary(self) -> dict:
    row = self._aggregate(self.episodes)
    row.update(samples=self.samples, episodes=len(self.episodes), seconds=self.seconds, workers=self.workers,
               tasks_per_s=len(self.episodes) / self.seconds if self.seconds else None)
    return row

  def complementary(self) -> dict[str, dict]:
    """CursorBench's complementary evaluations present in the episodes (`COMPLEMENTARY`): name -> {"episodes",
    "score", and the terms behind it}. An evaluation is present when some episode carries its score's term, or
    (a suite's own evaluation: intent) when some task is tagged with it."""
    out = {}
    for c in COMPLEMENTARY:
      if c.score == "passed":  # the suite is the evaluation: its pass rate on the tasks tagged with its name
        episodes = [e for e in self.episodes if e.evaluation == c.name]
        values = [float(e.passed) for e in episodes]
      else:
        episodes = [e for e in self.episodes if c.score in e.terms]
        values = [e.terms[c.score] for e in episodes]
      if not episodes:
        continue
      row = {"episodes": len(episodes), "score": float(np.mean(values))}
      for key in c.detail:
        found = [e.terms[key] for e in episodes if key in e.terms]
        row[key] = float(np.mean(found)) if found else None
      out[c.name] = row
    return out

  def by_category(self) -> dict[str, dict]:
    cats = sorted({e.category for e in self.episodes})
    return {c: self._aggregate([e for e in self.episodes if e.category == c]) for c in cats}

  def markdown(self) -> str:
    """The per-category table and the per-task results."""
    k_cols = [f"pass@{k}" for k in self.ks] + [f"best_of_{self.samples}"]
    head = ["category", "tasks"] + k_cols + ["pass_fraction", "over_editing", "malformed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(v):
      return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))

    rows = list(self.by_category().items()) + [("all", self._aggregate(self.episodes))]
    for name, r in rows:
      cells = [name, str(r["num_tasks"])] + [fmt(r[c]) for c in k_cols] + [
          fmt(r["pass_fraction"]), fmt(r["over_editing"]), fmt(r["malformed_tool_calls"])]
      lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| task | category | passed | pass_fraction | over_editing | error |", "|---|---|---|---|---|---|"]
    for task_id, eps in sorted(self._by_task().items()):
      passed = sum(e.passed for e in eps)
      pf = np.mean([e.terms.get("pass_fraction", 0.0) for e in eps])
      oe = [e.terms["over_editing"] for e in eps if "over_editing" in e.terms]
      err = next((e.error for e in eps if e.error), "")
      lines.append(f"| {task_id} | {eps[0].category} | {passed}/{len(eps)} | {pf:.3f} | "
                   f"{fmt(float(np.mean(oe)) if oe else None)} | {err[:80]} |")
    complementary = self.complementary()
    if complementary:
      lines += ["", "| evaluation | episodes | score | measures |", "|---|---|---|---|"]
      for c in COMPLEMENTARY:
        if c.name in complementary:
          row = complementary[c.name]
          measures = c.measures + "".join(f"; {k} {fmt(row[k])}" for k in c.detail)
          lines.append(f"| {c.name} | {row['episodes']} | {fmt(row['score'])} | {measures} |")
    return "\n".join(lines)

  def to_json(self) -> dict:
    return {"summary": self.summary, "by_category": self.by_category(), "complementary": self.complementary(),
            "episodes": [dataclasses.asdict(e) for e in self.episodes]}

  def plot(self, path: str) -> None:
    """A bar chart of pass@k at the smallest k of `ks` and mean pass fraction per category."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cats = self.by_category()
    names = list(cats)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names) + 2), 3.2))
    k = min(self.ks)  # the k the report has (pass@1 unless ks leaves 1 out)
    ax.bar(x - 0.2, [cats[c][f"pass@{k}"] for c in names], 0.4, label=f"pass@{k}")
    ax.bar(x + 0.2, [cats[c]["pass_fraction"] or 0.0 for c in names], 0.4, label="mean pass fraction")
    ax.set_xticks(x, names)
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right")
    ax.set_title(f"{len(self._by_task())} tasks x {self.samples} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def evaluate(tasks: Sequence[CodingTask], make_policy: Callable[[int], Policy], *, samples: int = 1,
             workers: int = 2, config: EnvConfig = EnvConfig(), ks: Sequence[int] = (1,),
             progress: bool = True, label: str = "eval") -> Report:
  """Runs `samples` episodes of every task, `workers` at a time; `make_policy(episode index)` gives each episode
  its own policy (a model policy keeps per-episode state). `label`: the progress bar's (with `progress`).

  Raises:
    SandboxUnavailable: bubblewrap cannot run here (queued episodes are dropped, not run to the same end).
  """
  if not tasks:
    raise ValueError("No tasks to evaluate (empty suite or split).")
  ks = tuple(k for k in ks if k <= samples) or (1,)
  jobs = [(task, s) for task in tasks for s in range(samples)]
  t0 = time.perf_counter()
  with SandboxPool(workers) as pool:
    futures = [pool.submit(run_episode, task, make_policy(i), s, config) for i, (task, s) in enumerate(jobs)]
    if progress:
      import tqdm
      episodes = [f.result() for f in tqdm.tqdm(futures, desc=label, unit="episode")]
    else:
      episodes = [f.result() for f in futures]
  return Report(episodes=episodes, samples=samples, ks=ks, seconds=time.perf_counter() - t0, workers=workers)


def evaluate_model(tasks: Sequence[CodingTask], runner: AgentRunner, params, *, samples: int = 1,
                   config: EnvConfig = EnvConfig(), ks: Sequence[int] = (1,), seed: int = 0,
                   version: int = 0, label: str | None = "evaluate") -> Report:
  """Runs `samples` episodes of every task with the model `params` through `runner` (its slots are the episodes in
  flight, its tool workers the sandboxes); episode i draws with fold_in(key(seed), i).

  A task whose user interrupts a turn mid-way has that turn cut (`interruptions.turn_tokens`). The prompt of an
  episode is the first observation of a fresh copy (what `CodingEnv.reset` returns) in the runner's chat format
  (`ChatTokens.prompt`: BOS + the text for brief, the model's template otherwise), tokenized by the runner's
  tokenizer, the model's own; `config.chat_format` must be the runner's. `label`: the progress bar's over the
  episodes (None: no bar).
  """
  if not tasks:
    raise ValueError("No tasks to evaluate (empty suite or split).")
  if runner.chat.format.name != config.chat_format:
    raise ValueError(f"The environment speaks chat format {config.chat_format!r} but the runner "
                     f"{runner.chat.format.name!r}; make them one (AgentRunner(..., chat_format=...)).")
  ks = tuple(k for k in ks if k <= samples) or (1,)
  jobs = [(task, s) for task in tasks for s in range(samples)]
  texts = {id(task): first_observation(task, config, sorted(task.files)) for task, _ in jobs}
  episodes = [AgentEpisode(prompt=runner.chat.prompt(texts[id(task)]),
                           make_env=functools.partial(CodingAgentEnv, task, config),
                           key=jax.random.fold_in(jax.random.key(seed), i), first_observation=texts[id(task)],
                           turn_tokens=interruptions.turn_tokens(task, runner.agent.max_turn_tokens))
              for i, (task, _) in enumerate(jobs)]
  t0 = time.perf_counter()
  import tqdm
  # A bar over the episodes: a checkpoint's evaluation runs minutes to hours on a CPU (its first minutes compile).
  with tqdm.tqdm(total=len(episodes), desc=label, unit="episode", disable=label is None) as bar:
    start = runner.stats.episodes  # the runner's counts add up over its runs

    def progress():
      bar.update(runner.stats.episodes - start - bar.n)

    trajectories = runner.run(episodes, weights=lambda: (params, version), on_chunk=progress)
    progress()
  out = []
  for (task, s), traj in zip(jobs, trajectories):
    category = getattr(task.category, "value", str(task.category))
    out.append(Episode(task_id=task.task_id, category=category, sample=s, terms=dict(traj.reward_terms),
                       turns=traj.turns, seconds=traj.tool_seconds, evaluation=task.metadata.get("evaluation", "")))
  return Report(episodes=out, samples=samples, ks=ks, seconds=time.perf_counter() - t0,
                workers=runner.engine.slots)


def write_report(report: Report, directory: str) -> dict:
  """report.json, report.md and report.png under `directory`; returns the summary."""
  import os
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "report.json"), "w") as f:
    json.dump(report.to_json(), f, indent=1)
  with open(os.path.join(directory, "report.md"), "w") as f:
    f.write(report.markdown() + "\n")
  report.plot(os.path.join(directory, "report.png"))
  return report.summary
