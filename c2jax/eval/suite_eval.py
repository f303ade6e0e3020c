"""The evaluation service: a policy on a coding-task suite in sandboxes, as a job (report section 5). What
experiments/eval_main.py runs, with its run config (configs/eval_realistic.py) typed here.

  cfg = parse(config_dict)              # EvalRunConfig; an unknown key or a bad value raises one sentence
  summary = run(cfg, workdir)           # report.json, report.md, report.png in workdir; the summary dict
  watch(cfg, workdir)                   # every new version of a weight store, as it appears (until interrupted)

Policies: a scripted one (`c2jax.envs.teachers.scripted_policies.POLICIES`: reference must score 100%, empty 0%,
delete_tests must not pass), or `checkpoint`: a c2jax model from `checkpoint`, or from each new version of the weight
store `watch_weights`, run through the agent loop (`c2jax.eval.harness.evaluate_model`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Mapping

import ml_collections

from c2jax import typed_config
from c2jax.input_errors import MismatchedInput
from c2jax.envs.core.env import EnvConfig
from c2jax.model import presets
from c2jax.model.config import ModelConfig

CHECKPOINT = "checkpoint"  # the model policy; every other name is a scripted policy


@dataclasses.dataclass(frozen=True)
class EvalSamplingConfig:
  """`sampling`: how the model policy runs its episodes through the agent loop (`c2jax.actors.agent_loop`).

  Attributes:
    max_new_tokens, temperature: turns of at most this many tokens, sampled at this temperature.
    slots: episodes decoded together.
    context: positions of each slot (an episode that outgrows it ends, cut).
    max_episode_tokens: model tokens per episode.
  """

  max_new_tokens: int = 256
  temperature: float = 1.0
  slots: int = 4
  context: int = 4096
  max_episode_tokens: int = 2048


@dataclasses.dataclass(frozen=True)
class EvalRunConfig:
  """An evaluation run.

  Attributes:
    suite, split, max_tasks: the coding suite (`CODING_SUITES`), its split, the first this many tasks (0: all).
    suite_options: the coding suite's fields, e.g. {"heldout": "instances.jsonl"} for "swe" (SWE-bench-format
      instances, `c2jax.envs.tasks.swe_tasks`).
    policy: a scripted policy's name, or "checkpoint" (a model).
    samples: episodes per task (pass@k from n samples); ks: the k of pass@k.
    workers: episodes in flight (sandboxes).
    seed: the model policy's sampling seed.
    env: the episode's budgets and sandbox limits (`c2jax.envs.core.env.EnvConfig`).
    checkpoint: the model policy's c2jax checkpoint; or watch_weights: a weight store whose every new version is
      evaluated (polled every `watch_poll_s`), with the architecture `model` / `model_overrides`.
    watch_poll_s: seconds between looks for a new version of `watch_weights`.
    model / model_overrides: the architecture of the `watch_weights` versions (a `c2jax.model.presets` name and
      ModelConfig fields over it).
    sampling: how the model policy samples.
    tokenizer: the model policy's tokenizer: "byte", or a tokenizer.json / HF model directory (a converted
      model's own: `c2jax.data.tokenizer.make_tokenizer`). With env.chat_format "brief" its EOS ends a turn; a
      native format (the model's own: "deepseek_v3", "kimi_k2") renders prompts with the model's template, and its
      end-of-turn token ends a turn.
  """

  suite: str = "realistic"
  split: str = "heldout"
  max_tasks: int = 0
  suite_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  policy: str = "reference"
  samples: int = 1
  ks: tuple[int, ...] = (1,)
  workers: int = 2
  seed: int = 0
  env: EnvConfig = EnvConfig()
  checkpoint: str = ""
  watch_weights: str = ""
  watch_poll_s: float = 5.0
  model: str = "tiny"
  model_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sampling: EvalSamplingConfig = EvalSamplingConfig()
  tokenizer: str = "byte"

  def __post_init__(self):
    from c2jax.envs.tasks.coding_tasks import CODING_SUITES, check_split
    from c2jax.envs.teachers.scripted_policies import POLICIES
    import c2jax.envs.tasks.suites  # noqa: F401  (registers suites)
    CODING_SUITES.get(self.suite)
    object.__setattr__(self, "suite_options", dict(self.suite_options))
    check_split(self.split)
    if self.policy != CHECKPOINT and self.policy not in POLICIES:
      raise ValueError(f"policy={self.policy!r} is not {CHECKPOINT!r} or a scripted policy "
                       f"({', '.join(POLICIES.names())}).")
    if self.policy == CHECKPOINT and not (self.checkpoint or self.watch_weights):
      raise ValueError("policy=checkpoint needs checkpoint=DIR or watch_weights=URL.")
    if self.samples < 1 or self.workers < 1 or self.max_tasks < 0:
      raise ValueError(f"samples={self.samples} and workers={self.workers} must be >= 1, max_tasks="
                       f"{self.max_tasks} >= 0.")
    if not self.ks or not all(1 <= k <= self.samples for k in self.ks):
      raise ValueError(f"ks={self.ks} must be k in [1, samples={self.samples}].")
    presets.model_config(self.model, self.model_overrides)  # checks model / model_overrides now

  @property
  def model_config(self) -> ModelConfig:
    return presets.model_config(self.model, self.model_overrides)


def defaults() -> ml_collections.ConfigDict:
  """Every field of `EvalRunConfig` at its default, as a ConfigDict."""
  return typed_config.to_config_dict(EvalRunConfig())


def parse(c: Mapping[str, Any] | ml_collections.ConfigDict) -> EvalRunConfig:
  return typed_config.from_plain(EvalRunConfig(), c, "")


def _tasks(cfg: EvalRunConfig):
  from c2jax.envs.tasks.coding_tasks import CODING_SUITES
  tasks = CODING_SUITES.get(cfg.suite)(**cfg.suite_options).tasks(cfg.split)
  if not tasks:
    raise ValueError(f"Suite {cfg.suite!r} has no tasks in split {cfg.split!r}.")
  return tasks[:cfg.max_tasks] if cfg.max_tasks else tasks


def _label(cfg: EvalRunConfig) -> str:
  """The evaluation's progress bar label: what it evaluates, on which split."""
  return f"evaluate {cfg.suite} ({cfg.split})"


def _model_report(cfg: EvalRunConfig, tasks, params, model: ModelConfig, directory: str, version: int = 0) -> dict:
  """The model policy's report: every episode through the agent loop, with the run's tokenizer."""
  from c2jax.actors.agent_loop import AgentConfig, AgentRunner
  from c2jax.actors.engine import EngineConfig
  from c2jax.actors.sampling import SamplingConfig
  from c2jax.data.tokenizer import make_tokenizer
  from c2jax.eval import harness
  s = cfg.sampling
  tok = make_tokenizer(cfg.tokenizer)
  if tok.vocab_size > model.vocab_size:
    raise MismatchedInput(f"tokenizer={cfg.tokenizer!r} has {tok.vocab_size} tokens but the model only "
                          f"{model.vocab_size}; give the model's own tokenizer.")
  runner = AgentRunner(model, EngineConfig(slots=s.slots, context=s.context),
                       SamplingConfig(max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                                      stop_tokens=(tok.eos_id,)),
                       AgentConfig(max_turns=cfg.env.max_turns, max_turn_tokens=s.max_new_tokens,
                                   max_episode_tokens=s.max_episode_tokens, tool_workers=cfg.workers), tok,
                       chat_format=cfg.env.chat_format)
  label = _label(cfg) + (f" v{version}" if cfg.watch_weights else "")
  report = harness.evaluate_model(tasks, runner, params, samples=cfg.samples, config=cfg.env,
                                  ks=tuple(cfg.ks), seed=cfg.seed, version=version, label=label)
  summary = harness.write_report(report, directory)
  print(report.markdown())
  return summary


def _report(cfg: EvalRunConfig, tasks, make_policy, directory: str) -> dict:
  from c2jax.eval import harness
  report = harness.evaluate(tasks, make_policy, samples=cfg.samples, workers=cfg.workers, config=cfg.env,
                            ks=tuple(cfg.ks), label=_label(cfg))
  summary = harness.write_report(report, directory)
  print(report.markdown())
  return summary


def check_inputs(cfg: EvalRunConfig) -> None:
  """The paths a single evaluation of the model policy reads, checked (MissingInput, one sentence): before anything
  is built, read or written."""
  if cfg.policy == CHECKPOINT and not cfg.watch_weights:
    from c2jax.data.tokenizer import make_tokenizer
    from c2jax.model.checkpoint import check_checkpoint
    if not cfg.checkpoint:
      raise ValueError("policy=checkpoint without watch_weights needs checkpoint=DIR.")
    check_checkpoint(cfg.checkpoint, "checkpoint")
    make_tokenizer(cfg.tokenizer)


def run(cfg: EvalRunConfig, workdir: str) -> dict:
  """Evaluates the policy of `cfg` once; returns the summary (also in workdir/report.json)."""
  if cfg.policy == CHECKPOINT:
    import jax
    from c2jax.model.checkpoint import load_checkpoint
    # The paths first (MissingInput, one sentence), before the tasks are built and the params read.
    check_inputs(cfg)
    tasks = _tasks(cfg)
    params, model = load_checkpoint(cfg.checkpoint)
    summary = _model_report(cfg, tasks, jax.device_put(params), model, workdir)
  else:
    from c2jax.envs.teachers.scripted_policies import POLICIES
    policy_cls = POLICIES.get(cfg.policy)
    summary = _report(cfg, _tasks(cfg), lambda i: policy_cls(), workdir)
  summary.update(suite=cfg.suite, split=cfg.split, policy=cfg.policy)
  return summary


def watch(cfg: EvalRunConfig, workdir: str, stop: Callable[[], bool] = lambda: False) -> None:
  """The evaluator service: each new version of `cfg.watch_weights` evaluated into workdir/v<version>/, its summary
  appended to workdir/versions.jsonl and printed, until `stop`."""
  import jax
  from c2jax.rollouts.weight_store import WeightStore
  tasks, model, store = _tasks(cfg), cfg.model_config, WeightStore(cfg.watch_weights)
  version, params = None, None
  while not stop():
    got = store.update(version, params)
    if got is None:
      time.sleep(cfg.watch_poll_s)
      continue
    version, params = got
    summary = _model_report(cfg, tasks, jax.device_put(params), model, os.path.join(workdir, f"v{version:06d}"),
                            version=version)
    summary["version"] = version
    with open(os.path.join(workdir, "versions.jsonl"), "a") as f:
      f.write(json.dumps(summary) + "\n")
    print(json.dumps(summary), flush=True)
