"""The RL run config (configs/rl_tiny.py and its overrides) as typed sections, read by one converter.

  c = defaults()                  # a ConfigDict of every field at its default: what configs/rl_*.py start from
  cfg = parse(c)                  # RLRunConfig; an unknown key or a bad value raises one sentence naming it
  cfg.rl, cfg.actor_config, cfg.task_suite()      # what the trainer, the actors and the evaluator use
  text = to_json(cfg); from_json(text) == cfg     # what the trainer stores in the buffer for external actors

Defaults are the dataclasses' (`c2jax.typed_config`), so a run config names only what it chooses, and every field is
a command-line override (`--config.trainer.steps=80`, `--config.rl.advantage=grpo`). The trainer
(`c2jax.services.rl_loop`), the actors and the evaluator (`c2jax.services.actor_process`) read the same run config,
so they agree on the model, the buffer's row layout and the sampling temperature; the trainer also stores it in
the buffer (`RUN_CONFIG_KEY`), so an external actor needs only the two URLs.

Sections (report sections 4 and 6):
  model, model_overrides   a preset of `c2jax.model.presets` and ModelConfig fields over it
  rl                       the update's recipe (`c2jax.rl.config.RLConfig`; its architecture is the model above)
  task                     the task suite: {"suite": a `TASK_SUITES` name, ...that suite's fields}
  sft                      the SFT warm start before RL (`c2jax.services.warm_start`)
  actors                   how each actor samples (`c2jax.actors.actor.ActorConfig`) and how many run where
  trainer                  the trainer loop's steps, batch, checkpoints and waits
  weight_store             how versions are stored (`c2jax.rollouts.weight_store.WeightStoreConfig`)
  eval                     held-out evaluation before, during and after training
  env_service              where the episodes' environments run (`c2jax.envs.service.config.EnvServiceConfig`):
                           in the actors' processes (the default), on environment servers at `servers`, and/or on
                           `local` servers the job starts on this machine (docs/design/env_service.md)
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
from typing import Any, Mapping

import ml_collections

from c2jax import typed_config
from c2jax.actors import placement
from c2jax.actors.actor import ActorConfig, EpisodeKind, WeightUpdates
from c2jax.actors.agent_loop import SummaryConfig
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.envs.token_tasks import suite as tasks_lib
from c2jax.envs.token_tasks.suite import TASK_SUITES, TokenTaskSuite
from c2jax.model import presets
from c2jax.model.config import ModelConfig
from c2jax.parallel.mesh import MeshConfig
from c2jax.rl.config import RLConfig
from c2jax.rl.packing import RowLayout
from c2jax.rollouts.weight_store import WeightStoreConfig

RUN_CONFIG_KEY = "run_config.json"  # in the buffer's root


class Schedule(enum.Enum):
  """ASYNC: actors keep sampling while the trainer updates (admission budget `actors.max_lag`, in-flight weight
  updates); SYNC: every group is sampled entirely by the weights that will train on it (max_lag 0, weights only
  between sampler calls): on-policy RL, for comparison."""

  ASYNC = "async"
  SYNC = "sync"


@dataclasses.dataclass(frozen=True)
class ActorsConfig(ActorConfig):
  """`actors`: how each actor samples (the fields of `ActorConfig`; an actor's seed is the run's `seed` and it
  samples the train split) and how many actors run where.

  Attributes:
    num: local actor processes the trainer job starts.
    external: start none; actors run elsewhere against the same URLs.
    cpus: Linux cpu-list ("2-3") the local actors and the evaluator are pinned to; empty: no pinning.
  """

  split: str = dataclasses.field(default="train", metadata={typed_config.PLAIN: False})
  seed: int = dataclasses.field(default=0, metadata={typed_config.PLAIN: False})
  num: int = 2
  external: bool = False
  cpus: str = ""

  def __post_init__(self):
    super().__post_init__()
    if self.num < 0:
      raise ValueError(f"num={self.num} must be >= 0.")
    placement.parse_cpus(self.cpus)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """`trainer`: the RL trainer loop.

  Attributes:
    steps: updates to train.
    groups_per_step: committed groups (of `actors.group_size` rows) per update.
    checkpoint_every: steps between orbax checkpoints (and one at the end).
    keep_checkpoints: checkpoints kept.
    take_timeout_s: fail when no batch arrives for this long.
    poll_interval_s: how often the trainer looks for newly committed groups while it waits.
    cpus: Linux cpu-list ("0-1") the trainer is pinned to after the SFT (`c2jax.actors.placement`); empty: none.
    rows: PACKED (the default: whole sequences first-fit into fewer rows, `c2jax.rl.packing`; the same update to
      float tolerance, less padding to compute) or PADDED (a row per sequence).
    packed_rows: PACKED only: the row count a batch is packed into; a batch that needs more takes the next of
      packed_rows x 2, x 4, ... and finally the padded row count (each a shape compiled once). 0: half the padded
      rows. With rl.micro_batches > 1 it must divide into them.
  """

  steps: int = 40
  groups_per_step: int = 4
  checkpoint_every: int = 10
  keep_checkpoints: int = 2
  take_timeout_s: float = 900.0
  poll_interval_s: float = 0.02
  cpus: str = ""
  rows: RowLayout = RowLayout.PACKED
  packed_rows: int = 0

  def __post_init__(self):
    if self.packed_rows < 0:
      raise ValueError(f"packed_rows={self.packed_rows} must be >= 0 (0: half the padded rows).")
    for name in ("steps", "groups_per_step", "checkpoint_every", "keep_checkpoints"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1.")
    if not (self.take_timeout_s > 0 and self.poll_interval_s > 0):
      raise ValueError(f"take_timeout_s={self.take_timeout_s} and poll_interval_s={self.poll_interval_s} must be "
                       "> 0.")
    placement.parse_cpus(self.cpus)


@dataclasses.dataclass(frozen=True)
class TeacherConfig:
  """`sft.teacher`: who demonstrates.

  Attributes:
    copies, flawed, flaw: every train task is demonstrated `copies` times, and an imperfect teacher's `flawed` of
      them carry the flaw `flaw`; flawed=0 is a perfect teacher. With the single-turn demonstrations
      (`c2jax.envs.teachers.demonstrations`) `flaw` is a `FLAWS` name; with `policy`, the name of the scripted policy
      that records the flawed copies (e.g. "spec_unverified": finishes without verifying, and half of its writes are
      wrong).
    policy: a scripted policy (`c2jax.envs.teachers.scripted_policies.POLICIES`) whose multi-turn episodes, recorded
      through the agent loop with the run's actor settings (self-summaries included), are the demonstrations instead
      (`c2jax.services.teacher_traces`); empty: the single-turn ones.
    max_tasks: record the first this many train tasks (0: all).
    heldout_tasks: record the first this many held-out tasks (0: all): they give the SFT's held-out loss only.
    summary: the self-summaries of the recorded episodes (the teacher's own, not `actors.summary`: an ablation of
      the RL run's summaries starts from the same SFT).
  """

  copies: int = 1
  flawed: int = 0
  flaw: str = "incomplete_call"
  policy: str = ""
  max_tasks: int = 0
  heldout_tasks: int = 64
  summary: SummaryConfig = SummaryConfig()

  def __post_init__(self):
    from c2jax.envs.teachers.demonstrations import FLAWS  # imports the suites
    from c2jax.envs.teachers.scripted_policies import POLICIES
    if self.copies < 1 or not 0 <= self.flawed <= self.copies:
      raise ValueError(f"copies={self.copies} must be >= 1 and flawed={self.flawed} in [0, copies].")
    if self.policy:
      POLICIES.get(self.policy)
      if self.flawed:
        POLICIES.get(self.flaw)  # a multi-turn teacher's flaw is a policy
    else:
      FLAWS.get(self.flaw)
    if self.max_tasks < 0 or self.heldout_tasks < 0:
      raise ValueError(f"max_tasks={self.max_tasks} and heldout_tasks={self.heldout_tasks} must be >= 0 (0: every "
                       "task).")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
  """`sft`: the SFT warm start on the task suite's train-split demonstrations, cached by its settings
  (`c2jax.services.warm_start`); skipped when `init_checkpoint` is set.

  Attributes:
    enabled: run it (needs task.suite="coding").
    cache_dir: where finished SFTs are kept ($C2JAX_CACHE_DIR or ~/.cache/c2jax when empty).
    steps, seq_len, batch_size, learning_rate, warmup_steps: the one phase's shape and schedule (cosine to 0.1x).
    mtp_weight: the MTP self-distillation weight (0: MTP modules untrained).
    suite_options: the SFT's own selection of the coding suite's tasks (empty: the task's `suite_options`).
    teacher: the demonstrations' teacher.
    base_checkpoint: a c2jax model checkpoint the SFT starts from (a pretraining run's `models/<phase>` or
      `models/step_<N>` on the task's tokenizer: one model through pretraining, SFT and RL, report section 3);
      empty: a random init. Part of the SFT's cache key, with the checkpoint's files.
  """

  enabled: bool = True
  cache_dir: str = ""
  steps: int = 300
  seq_len: int = 512
  batch_size: int = 8
  learning_rate: float = 3e-3
  warmup_steps: int = 20
  mtp_weight: float = 0.0
  suite_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  teacher: TeacherConfig = TeacherConfig()
  base_checkpoint: str = ""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """`eval`: held-out evaluation, in the trainer before and after training, and by an evaluator process during it.

  Attributes:
    tasks: held-out tasks evaluated.
    samples: samples per task (pass@k and best-of-K are estimated from them: `c2jax.eval.metrics`).
    best_of: K of the held-out best-of-K (0: `samples`); must lie in [1, samples].
    every_versions: the evaluator process evaluates every this many published versions.
    process: run the evaluator process beside the actors.
  """

  tasks: int = 35
  samples: int = 16
  best_of: int = 8
  every_versions: int = 20
  process: bool = True

  def __post_init__(self):
    if self.tasks < 1 or self.samples < 1 or self.every_versions < 1:
      raise ValueError(f"tasks={self.tasks}, samples={self.samples} and every_versions={self.every_versions} must "
                       "be >= 1.")
    if not 1 <= self.k <= self.samples:
      raise ValueError(f"best_of={self.best_of} must lie in [1, samples={self.samples}] (0: samples).")

  @property
  def k(self) -> int:
    """K of the held-out best-of-K."""
    return self.best_of or self.samples


def _default_rl() -> RLConfig:
  # The architecture is replaced by the run's own model in `RLRunConfig.__post_init__`.
  return RLConfig(model=presets.tiny())


@dataclasses.dataclass(frozen=True)
class RLRunConfig:
  """An RL run (see the module docstring for the sections).

  Attributes:
    model: a `c2jax.model.presets` name; model_overrides: ModelConfig fields over it.
    init_checkpoint: a c2jax model checkpoint (pretraining / SFT) to start from; empty: the SFT warm start, or a
      random init when `sft.enabled` is False.
    seed: seeds the init, the actors' task draws and sampling, and the evaluation.
    mesh: the trainer's device mesh, e.g. "fsdp:2,expert:2" (`c2jax.parallel.mesh`); empty: one device.
    compilation_cache: directory of compiled programs (empty: $JAX_COMPILATION_CACHE_DIR if set, else the user's
      cache: `c2jax.services.compile_cache`), reused on restart and by later runs of the same programs.
    schedule: ASYNC or SYNC.
    task: the task suite: {"suite": a `TASK_SUITES` name, ...that suite's fields}.
    buffer, weights: storage URLs (paths, s3://, gs://); empty: <workdir>/buffer and <workdir>/weights.
    env_service: where the episodes' environments run (in-process by default; multi-turn episodes only).
  """

  model: str = "tiny"
  model_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  init_checkpoint: str = ""
  seed: int = 0
  mesh: str = ""
  compilation_cache: str = ""
  schedule: Schedule = Schedule.ASYNC
  rl: RLConfig = dataclasses.field(default_factory=_default_rl)
  task: Mapping[str, Any] = dataclasses.field(default_factory=lambda: {"suite": "coding"})
  sft: SFTConfig = SFTConfig()
  actors: ActorsConfig = ActorsConfig()
  trainer: TrainerConfig = TrainerConfig()
  buffer: str = ""
  weights: str = ""
  weight_store: WeightStoreConfig = WeightStoreConfig()
  eval: EvalConfig = EvalConfig()
  env_service: EnvServiceConfig = EnvServiceConfig()

  def __post_init__(self):
    model = presets.model_config(self.model, self.model_overrides)
    # The recipe trains the run's architecture (rl.model is not a key of its own: typed_config.PLAIN).
    object.__setattr__(self, "rl", dataclasses.replace(self.rl, model=model))
    object.__setattr__(self, "task", _resolved_task(self.task))
    if self.mesh:
      try:
        MeshConfig.parse(self.mesh)
      except ValueError as e:
        raise ValueError(f"mesh={self.mesh!r}: {e}") from None
    if abs(self.rl.sampling_temperature - self.actors.temperature) > 1e-12:
      raise ValueError(f"rl.sampling_temperature={self.rl.sampling_temperature} differs from actors.temperature="
                       f"{self.actors.temperature}: the trainer must score the distribution the actors sample from.")
    if (self.actors.episodes is EpisodeKind.MULTI_TURN and "max_turns" in self.task
        and self.task["max_turns"] != self.actors.max_turns):
      raise ValueError(f"actors.max_turns={self.actors.max_turns} differs from task.max_turns="
                       f"{self.task['max_turns']}: the environment's budget line must state the turns the agent has.")
    reported = tasks_lib.reward_terms(_suite_class(self.task["suite"]))
    unreported = [name for name, w in self.rl.reward.weights if w and name not in reported]
    if unreported:
      raise ValueError(f"rl.reward.weights weights {', '.join(map(repr, unreported))}, which task suite "
                       f"{self.task['suite']!r} does not report (it reports {', '.join(reported)}): give them "
                       "weight 0.")
    if self.env_service.remote and self.actors.episodes is not EpisodeKind.MULTI_TURN:
      raise ValueError("env_service: environment servers run multi-turn episodes (actors.episodes=multi_turn); a "
                       "single-turn run grades its samples in the actor.")
    if self.sft.enabled and not self.init_checkpoint and self.task["suite"] != "coding":
      raise ValueError(f"sft.enabled needs a coding task suite (task.suite='coding'), not {self.task['suite']!r}: "
                       "the SFT data are the coding suite's demonstrations; set sft.enabled=False.")

  @property
  def model_config(self) -> ModelConfig:
    return self.rl.model

  @property
  def actor_config(self) -> ActorConfig:
    """What each actor process runs; `schedule=sync` forces max_lag 0 and weights only between calls."""
    fields = {f.name: getattr(self.actors, f.name) for f in dataclasses.fields(ActorConfig)}
    fields.update(seed=self.seed, split="train")
    if self.schedule is Schedule.SYNC:
      fields.update(max_lag=0, weight_updates=WeightUpdates.BETWEEN_CALLS)
    return ActorConfig(**fields)

  def task_suite(self) -> TokenTaskSuite:
    options = dict(self.task)
    return typed_config.from_plain(_suite_class(options.pop("suite"))(), options, "task")

  @property
  def eval_pass_k(self) -> tuple[int, ...]:
    """The k of the held-out pass@k / best-of-k: the recipe's `pass_k` and `eval.best_of`."""
    return tuple(sorted(set(self.rl.pass_k) | {self.eval.k}))

  @property
  def eval_sampling(self) -> SamplingConfig:
    """Held-out samples are drawn as the actors draw."""
    return SamplingConfig(max_new_tokens=self.actors.max_new_tokens, temperature=self.actors.temperature,
                          stop_tokens=self.actors.stop_tokens)

  def urls(self, workdir: str) -> tuple[str, str]:
    """(buffer URL, weights URL): the config's, or `<workdir>/buffer` and `<workdir>/weights`."""
    return (self.buffer or os.path.join(workdir, "buffer"), self.weights or os.path.join(workdir, "weights"))


def _suite_class(name: str) -> type:
  import c2jax.envs  # noqa: F401  (registers the built-in suites)
  return TASK_SUITES.get(name)


def _resolved_task(task: Mapping[str, Any]) -> dict[str, Any]:
  """The task section with every field of its suite: {"suite": name, field: value, ...}."""
  options = dict(task)
  if "suite" not in options:
    raise ValueError(f"task needs a suite name; known: {', '.join(TASK_SUITES.names())}.")
  name = options.pop("suite")
  suite = typed_config.from_plain(_suite_class(name)(), options, "task")
  return {"suite": name, **typed_config.to_plain(suite)}


def task_defaults(suite: str, **fields) -> ml_collections.ConfigDict:
  """A task section with every field of `suite` at its default, then `fields`: what a config file assigns to
  `c.task` (so that each of the suite's fields is a command-line override)."""
  return typed_config.to_config_dict(_resolved_task({"suite": suite, **fields}))


def defaults() -> ml_collections.ConfigDict:
  """Every field of `RLRunConfig` at its default, as a ConfigDict."""
  return typed_config.to_config_dict(RLRunConfig())


def parse(c: Mapping[str, Any] | ml_collections.ConfigDict) -> RLRunConfig:
  """The typed run config of `c` (a ConfigDict or plain dict; fields it leaves out take their defaults)."""
  return typed_config.from_plain(RLRunConfig(), c, "")


def to_json(cfg: RLRunConfig) -> str:
  return json.dumps(typed_config.to_plain(cfg), sort_keys=True)


def from_json(text: str) -> RLRunConfig:
  return parse(json.loads(text))
