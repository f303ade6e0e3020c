"""The SFT warm start of an RL run (report sections 3-4: a short SFT on coding tasks precedes RL), cached.

  checkpoint = sft_checkpoint(cfg)      # cfg: an RLRunConfig with an `sft` section (configs/rl_tiny.py)

The SFT is a one-phase run of the pretraining loop (`c2jax.services.pretrain_loop`) on the RL task suite's own
demonstrations (`c2jax.envs.teachers.demonstrations`: the prompt the actors sample from, the reference solution as the
answer), for the RL run's exact model. Its directory is named by a hash of everything that determines its result,
under `sft.cache_dir` ($C2JAX_CACHE_DIR or ~/.cache/c2jax when empty): a second RL run with the same SFT settings,
in any workdir, reuses the finished checkpoint, and an interrupted SFT resumes where it stopped.

The demonstrations are the `train` split's reference solutions: the tasks RL then trains on, so RL's training
reward after a warm start is inflated; only the held-out figures measure what RL adds.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os

from absl import logging
import numpy as np

from c2jax import typed_config
from c2jax.data import bpe
from c2jax.envs.teachers import demonstrations
from c2jax.envs.teachers import suite_tokenizer
from c2jax.optim import Decay
from c2jax.pretrain.step import MtpTarget
from c2jax.services.pretrain_run_config import CheckpointConfig, PhaseConfig, PretrainEvalConfig, PretrainRunConfig
from c2jax.services import teacher_traces
from c2jax.services.rl_run_config import RLRunConfig


def sft_config(cfg: RLRunConfig) -> PretrainRunConfig:
  """The pretraining run config of the SFT: one phase "sft" on the task's coding suite, the RL run's model."""
  s, task = cfg.sft, cfg.task
  if task["suite"] != "coding":
    raise ValueError(f"sft.enabled needs a coding task suite (task.suite='coding'), not {task['suite']!r}: the SFT "
                     "data are the coding suite's demonstrations.")
  if s.teacher.policy:  # recorded multi-turn episodes (c2jax/services/teacher_traces.py)
    source = {"kind": "token_docs", "path": teacher_traces.traces_path(cfg, "train")}
    eval_source = {"kind": "token_docs", "path": teacher_traces.traces_path(cfg, "heldout")}
  else:
    source, eval_source = _demonstrations_sources(cfg)
  every = max(s.steps // 4, 1)
  return PretrainRunConfig(
      model=cfg.model, model_overrides=dict(cfg.model_overrides), seed=cfg.seed, mesh=cfg.mesh,
      init_checkpoint=os.path.abspath(s.base_checkpoint) if s.base_checkpoint else "",
      # The RL prompts' tokenizer (c2jax/envs/coding_rl.py); "bpe:<n>" resolves to its (cached) file.
      tokenizer=suite_tokenizer.resolve(task["tokenizer"], task["coding_suite"]),
      phase_order="sft",
      phases={"sft": PhaseConfig(
          steps=s.steps, seq_len=s.seq_len, batch_size=s.batch_size, rope={}, sources={"tasks": source},
          learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, decay=Decay.COSINE, final_lr_fraction=0.1,
          mtp_weight=s.mtp_weight, mtp_target=MtpTarget.SELF_DISTILL)},
      # Held-out loss on the teacher's held-out tasks (the reference's own turns, not a flawed teacher's).
      eval=PretrainEvalConfig(every=every, batches=2, batch_size=s.batch_size, seq_len=s.seq_len,
                              source=eval_source),
      log_every=10, checkpoint=CheckpointConfig(every=every, keep=1))


def _demonstrations_sources(cfg: RLRunConfig) -> tuple[dict, dict]:
  """The SFT's train and held-out sources of the suite's single-turn demonstrations."""
  s, task = cfg.sft, cfg.task
  source = {"kind": "sft", "suite": task["coding_suite"], "split": "train", "weight": 1.0,
            "instructions": task["instructions"], "max_turns": task["max_turns"], "max_tokens": task["max_tokens"],
            # The SFT may see more of the suite than RL samples from (e.g. every difficulty, then RL on the easy
            # tasks): sft.suite_options when given, else the task's.
            "suite_options": dict(s.suite_options or task["suite_options"] or {}),
            # An imperfect teacher (c2jax/envs/teachers/demonstrations.py): `flawed` of every task's `copies` carry
            # `flaw`.
            "copies": s.teacher.copies, "flawed": s.teacher.flawed, "flaw": s.teacher.flaw}
  return source, {**source, "split": "heldout", "copies": 1, "flawed": 0}


def checkpoint_fingerprint(directory: str) -> str:
  """What an SFT from the base model at `directory` depends on: its architecture (model_config.json) and the values
  of its params, hashed. Content, not place or file times: a pretraining rerun in a fresh clone writes the same model
  elsewhere and reuses the SFT; a base saved again with other values is another SFT. The params are read once here,
  as the SFT reads them all anyway."""
  # jax-heavy; only for a base model
  import jax
  from c2jax.model import checkpoint
  from c2jax.model.config import config_to_json_dict
  checkpoint.check_checkpoint(directory, "sft.base_checkpoint")  # MissingInput, one sentence
  params, model = checkpoint.load_checkpoint(directory)
  h = hashlib.sha256(json.dumps(config_to_json_dict(model), sort_keys=True).encode())
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    h.update(jax.tree_util.keystr(path).encode())
    h.update(np.asarray(leaf).tobytes())
  return h.hexdigest()


def cache_dir(cfg: RLRunConfig, p: PretrainRunConfig) -> str:
  """<cache>/sft-<hash of the SFT run config and of the demonstrations' text>.

  The text is hashed too: a change to the prompt format, the suite's tasks or the reference policy makes a new SFT
  rather than reusing one trained on other prompts.
  """
  root = cfg.sft.cache_dir or bpe.default_cache_dir()
  # The base model by its content (`checkpoint_fingerprint`), not its path: the same SFT in any clone.
  plain = typed_config.to_plain(dataclasses.replace(p, init_checkpoint=""))
  h = hashlib.sha256(json.dumps(plain, sort_keys=True, default=str).encode())
  if p.tokenizer != "byte":  # a tokenizer file retrained under the same path is another SFT
    with open(p.tokenizer, "rb") as f:
      h.update(f.read())
  if p.init_checkpoint:
    h.update(checkpoint_fingerprint(p.init_checkpoint).encode())
  source = dict(p.phases["sft"].sources["tasks"])
  if cfg.sft.teacher.policy:  # the recorded traces themselves (recorded here on first use)
    for split in ("train", "heldout"):
      with open(teacher_traces.ensure_traces(cfg, split), "rb") as f:
        h.update(f.read())
    return os.path.join(os.path.abspath(root), f"sft-{h.hexdigest()[:16]}")
  for prompt, response in demonstrations.sft_examples(
      source["suite"], source["split"], max_turns=source["max_turns"], max_tokens=source["max_tokens"],
      instructions=source["instructions"], suite_options=dict(source["suite_options"]), copies=source["copies"],
      flawed=source["flawed"], flaw=source["flaw"]):
    h.update(prompt.encode())
    h.update(response.encode())
  return os.path.join(os.path.abspath(root), f"sft-{h.hexdigest()[:16]}")


def sft_checkpoint(cfg: RLRunConfig, stop=lambda: False, label: str = "SFT") -> str | None:
  """Trains (or resumes, or reuses) the SFT of `cfg` and returns its model checkpoint directory (None when `stop`
  interrupted it: the same call resumes it). `label`: the progress bar's (the caller's stage)."""
  from c2jax.services import pretrain_loop  # jax-heavy; only when SFT runs
  p = sft_config(cfg)
  workdir = cache_dir(cfg, p)
  checkpoint = os.path.join(workdir, "models", "sft")
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  # One process trains a given SFT; others with the same settings (parallel sweep cells on one host) wait for it and
  # reuse its checkpoint. Processes on other hosts see the same lock only when the cache is on a shared file system.
  with open(f"{workdir}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(os.path.join(checkpoint, "model_config.json")):
      logging.warning("SFT: reusing %s", checkpoint)
      return checkpoint
    logging.warning("SFT: training into %s (a later run with the same settings reuses it)", workdir)
    result = pretrain_loop.run(p, workdir, stop=stop, label=label)
  return None if result["interrupted"] else checkpoint
