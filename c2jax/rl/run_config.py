"""Reading an RL run config (`configs/rl_tiny.py` and its overrides) into the typed pieces the processes use.

The trainer (`experiments/rl_main.py`), the actors and the evaluator (`experiments/actor_main.py`) all read the same
run config, so they agree on the model, the buffer's row layout and the sampling temperature. The trainer also
stores it in the buffer (`run_config.json`), so an external actor needs only the two URLs.
"""

from __future__ import annotations

import enum
import json
import os

import ml_collections

from c2jax.actors.actor import ActorConfig, WeightUpdates
from c2jax.envs.tasks import TASK_SUITES, TaskSuite
from c2jax.model.config import ModelConfig
from c2jax.pretrain.loop import model_config_from
from c2jax.rl.config import RLConfig, from_config_dict

RUN_CONFIG_KEY = "run_config.json"  # in the buffer's root


class Schedule(enum.Enum):
  """ASYNC: actors keep sampling while the trainer updates (admission budget `actors.max_lag`, in-flight weight
  updates); SYNC: every group is sampled entirely by the weights that will train on it (max_lag 0, weights only
  between sampler calls): on-policy RL, for comparison."""

  ASYNC = "async"
  SYNC = "sync"


def schedule(c: ml_collections.ConfigDict) -> Schedule:
  try:
    return Schedule(str(c.schedule).lower())
  except ValueError:
    raise ValueError(f"schedule={c.schedule!r} is not one of {', '.join(s.value for s in Schedule)}.") from None


def model_config(c: ml_collections.ConfigDict) -> ModelConfig:
  return model_config_from(c)


def rl_config(c: ml_collections.ConfigDict) -> RLConfig:
  cfg = from_config_dict(c.rl, model_config(c))
  if abs(cfg.sampling_temperature - c.actors.temperature) > 1e-12:
    raise ValueError(f"rl.sampling_temperature={cfg.sampling_temperature} differs from actors.temperature="
                     f"{c.actors.temperature}: the trainer must score the distribution the actors sample from.")
  return cfg


def actor_config(c: ml_collections.ConfigDict) -> ActorConfig:
  """The actors' settings; `schedule=sync` forces max_lag 0 and weights only between calls."""
  a = c.actors
  sync = schedule(c) is Schedule.SYNC
  try:
    updates = WeightUpdates(str(a.weight_updates).lower())
  except ValueError:
    raise ValueError(f"actors.weight_updates={a.weight_updates!r} is not one of "
                     f"{', '.join(w.value for w in WeightUpdates)}.") from None
  return ActorConfig(group_size=a.group_size, groups_per_call=a.groups_per_call, prompt_len=a.prompt_len,
                     max_new_tokens=a.max_new_tokens, temperature=a.temperature, chunk_steps=a.chunk_steps,
                     max_lag=0 if sync else a.max_lag,
                     weight_updates=WeightUpdates.BETWEEN_CALLS if sync else updates, split="train",
                     seed=c.seed, poll_interval_s=a.poll_interval_s, stop_tokens=tuple(a.stop_tokens),
                     pending_lease_s=a.get("pending_lease_s", 120.0),
                     admission_recheck_s=a.get("admission_recheck_s", 1.0))


def task_suite(c: ml_collections.ConfigDict) -> TaskSuite:
  import c2jax.envs  # noqa: F401  (registers the built-in suites)
  kwargs = dict(c.task)
  name = kwargs.pop("suite")
  return TASK_SUITES.get(name)(**kwargs)


def best_of(c: ml_collections.ConfigDict) -> int:
  """K of the held-out best-of-K: `eval.best_of` (estimated from `eval.samples` >= K samples per task), or, when
  the config has none, `eval.samples` itself."""
  k = int(c.eval.get("best_of", 0) or c.eval.samples)
  if not 1 <= k <= c.eval.samples:
    raise ValueError(f"eval.best_of={k} must lie in [1, eval.samples={c.eval.samples}].")
  return k


def urls(c: ml_collections.ConfigDict, workdir: str) -> tuple[str, str]:
  """(buffer URL, weights URL): the config's, or `<workdir>/buffer` and `<workdir>/weights`."""
  return (c.buffer or os.path.join(workdir, "buffer"), c.weights or os.path.join(workdir, "weights"))


def to_json(c: ml_collections.ConfigDict) -> str:
  return json.dumps(c.to_dict(), sort_keys=True)


def from_json(text: str) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(json.loads(text))
