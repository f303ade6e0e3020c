"""Multi-turn SFT demonstrations: a scripted teacher's episodes recorded through the agent loop, one token document
per segment (report sections 3-4: SFT on agent traces before RL; self-summaries chain segments).

  path = ensure_traces(cfg, "train")      # records once (cached by its settings), then returns the JSONL's path
  {"kind": "token_docs", "path": path}    # the SFT's data source (c2jax/data/sources.py)

The teacher is a scripted policy (`sft.teacher.policy`, e.g. tiny_long_horizon's `summarizing_reader`) forced through
the same engine, environment and budgets the RL actors use (the run's `actors` section: context, turn budgets),
with the teacher's own self-summaries (`sft.teacher.summary`), so a demonstration is exactly what the policy would
be trained on: every segment's ledger as the model is fed it (prompt, turns, observations, the summary request,
the summary, the resumed segment's head), its EOS tokens included, with loss weight 1 on the teacher's turns and
summaries and 0 elsewhere, also 0 on a turn the policy's `is_mistake` marks (a deliberate wrong write whose failing
test run the next turn answers: the demonstration teaches the recovery, not the mistake). A train task is recorded
`sft.teacher.copies` times, the last `flawed` of them by the policy named `sft.teacher.flaw`. Only episodes the
teacher FINISHED with outcome 1 are kept (a teacher's cut or failed episode is no demonstration), except that a
flawed policy whose failures are what it demonstrates (`KEEPS_FAILURES`, e.g. tiny_spec's careless
`spec_unverified`) keeps its finished episodes whatever their outcome, as real SFT data hold wrong answers. The
forced turns carry a model's log-probs of them, which SFT does not use, so the model that runs them is a random init of
`scorer_config(run's model)`: one dense layer 16 wide over the run's vocabulary. A forced token is the script's
whatever the logits say, so the recorded tokens are the run's model's token for token; the small model only makes
the engine's forwards cheap, cheap enough that every call runs all slots over the whole context (`Shapes.FULL`), so
that a handful of programs compile instead of one per (rows, chunk, window): those compiles and forwards bound the
recording on 2 CPU cores (docs/benchmarks.md, tools/bench_forced_turns.py).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import fcntl
import functools
import hashlib
import json
import os

from absl import logging
import jax
import numpy as np
import tqdm

from c2jax import typed_config
from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode
from c2jax.actors.engine import Shapes
from c2jax.actors.ledger import ACTIONS, EpisodeEnd
from c2jax.actors.sampling import SamplingConfig
from c2jax.data import bpe
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.model.config import ModelConfig
from c2jax.model.params import init_params
from c2jax.services.rl_run_config import RLRunConfig

# What the recording depends on besides the policy: bump when the recording itself changes.
FORMAT = 3  # 3: the run tool shows no test run's duration (env.without_timings)


# The scorer's shape (ModelConfig fields over the run's model): one dense layer of width 16, no MoE, no MTP. Only its
# vocabulary must be the run's (the forced ids index its logits).
SCORER = dict(d_model=16, n_layers=1, first_k_dense_replace=1, n_heads=1, q_lora_rank=None, kv_lora_rank=8,
              qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, intermediate_size=16, num_mtp_layers=0,
              scan_unroll=1)


def scorer_config(model: ModelConfig) -> ModelConfig:
  """The model that scores the teacher's forced turns: `model`'s vocabulary and numerics at `SCORER`'s shape."""
  return dataclasses.replace(model, **SCORER)


class Scorer(enum.Enum):
  """Which model runs the teacher's forced turns through the engine (the recorded tokens are the same)."""

  SMALL = "small"  # `scorer_config` of the run's model, every call on all slots and the whole context (the default)
  RUN_MODEL = "run_model"  # the run's model on the engine's fitted shapes, as an actor runs it (the parity test's)


def _agent(cfg: RLRunConfig) -> AgentConfig:
  """The actors' agent loop settings with the teacher's own self-summaries."""
  return dataclasses.replace(cfg.actor_config.agent_config(), summary=cfg.sft.teacher.summary)


