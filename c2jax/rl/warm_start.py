"""The SFT warm start of an RL run (report sections 3-4: a short SFT on coding tasks precedes RL), cached.

  checkpoint = sft_checkpoint(c)      # c: an RL run config with an `sft` block (configs/rl_tiny.py)

The SFT is a one-phase run of the pretraining loop (`c2jax.pretrain.loop`) on the RL task suite's own
demonstrations (`c2jax.data.sft`: the prompt the actors sample from, the reference solution as the answer), for
the RL run's exact model. Its directory is named by a hash of everything that determines its result, under
`c.sft.cache_dir` ($C2JAX_CACHE_DIR or ~/.cache/c2jax when empty): a second RL run with the same SFT settings,
in any workdir, reuses the finished checkpoint, and an interrupted SFT resumes where it stopped.

The demonstrations are the `train` split's reference solutions: the tasks RL then trains on, so RL's training
reward after a warm start is inflated; only the held-out figures measure what RL adds.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os

from absl import logging
import ml_collections

from c2jax.data import bpe
from configs import pretrain_tiny


def sft_config(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The pretraining run config of the SFT: one phase "sft" on `c.task`'s coding suite, the RL run's model."""
  s = c.sft
  if c.task.suite != "coding":
    raise ValueError(f"sft.enabled needs a coding task suite (task.suite='coding'), not {c.task.suite!r}: the SFT "
                     "data are the coding suite's demonstrations.")
  p = pretrain_tiny.get_config()
  p.model = c.model
  p.model_overrides = ml_collections.ConfigDict(dict(c.model_overrides))
  p.seed = c.seed
  p.mesh = c.mesh
  # The RL prompts' tokenizer (c2jax/envs/coding_rl.py); "bpe:<n>" resolves to its (cached) file.
  p.tokenizer = bpe.resolve(c.task.get("tokenizer", "byte"), c.task.get("coding_suite", "tiny_functions"))
  p.phase_order = "sft"
  source = {"kind": "sft", "suite": c.task.get("coding_suite", "tiny_functions"), "split": "train", "weight": 1.0,
            "instructions": c.task.get("instructions", "brief"), "max_turns": c.task.get("max_turns", 8),
            "max_tokens": c.task.get("max_tokens", 8192),
            # The SFT may see more of the suite than RL samples from (e.g. every difficulty, then RL on the easy
            # tasks): sft.suite_options when given, else the task's.
            "suite_options": dict(s.get("suite_options", None) or c.task.get("suite_options", None) or {}),
            # An imperfect teacher (c2jax/data/sft.py): `flawed` of every task's `copies` demonstrations carry `flaw`.
            **{k: s.teacher[k] for k in ("copies", "flawed", "flaw") if "teacher" in s and k in s.teacher}}
  p.phases = ml_collections.ConfigDict({"sft": dict(
      steps=s.steps, seq_len=s.seq_len, batch_size=s.batch_size, rope={}, sources={"tasks": source},
      learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, decay="cosine", final_lr_fraction=0.1,
      mtp_weight=s.mtp_weight, mtp_target="self_distill")})
  # Held-out loss on the reference's own turns (not the teacher's flawed ones).
  p.eval = ml_collections.ConfigDict(dict(every=max(s.steps // 4, 1), batches=2, batch_size=s.batch_size,
                                          seq_len=s.seq_len,
                                          source={**source, "split": "heldout", "copies": 1, "flawed": 0}))
  p.log_every = 10
  p.checkpoint = ml_collections.ConfigDict(dict(every=max(s.steps // 4, 1), keep=1))
  return p


def cache_dir(c: ml_collections.ConfigDict, p: ml_collections.ConfigDict) -> str:
  """<cache>/sft-<hash of the SFT run config and of the demonstrations' text>.

  The text is hashed too: a change to the prompt format, the suite's tasks or the reference policy makes a new SFT
  rather than reusing one trained on other prompts.
  """
  from c2jax.data import sft  # pylint: disable=g-import-not-at-top  (imports the coding suites)
  root = c.sft.cache_dir or bpe.default_cache_dir()
  h = hashlib.sha256(json.dumps(p.to_dict(), sort_keys=True, default=str).encode())
  if p.tokenizer != "byte":  # a tokenizer file retrained under the same path is another SFT
    with open(p.tokenizer, "rb") as f:
      h.update(f.read())
  source = dict(p.phases.sft.sources.tasks)
  teacher = {k: source[k] for k in ("copies", "flawed", "flaw") if k in source}
  for prompt, response in sft.sft_examples(source["suite"], source["split"], max_turns=source["max_turns"],
                                           max_tokens=source["max_tokens"], instructions=source["instructions"],
                                           suite_options=dict(source.get("suite_options") or {}), **teacher):
    h.update(prompt.encode())
    h.update(response.encode())
  return os.path.join(os.path.abspath(root), f"sft-{h.hexdigest()[:16]}")


def sft_checkpoint(c: ml_collections.ConfigDict, stop=lambda: False) -> str | None:
  """Trains (or resumes, or reuses) the SFT of `c` and returns its model checkpoint directory (None when `stop`
  interrupted it: the same call resumes it)."""
  from c2jax.pretrain import loop  # pylint: disable=g-import-not-at-top  (jax-heavy; only when SFT runs)
  p = sft_config(c)
  workdir = cache_dir(c, p)
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
    result = loop.run(p, workdir, stop=stop)
  return None if result["interrupted"] else checkpoint
