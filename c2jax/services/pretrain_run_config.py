"""The continued-pretraining run config (configs/pretrain_tiny.py) as typed sections, and its phases resolved.

  c = defaults()                   # a ConfigDict of every field at its default: what configs/pretrain_*.py start from
  cfg = parse(c)                   # PretrainRunConfig; an unknown key or a bad value raises one sentence naming it
  for p in cfg.phases_resolved():  # Phase: its model (rope overrides applied), its StepConfig, its data mix
    ...

The report trains in three phases (section 3): bulk code at 32K tokens, a long-context extension to 256K, then a
short SFT on coding tasks, with the MTP layers trained by self-distillation in the last two. A run config lists
them in `phase_order` and describes each under `phases.<name>` (`PhaseConfig`: its steps and shape, rope, data
mix, schedule and MTP loss).

`optim` holds AdamW's settings shared by every phase (`AdamWConfig`), `step` the LM step's (`StepSettings`: z-loss,
balancing-bias rate). One AdamW state runs through all phases (its step count is global; each phase's schedule
starts at its first step), so a phase boundary is not a restart of the optimizer; the rope change makes the model's
config differ between phases, never its parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from c2jax import typed_config
from c2jax.model import presets
from c2jax.model.config import ModelConfig
from c2jax.optim import Decay, OptimizerConfig
from c2jax.parallel.mesh import MeshConfig
from c2jax.pretrain.step import MtpTarget, StepConfig


def _stdlib(split: str, **extra) -> dict:
  return {"kind": "stdlib", "split": split, "weight": 1.0, **extra}


@dataclasses.dataclass(frozen=True)
class PhaseConfig:
  """`phases.<name>`: one phase (see the module docstring).

  Attributes:
    steps, seq_len, batch_size: how long the phase trains, on rows of which shape.
    rope: overrides of the model's `RopeConfig` for this phase and after it (e.g. YaRN with `factor` = the extension
      ratio); empty: unchanged.
    sources: the data mix: {name: source dict} (`c2jax.data.sources`; `weight` mixes them).
    learning_rate, warmup_steps, decay, final_lr_fraction: the phase's own schedule: warmup from 0, then decay over
      the phase's steps.
    mtp_weight, mtp_target: the MTP loss (weight 0: MTP modules not trained), "labels" or "self_distill".
  """

  steps: int = 60
  seq_len: int = 128
  batch_size: int = 8
  rope: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  sources: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
  learning_rate: float = 3e-3
  warmup_steps: int = 10
  decay: Decay = Decay.COSINE
  final_lr_fraction: float = 0.1
  mtp_weight: float = 0.0
  mtp_target: MtpTarget = MtpTarget.LABELS

  def __post_init__(self):
    for key in ("steps", "seq_len", "batch_size"):
      if getattr(self, key) < 1:
        raise ValueError(f"{key}={getattr(self, key)} must be >= 1.")


@dataclasses.dataclass(frozen=True)
class AdamWConfig:
  """`optim`: AdamW's settings shared by every phase (the schedule is per phase: `PhaseConfig`).

  Attributes:
    weight_decay, b1, b2, eps: AdamW's decoupled weight decay, moment decays and epsilon.
    grad_clip: global-norm clipping (0 disables).
    lr_multipliers: {pattern: multiplier}: the parameters whose slash-joined path fully matches the regular expression
      (e.g. "(dense|moe)_layers/attn/(q_a|kv_a)", MLA's two down-projections into normed latents) train at
      `multiplier` x every phase's learning rate (`c2jax.optim.OptimizerConfig.lr_multipliers`); a pattern matching
      no trained parameter is refused. Empty: one rate for all.
  """

  weight_decay: float = 0.1
  b1: float = 0.9
  b2: float = 0.95
  eps: float = 1e-8
  grad_clip: float = 1.0
  lr_multipliers: tuple[tuple[str, float], ...] = ()


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """`step`: the LM step's settings shared by every phase (`c2jax.pretrain.step.StepConfig`).

  Attributes:
    z_loss_weight: weight of the z-loss (0 disables).
    bias_update_rate: u of the aux-loss-free balancing rule (0 disables).
  """

  z_loss_weight: float = 1e-4
  bias_update_rate: float = 1e-3


@dataclasses.dataclass(frozen=True)
class PretrainEvalConfig:
  """`eval`: held-out code perplexity on files no phase trains on, at one fixed shape so that phases compare.

  Attributes:
    every: steps between evaluations (and one at each phase's end).
    batches, batch_size, seq_len: how much, at which shape.
    source: the held-out data source.
  """

  every: int = 15
  batches: int = 4
  batch_size: int = 8
  seq_len: int = 128
  source: Mapping[str, Any] = dataclasses.field(default_factory=lambda: _stdlib("heldout"))


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """`checkpoint`: orbax checkpoints every `every` steps (and at each phase's end), `keep` of them kept.

  Attributes:
    every / keep: the train state's checkpoints (resuming).
    model_at: global steps (0: the start) at which to also write a model checkpoint `models/step_<N>`, with a
      held-out evaluation: the points of pretraining that a perplexity-vs-reward sweep starts RL from
      (tools/perplexity_vs_reward.py). Each phase's end writes `models/<phase>` either way.
  """

  every: int = 30
  keep: int = 2
  model_at: tuple[int, ...] = ()

  def __post_init__(self):
    if self.every < 1 or self.keep < 1:
      raise ValueError(f"every={self.every} and keep={self.keep} must be >= 1.")
    if any(s < 0 for s in self.model_at):
      raise ValueError(f"model_at={self.model_at} must hold steps >= 0.")


@dataclasses.dataclass(frozen=True)
class Phase:
  """One training phase, resolved.

  Attributes:
    name: its key under `phases`.
    index: its place in `phase_order`.
    start: the global step at which it begins (the sum of the earlier phases' steps).
    steps: how many steps it trains.
    seq_len / batch_size: T and B of its rows.
    model: the architecture it trains (the base model with every rope override so far applied).
    hp: its step hyperparameters (schedule offset = start).
    sources: the data mix, as plain dicts for `c2jax.data.pipeline.lm_dataset`.
  """

  name: str
  index: int
  start: int
  steps: int
  seq_len: int
  batch_size: int
  model: ModelConfig
  hp: StepConfig
  sources: tuple[dict, ...]

  @property
  def end(self) -> int:
    return self.start + self.steps


def _default_phases() -> dict[str, PhaseConfig]:
  return {"bulk": PhaseConfig(sources={"stdlib": _stdlib("train")})}


@dataclasses.dataclass(frozen=True)
class PretrainRunConfig:
  """A continued-pretraining run.

  Attributes:
    model / model_overrides: a `c2jax.model.presets` name and ModelConfig fields over it.
    tokenizer: "byte", the path of an HF tokenizer.json, or a coding suite's BPE "bpe:<V>[:<text>]" (with
      `tokenizer_suite`; `c2jax.envs.teachers.suite_tokenizer`, trained on first use and cached): the model's vocab_size
      must cover it. A suite's BPE lets pretraining, SFT and RL share one tokenizer and one model.
    tokenizer_suite: the coding suite of a "bpe:..." tokenizer (e.g. "tiny_compositions"); empty otherwise.
    init_checkpoint: a c2jax model checkpoint whose params start the first phase (continued pretraining of a base
      model, report section 3), with a fresh optimizer; its architecture must be the run's model (the rope may
      differ: each phase sets its own). Empty: a random init from `seed`.
    seed: the init and the data order.
    mesh: the device mesh, e.g. "fsdp:2,expert:2,context:2" (`c2jax.parallel.mesh`); empty: one device.
    phase_order: the phases to train, comma-separated keys of `phases`.
    log_every: steps between metrics.jsonl lines.
  """

  model: str = "tiny"
  model_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  tokenizer: str = "byte"
  tokenizer_suite: str = ""
  init_checkpoint: str = ""
  seed: int = 0
  mesh: str = ""
  phase_order: str = "bulk"
  phases: Mapping[str, PhaseConfig] = dataclasses.field(default_factory=_default_phases)
  optim: AdamWConfig = AdamWConfig()
  step: StepSettings = StepSettings()
  eval: PretrainEvalConfig = PretrainEvalConfig()
  log_every: int = 5
  checkpoint: CheckpointConfig = CheckpointConfig()

  def __post_init__(self):
    if self.mesh:
      try:
        MeshConfig.parse(self.mesh)
      except ValueError as e:
        raise ValueError(f"mesh={self.mesh!r}: {e}") from None
    if self.log_every < 1:
      raise ValueError(f"log_every={self.log_every} must be >= 1.")
    if self.tokenizer.startswith("bpe:") and not self.tokenizer_suite:
      raise ValueError(f"tokenizer={self.tokenizer!r} is a coding suite's BPE: name the suite in tokenizer_suite "
                       "(e.g. tokenizer_suite='tiny_compositions').")
    phases = self.phases_resolved()  # every phase's model, schedule and MTP setting, checked now
    past = [s for s in self.checkpoint.model_at if s > phases[-1].end]
    if past:
      raise ValueError(f"checkpoint.model_at={self.checkpoint.model_at} names steps {past} after the last phase's end "
                       f"(step {phases[-1].end}).")

  @property
  def model_config(self) -> ModelConfig:
    """The architecture before any phase's rope override."""
    return presets.model_config(self.model, self.model_overrides)

  @property
  def phase_names(self) -> list[str]:
    return [n.strip() for n in self.phase_order.split(",") if n.strip()]

  def phases_resolved(self) -> list[Phase]:
    """The phases of `phase_order`, in order, with their global step ranges, models and step configs."""
    names = self.phase_names
    if not names:
      raise ValueError("phase_order is empty: name at least one phase of `phases` (e.g. phase_order='bulk').")
    if len(set(names)) != len(names):
      raise ValueError(f"phase_order={self.phase_order!r} names a phase twice.")
    model, phases, start = self.model_config, [], 0
    for index, name in enumerate(names):
      if name not in self.phases:
        raise ValueError(f"phase_order names {name!r} but `phases` has only {sorted(self.phases)}.")
      p, where = self.phases[name], f"phases.{name}"
      if not p.sources:
        raise ValueError(f"{where}.sources is empty: give the phase at least one data source.")
      model = model.replace(rope=typed_config.from_plain(model.rope, p.rope, f"{where}.rope"))
      if p.seq_len > model.max_position_embeddings:
        raise ValueError(f"{where}.seq_len={p.seq_len} exceeds the model's max_position_embeddings="
                         f"{model.max_position_embeddings}.")
      if p.mtp_weight > 0 and model.num_mtp_layers == 0:
        raise ValueError(f"{where}.mtp_weight={p.mtp_weight} but the model has no MTP layers (num_mtp_layers=0); "
                         "set mtp_weight=0 or add MTP layers.")
      optim = OptimizerConfig(learning_rate=p.learning_rate, warmup_steps=p.warmup_steps, total_steps=p.steps,
                              final_lr_fraction=p.final_lr_fraction, decay=p.decay, schedule_offset=start,
                              **dataclasses.asdict(self.optim))
      hp = StepConfig(optim=optim, mtp_weight=p.mtp_weight, mtp_target=p.mtp_target,
                      **dataclasses.asdict(self.step))
      phases.append(Phase(name=name, index=index, start=start, steps=p.steps, seq_len=p.seq_len,
                          batch_size=p.batch_size, model=model, hp=hp,
                          sources=tuple(dict(v) for v in p.sources.values())))
      start += p.steps
    return phases


def phase_at(phases: list[Phase], step: int) -> Phase | None:
  """The phase that trains global step `step` (0-based); None once every phase is done."""
  for p in phases:
    if step < p.end:
      return p
  return None


def defaults() -> ml_collections.ConfigDict:
  """Every field of `PretrainRunConfig` at its default, as a ConfigDict."""
  return typed_config.to_config_dict(PretrainRunConfig())


def parse(c: Mapping[str, Any] | ml_collections.ConfigDict) -> PretrainRunConfig:
  """The typed run config of `c` (a ConfigDict or plain dict; fields it leaves out take their defaults)."""
  return typed_config.from_plain(PretrainRunConfig(), c, "")