def _settings(cfg: RLRunConfig, split: str) -> dict:
  actor = cfg.actor_config
  agent = typed_config.to_plain(_agent(cfg))
  for name in ("forced_turns", "force_chunk"):  # how the engine runs the script's turns: the same tokens either way
    agent.pop(name)
  return {"format": FORMAT, "policy": cfg.sft.teacher.policy, "split": split, "task": typed_config.to_plain(cfg.task),
          "agent": agent, "context": actor.context,
          "stop_tokens": list(actor.stop_tokens), "vocab_size": cfg.model_config.vocab_size,
          "max_tasks": _limit(cfg, split), "copies": cfg.sft.teacher.copies, "flawed": cfg.sft.teacher.flawed,
          "flaw": cfg.sft.teacher.flaw if cfg.sft.teacher.flawed else ""}


def _limit(cfg: RLRunConfig, split: str) -> int:
  """How many of `split`'s first tasks the teacher records (0: all)."""
  teacher = cfg.sft.teacher
  return teacher.max_tasks if split == "train" else teacher.heldout_tasks


def traces_path(cfg: RLRunConfig, split: str) -> str:
  """Where the traces of `cfg`'s teacher on `split` are kept: <cache>/traces-<hash of the settings>.jsonl."""
  h = hashlib.sha256(json.dumps(_settings(cfg, split), sort_keys=True, default=str).encode()).hexdigest()[:16]
  root = cfg.sft.cache_dir or bpe.default_cache_dir()
  return os.path.join(os.path.abspath(root), f"traces-{h}.jsonl")


def policy_for(teacher, copy: int, flawed: bool):
  """The scripted policy of a task's `copy`-th demonstration: `teacher.flaw`'s when `flawed`, else `teacher.policy`'s;
  a policy with `for_episode(copy)` (whose behaviour varies between a task's demonstrations) is given its copy."""
  policy = POLICIES.get(teacher.flaw if flawed else teacher.policy)()
  return policy.for_episode(copy) if hasattr(policy, "for_episode") else policy


