"""The phases of continued pretraining (report section 3), read from a run config.

The report trains in three phases: bulk code at 32K tokens, a long-context extension to 256K, then a short SFT
on coding tasks, with the MTP layers trained by self-distillation in the last two. A run config lists them in
`phase_order` and describes each under `phases.<name>`:

  steps, seq_len, batch_size   how long the phase trains, on rows of which shape.
  rope                         overrides of the model's `RopeConfig` for this phase and after it (e.g. YaRN with
                               `factor` = the extension ratio); empty: unchanged.
  sources                      the data mix: {name: source dict} (`c2jax.data.pipeline`; `weight` mixes them).
  learning_rate, warmup_steps, decay, final_lr_fraction
                               the phase's own schedule: warmup from 0, then decay over the phase's steps.
  mtp_weight, mtp_target       the MTP loss (weight 0: MTP modules not trained), "labels" or "self_distill".

One AdamW state runs through all phases (its step count is global; each phase's schedule starts at its first
step), so a phase boundary is not a restart of the optimizer; the rope change makes the model's config differ
between phases, never its parameters.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from c2jax.model.config import ModelConfig, RopeLayout, RopeType
from c2jax.pretrain.step import Decay, MtpTarget, StepConfig

_OPTIM_FIELDS = ("weight_decay", "b1", "b2", "eps", "grad_clip", "z_loss_weight", "bias_update_rate")
_PHASE_FIELDS = ("steps", "seq_len", "batch_size", "rope", "sources", "learning_rate", "warmup_steps", "decay",
                 "final_lr_fraction", "mtp_weight", "mtp_target")


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


def _plain(x: Any) -> Any:
  if isinstance(x, ml_collections.ConfigDict):
    x = x.to_dict()
  if isinstance(x, Mapping):
    return {k: _plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_plain(v) for v in x]
  return x


def _enum(kind: type, value: Any, where: str):
  if isinstance(value, kind):
    return value
  try:
    return kind(str(value).lower())
  except ValueError:
    raise ValueError(f"{where}={value!r}: use one of {[m.value for m in kind]}.") from None


def apply_rope(model: ModelConfig, overrides: Mapping[str, Any], where: str) -> ModelConfig:
  """`model` with `overrides` applied to its RopeConfig (enum fields given by value, e.g. type="yarn")."""
  if not overrides:
    return model
  fields = {f.name for f in dataclasses.fields(model.rope)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"{where} has unknown fields {unknown}; RopeConfig fields: {sorted(fields)}.")
  values = dict(overrides)
  if "type" in values:
    values["type"] = _enum(RopeType, values["type"], f"{where}.type")
  if "layout" in values:
    values["layout"] = _enum(RopeLayout, values["layout"], f"{where}.layout")
  return model.replace(rope=dataclasses.replace(model.rope, **values))


def phases_from_config(c: ml_collections.ConfigDict, model: ModelConfig) -> list[Phase]:
  """Resolves `c.phase_order` / `c.phases` / `c.optim` into phases, checking every field once up front."""
  names = [n.strip() for n in str(c.phase_order).split(",") if n.strip()]
  if not names:
    raise ValueError("phase_order is empty: name at least one phase of `phases` (e.g. phase_order='bulk').")
  if len(set(names)) != len(names):
    raise ValueError(f"phase_order={c.phase_order!r} names a phase twice.")
  optim = _plain(c.optim)
  unknown = sorted(set(optim) - set(_OPTIM_FIELDS))
  if unknown:
    raise ValueError(f"optim has unknown fields {unknown}; it holds {list(_OPTIM_FIELDS)} (schedules are per phase).")
  phases, start = [], 0
  for index, name in enumerate(names):
    if name not in c.phases:
      raise ValueError(f"phase_order names {name!r} but `phases` has only {sorted(c.phases.keys())}.")
    p = _plain(c.phases[name])
    where = f"phases.{name}"
    unknown = sorted(set(p) - set(_PHASE_FIELDS))
    missing = sorted(set(_PHASE_FIELDS) - set(p))
    if unknown or missing:
      raise ValueError(f"{where}: unknown fields {unknown}, missing fields {missing}.")
    for key in ("steps", "seq_len", "batch_size"):
      if int(p[key]) < 1:
        raise ValueError(f"{where}.{key}={p[key]} must be >= 1.")
    if not p["sources"]:
      raise ValueError(f"{where}.sources is empty: give the phase at least one data source.")
    model = apply_rope(model, p["rope"] or {}, f"{where}.rope")
    if p["seq_len"] > model.max_position_embeddings:
      raise ValueError(f"{where}.seq_len={p['seq_len']} exceeds the model's max_position_embeddings="
                       f"{model.max_position_embeddings}.")
    hp = StepConfig(learning_rate=float(p["learning_rate"]), warmup_steps=int(p["warmup_steps"]),
                    total_steps=int(p["steps"]), final_lr_fraction=float(p["final_lr_fraction"]),
                    decay=_enum(Decay, p["decay"], f"{where}.decay"), schedule_offset=start,
                    mtp_weight=float(p["mtp_weight"]),
                    mtp_target=_enum(MtpTarget, p["mtp_target"], f"{where}.mtp_target"), **optim)
    if hp.mtp_weight > 0 and model.num_mtp_layers == 0:
      raise ValueError(f"{where}.mtp_weight={hp.mtp_weight} but the model has no MTP layers (num_mtp_layers=0); "
                       "set mtp_weight=0 or add MTP layers.")
    sources = tuple(dict(v) for v in p["sources"].values())
    phases.append(Phase(name=name, index=index, start=start, steps=int(p["steps"]), seq_len=int(p["seq_len"]),
                        batch_size=int(p["batch_size"]), model=model, hp=hp, sources=sources))
    start += int(p["steps"])
  return phases


def phase_at(phases: list[Phase], step: int) -> Phase | None:
  """The phase that trains global step `step` (0-based); None once every phase is done."""
  for p in phases:
    if step < p.end:
      return p
  return None