def record(cfg: RLRunConfig, split: str, label: str = "", scorer: Scorer = Scorer.SMALL) -> tuple[list[dict], dict]:
  """Runs the teacher on every task of `split` (the first `sft.teacher.max_tasks` of train, `heldout_tasks` of
  heldout, when > 0); returns (token documents {"tokens", "weights"} of the kept episodes' segments, stats).
  `label`: the caller's stage, which the progress bar names ("teacher traces 1/5"); `scorer`: which model runs the
  forced turns (`Scorer`)."""
  teacher = cfg.sft.teacher
  policy_name = teacher.policy
  suite = cfg.task_suite()
  coding_task = getattr(suite, "coding_task", None)
  if coding_task is None:
    raise ValueError(f"sft.teacher.policy={policy_name!r} needs a coding task suite (task.suite='coding'): scripted "
                     "policies act on coding tasks.")
  actor = cfg.actor_config
  agent = _agent(cfg)
  # Forced turns up to a turn's and a summary's budget. The small scorer's forwards cost little next to compiling
  # one program per (rows, chunk, window): every call runs all slots over the whole context (a program per chunk).
  small = scorer is Scorer.SMALL
  engine = dataclasses.replace(actor.engine_config(), shapes=Shapes.FULL if small else Shapes.FITTED,
                               max_forced=max(agent.max_turn_tokens, agent.summary.max_tokens))
  if getattr(suite, "chat_format", "brief") != "brief":
    raise ValueError(f"The scripted teachers write the brief tool format; task.chat_format={suite.chat_format!r} "
                     "needs demonstrations in its own format, so set teacher traces off for it.")
  tok = suite.text_tokenizer()
  sampling = SamplingConfig(max_new_tokens=1, temperature=actor.temperature, stop_tokens=actor.stop_tokens)
  # Every turn is forced, so the tokens do not depend on the model: the smallest one runs them (module docstring).
  model = scorer_config(cfg.model_config) if small else cfg.model_config
  runner = AgentRunner(model, engine, sampling, agent, tok)
  params = jax.device_get(jax.jit(init_params, static_argnums=0)(model, jax.random.key(cfg.seed)))
  n = suite.size(split)
  if _limit(cfg, split):
    n = min(n, _limit(cfg, split))
  # Train tasks are shown `copies` times, the last `flawed` of them by the policy named `flaw`; held-out tasks once,
  # by the policy itself (their loss measures the teacher's own turns).
  copies, flawed = (teacher.copies, teacher.flawed) if split == "train" else (1, 0)
  episodes = []
  mistakes = collections.defaultdict(set)  # episode index -> the turns the teacher got wrong on purpose
  keeps_failures = set()  # episode indices whose failures are demonstrations (the policy's KEEPS_FAILURES)

  def script(turn, obs, task, act, index):
    if getattr(act, "is_mistake", None) is not None and act.is_mistake(task, obs):
      mistakes[index].add(turn)
    text = act.act(task, obs)
    if not isinstance(text, str):  # a turn it leaves to the model would be the scorer's sample, not the run's model's
      raise ValueError(f"The teacher {type(act).__name__} returned {text!r} for turn {turn}; a teacher writes every "
                       "turn (text), or its traces would hold the scoring model's samples.")
    return text

  for i in range(n):
    task = suite.task(split, i)
    for copy in range(copies):
      act = policy_for(teacher, copy, flawed=copy >= copies - flawed)
      if getattr(act, "KEEPS_FAILURES", False):
        keeps_failures.add(len(episodes))
      episodes.append(Episode(prompt=task.prompt, make_env=functools.partial(suite.agent_env, task),
                              key=len(episodes),
                              script=functools.partial(script, task=coding_task(task), act=act,
                                                       index=len(episodes))))
  n = len(episodes)
  with tqdm.tqdm(total=n, desc=f"{label + ': ' if label else ''}record {policy_name} ({split})", unit="episode") as bar:

    def progress():
      bar.update(runner.stats.episodes - bar.n)

    trajectories = runner.run(episodes, weights=lambda: (params, 0), on_chunk=progress)
    progress()
  docs, kept, ends = [], 0, {}
  masked = failed = 0
  for index, traj in enumerate(trajectories):
    ends[traj.end.value] = ends.get(traj.end.value, 0) + 1
    solved = traj.reward_terms.get("outcome") == 1.0
    if traj.end is not EpisodeEnd.FINISHED or not (solved or index in keeps_failures):
      continue
    kept += 1
    failed += not solved
    masked += len(mistakes[index])
    for seg in traj.segments:
      # The loss is on the teacher's turns, less its deliberate mistakes (kept in the context: what is learned is
      # the answer to their failing test run).
      weights = (np.isin(seg.source, ACTIONS) & ~np.isin(seg.turn, sorted(mistakes[index]))).astype(np.float32)
      docs.append({"tokens": [int(t) for t in seg.tokens], "weights": [float(w) for w in weights]})
  stats = {"policy": policy_name, "split": split, "episodes": n, "copies": copies, "flawed": flawed,
           "masked_turns": masked, "kept": kept, "kept_failing": failed, "segments": len(docs), "ends": ends,
           "compactions_per_episode": float(np.mean([t.compactions for t in trajectories])) if n else 0.0}
  return docs, stats


def ensure_traces(cfg: RLRunConfig, split: str, label: str = "") -> str:
  """The traces' JSONL (recorded on first use, under a lock: parallel runs with the same settings record once);
  `label` names the recording's progress bar (`record`)."""
  path = traces_path(cfg, split)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(f"{path}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if os.path.exists(path):
      return path
    logging.warning("SFT: recording %s's episodes on the %s split into %s", cfg.sft.teacher.policy, split, path)
    docs, stats = record(cfg, split, label)
    if not docs:
      raise ValueError(f"The teacher {cfg.sft.teacher.policy!r} finished no episode of the {split} split with outcome "
                       f"1 ({stats['ends']}); it demonstrates nothing under these budgets.")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
      for d in docs:
        f.write(json.dumps(d) + "\n")
    os.replace(tmp, path)
    with open(f"{path}.stats.json", "w") as f:
      json.dump(stats, f, indent=1)
    logging.warning("SFT: %s", json.dumps(stats))
  return path
