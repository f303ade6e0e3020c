"""The actor loop: load weights, take tasks, sample G rollouts per task, reward them, commit the group (report
sections 4 and 6: rollout workers run independently of the trainer, with in-flight weight updates).

  actor = Actor(ActorConfig(...), model_cfg, suite, buffer_url="runs/rl/buffer", weights_url="runs/rl/weights",
                actor_id="actor-0")
  actor.run(stop=lambda: False)          # until stopped; or actor.run(max_groups=10)

One loop iteration:
  1. newer weights? load them (`WeightStore.update`: deltas on top of the weights held, a full load otherwise);
  2. admission (`c2jax.rollouts.admission`): start a group only if the update that will train on it is at most
     `max_lag` versions ahead of the weights this actor holds (PipelineRL's budget instead of discarding stale data);
     unfinished groups of a previous run of this actor (its pending tickets) go first and need no admission;
  3. `begin` a ticket per group (task and seed persisted before any work, so a killed actor's groups are re-run);
  4. sample `groups_per_call` groups x G rows in one sampler batch, decoding `chunk_steps` tokens at a time; between
     chunks, with `WeightUpdates.IN_FLIGHT`, load newer weights and continue the same rows with them (the KV cache
     computed by the older weights is kept), stamping every token with the version that produced it;
  5. reward each row with the task suite's verifier and commit each group (rows first, commit record last).

The sampler batch always has `groups_per_call * group_size` rows (unused groups are filled with copies of a real
one and dropped), so it compiles once.

With `episodes=MULTI_TURN` step 4 runs each row as a multi-turn episode of the suite's environment
(`c2jax.envs.core.agent_env.agent_env`) through the agent loop (`c2jax.actors.agent_loop`): `slots` slots with
continuous batching, tools on host workers, the same in-flight weight swaps between device calls; a row is the whole
trajectory (prompt, turns, observations) with its token ledger, and the buffer stores the ledger's source and turn
of every token. Admission, tickets and restarts are the same: a killed actor re-runs the groups it had begun.
Where the environments run is the actor's `envs` (`c2jax.envs.service.factory`): in its process by default, or on
environment servers, which are sent each task's split and index.

With self-summaries (`summary`, `c2jax.actors.agent_loop.SummaryConfig`) an episode is a chain of segments and a
group holds one row per segment: G chains, rows ordered by chain then segment, each row with its `chain_id` (the
episode's index in the group) and `segment`; the episode's reward terms and its `truncated` are on every segment of
its chain (the update counts the chain once in its group and gives each segment the chain's advantage, see
`c2jax.rl.update`). `summary_tokens` says whether summary turns are in the rows' loss mask.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import random
import time
from typing import Callable, Sequence

from absl import logging
import jax
import numpy as np

from c2jax.actors import sampler as sampler_lib
from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, SummaryConfig
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import EpisodeEnd, SummaryTokens, Trajectory
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.service.factory import EnvFactory, InProcessEnvs
from c2jax.envs.tasks import interruptions
from c2jax.envs.token_tasks import suite as tasks_lib
from c2jax.envs.token_tasks.suite import TokenTask, TokenTaskSuite
from c2jax.model.config import ModelConfig
from c2jax.rollouts import admission
from c2jax.rollouts.buffer import RolloutWriter
from c2jax.rollouts.schema import BufferSpec
from c2jax.rollouts.weight_store import WeightStore


MAX_ATTEMPTS = 3  # runs of one group (by successive restarts of its actor) before it is dropped


class EpisodeKind(enum.Enum):
  """What a row is: SINGLE_TURN, one sampled turn graded by the suite's verifier (the token-level sampler); or
  MULTI_TURN, a whole agent episode through the agent loop (tools between turns, a trajectory per row)."""

  SINGLE_TURN = "single_turn"
  MULTI_TURN = "multi_turn"


class WeightUpdates(enum.Enum):
  """When an actor picks up newer weights: IN_FLIGHT between decode chunks of a running group (PipelineRL), or
  only BETWEEN_CALLS (a group is sampled by one version; with max_lag = 0 this is synchronous RL)."""

  IN_FLIGHT = "in_flight"
  BETWEEN_CALLS = "between_calls"


@dataclasses.dataclass(frozen=True)
class ActorConfig:
  """How an actor samples.

  Attributes:
    group_size: G, rollouts per task (the group of the advantage).
    groups_per_call: groups sampled together in one sampler batch.
    prompt_len: P, the prompt buffer; longer prompts are refused.
    max_new_tokens: N, the response budget.
    temperature: sampling temperature (the trainer's `rl.sampling_temperature` must match).
    chunk_steps: decode steps between checks for newer weights.
    max_lag: admission budget in policy versions (0: synchronous).
    weight_updates: IN_FLIGHT or BETWEEN_CALLS.
    split: which split of the suite to draw tasks from.
    seed: with the actor id, seeds the task choice and sampling keys.
    poll_interval_s: sleep between checks while waiting for weights or admission (a refused actor polls only the
      trainer's progress, one small object, and asks admission again as soon as it changes).
    admission_recheck_s: a refused actor asks admission again after this long even when the trainer's progress has
      not changed.
    stop_tokens: tokens that end a row (e.g. EOS).
    pending_lease_s: admission ignores the begun groups of an actor silent for this long (it is gone); a live
      actor renews its lease every pending_lease_s / 4.
    episodes: SINGLE_TURN or MULTI_TURN (the module docstring); the fields below apply to MULTI_TURN, where
      max_new_tokens is the budget of one turn.
    context: positions per slot (prompt, turns and observations), the buffer rows' T.
    max_turns: model turns per episode.
    max_episode_tokens: model tokens per episode.
    slots: trajectories decoded together (0: groups_per_call * group_size).
    chunk_sizes: the engine's append buckets.
    row_buckets: the engine's row buckets (`EngineConfig.row_buckets`; empty: the powers of two below the slots).
    tool_workers: threads running the episodes' environments.
    summary: self-summarization in the engine (off by default: an episode is cut when its context is full).
    summary_tokens: TRAINED (the report) or MASKED: whether summary turns are in the rows' loss mask.
  """

  group_size: int = 8
  groups_per_call: int = 2
  prompt_len: int = 16
  max_new_tokens: int = 8
  temperature: float = 1.0
  chunk_steps: int = 4
  max_lag: int = 1
  weight_updates: WeightUpdates = WeightUpdates.IN_FLIGHT
  split: str = "train"
  seed: int = 0
  poll_interval_s: float = 0.05
  stop_tokens: tuple[int, ...] = ()
  pending_lease_s: float = 120.0
  admission_recheck_s: float = 1.0
  episodes: EpisodeKind = EpisodeKind.SINGLE_TURN
  context: int = 2048
  max_turns: int = 8
  max_episode_tokens: int = 2048
  slots: int = 0
  chunk_sizes: tuple[int, ...] = (16, 64, 256)
  row_buckets: tuple[int, ...] = ()
  tool_workers: int = 4
  summary: SummaryConfig = SummaryConfig()
  summary_tokens: SummaryTokens = SummaryTokens.TRAINED

  def __post_init__(self):
    for name in ("group_size", "groups_per_call", "prompt_len", "max_new_tokens", "chunk_steps"):
      if getattr(self, name) < 1:
        raise ValueError(f"ActorConfig.{name}={getattr(self, name)} must be >= 1.")
    if self.max_lag < 0:
      raise ValueError(f"ActorConfig.max_lag={self.max_lag} must be >= 0.")
    for name in ("poll_interval_s", "admission_recheck_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"ActorConfig.{name}={getattr(self, name)} must be > 0.")
    if self.temperature <= 0:
      raise ValueError("ActorConfig.temperature must be > 0: RL trains on the sampling distribution.")
    object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
    object.__setattr__(self, "episodes", EpisodeKind(self.episodes))
    object.__setattr__(self, "chunk_sizes", tuple(int(c) for c in self.chunk_sizes))
    object.__setattr__(self, "row_buckets", tuple(int(k) for k in self.row_buckets))
    object.__setattr__(self, "summary_tokens", SummaryTokens(self.summary_tokens))
    if self.summary.enabled and self.episodes is not EpisodeKind.MULTI_TURN:
      raise ValueError("ActorConfig.summary needs episodes=multi_turn: self-summaries chain agent episodes.")
    if self.episodes is EpisodeKind.MULTI_TURN:
      for name in ("context", "max_turns", "max_episode_tokens", "tool_workers"):
        if getattr(self, name) < 1:
          raise ValueError(f"ActorConfig.{name}={getattr(self, name)} must be >= 1.")
      if self.prompt_len >= self.context:
        raise ValueError(f"ActorConfig.prompt_len={self.prompt_len} must be < context={self.context} (the turns and "
                         "observations follow the prompt in the slot).")
    if self.slots < 0:
      raise ValueError(f"ActorConfig.slots={self.slots} must be >= 0 (0: one slot per row of a call).")

  @property
  def seq_len(self) -> int:
    """T of the buffer rows: prompt buffer + response budget (single-turn), or the slot's context (multi-turn)."""
    if self.episodes is EpisodeKind.MULTI_TURN:
      return self.context
    return self.prompt_len + self.max_new_tokens

  @property
  def max_group_rows(self) -> int:
    """Rows one group may hold: G, or G x max_segments with self-summaries (a row per segment)."""
    return self.group_size * (self.summary.max_segments if self.summary.enabled else 1)

  def engine_config(self) -> EngineConfig:
    """The agent engine's shapes (multi-turn)."""
    return EngineConfig(slots=self.slots or self.groups_per_call * self.group_size, context=self.context,
                        chunk_sizes=self.chunk_sizes, row_buckets=self.row_buckets)

  def agent_config(self) -> AgentConfig:
    """The agent loop's budgets (multi-turn)."""
    return AgentConfig(max_turns=self.max_turns, max_turn_tokens=self.max_new_tokens,
                       max_episode_tokens=self.max_episode_tokens, chunk_steps=self.chunk_steps,
                       tool_workers=self.tool_workers, summary=self.summary)


def buffer_spec(model: ModelConfig, actor: ActorConfig,
                reward_terms: tuple[str, ...] = tasks_lib.DEFAULT_REWARD_TERMS) -> BufferSpec:
  """The buffer rows these actors write: T = P + N, every MoE layer's expert ids (routing replay), and the suite's
  reward terms (`c2jax.envs.token_tasks.suite.reward_terms`)."""
  return BufferSpec(seq_len=actor.seq_len, n_moe_layers=model.n_moe_layers,
                    experts_per_tok=model.num_experts_per_tok, reward_terms=tuple(reward_terms),
                    ledger=actor.episodes is EpisodeKind.MULTI_TURN)


class IdText:
  """Text of ids for suites without a text tokenizer (their one-turn environments read ids, not text): the ids
  written out as decimal numbers, which encode back to the same ids."""

  def encode(self, text: str, bos: bool = False, eos: bool = False) -> np.ndarray:
    del bos, eos
    return np.array([int(t) for t in text.split()], np.int32)

  def encode_text(self, text: str, controls=()) -> np.ndarray:
    """The ids written in `text` (these suites' environments write none: their observations are empty)."""
    del controls
    return self.encode(text)

  def decode(self, ids) -> str:
    return " ".join(str(int(i)) for i in ids)


def text_tokenizer(suite: TokenTaskSuite):
  """The suite's tokenizer (`suite.text_tokenizer()`, e.g. a coding suite's byte or BPE one), else `IdText`."""
  make = getattr(suite, "text_tokenizer", None)
  return make() if make is not None else IdText()


def suite_chat_format(suite: TokenTaskSuite) -> str:
  """The chat format the suite's episodes speak (`suite.chat_format`, e.g. a coding suite's), else "brief"."""
  return getattr(suite, "chat_format", "brief")


def _seed(*parts) -> int:
  """A stable 63-bit seed from strings and ints (Python's hash() is salted per process)."""
  digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") >> 1


def episode_group(trajectories: Sequence[Trajectory], *, seq_len: int, reward_terms: Sequence[str],
                  summary_tokens: SummaryTokens = SummaryTokens.TRAINED, expert_ids: bool = True) -> dict:
  """The buffer record of one group of multi-turn trajectories: a row per segment, chain by chain (the module
  docstring), in the layout of `c2jax.rollouts.schema`.

  Args:
    trajectories: the group's G episodes.
    seq_len: T of the rows (the slot's context).
    reward_terms: the buffer's reward terms (each trajectory reports them).
    summary_tokens: whether summary turns are in the loss mask.
    expert_ids: store the routed experts (a model with MoE layers).
  """
  segs = [(c, k, seg) for c, tr in enumerate(trajectories) for k, seg in enumerate(tr.segments)]
  rows = [seg.row(seq_len, summary_tokens) for _, _, seg in segs]
  chain = [trajectories[c] for c, _, _ in segs]  # the chain's fields repeat on each of its segments
  stack = lambda f: np.stack([r[f] for r in rows])
  group = {f: stack(f) for f in ("tokens", "loss_mask", "behaviour_logprobs", "policy_version", "source", "turn")}
  group.update({
      # An episode whose environment raised reports only ENV_ERROR_TERMS: its other terms read as 0.
      "reward_terms": {n: np.array([tr.reward_terms.get(n, 0.0) if tr.end is EpisodeEnd.ENV_ERROR
                                    else tr.reward_terms[n] for tr in chain], np.float32) for n in reward_terms},
      "truncated": np.array([tr.cut for tr in chain], np.float32),
      "chain_id": np.array([c for c, _, _ in segs], np.int32),
      "segment": np.array([k for _, k, _ in segs], np.int32),
      "prompt_length": np.array([seg.prompt_length for _, _, seg in segs], np.int32),
      "length": np.array([len(seg.tokens) - seg.prompt_length for _, _, seg in segs], np.int32),
  })
  if expert_ids:
    group["expert_ids"] = np.stack([r["expert_ids"] for r in rows], axis=1)
  return group


@dataclasses.dataclass
class ActorStats:
  groups: int = 0
  rows: int = 0
  tokens: int = 0
  weight_loads: int = 0
  in_flight_swaps: int = 0
  resumed_groups: int = 0
  waited_s: float = 0.0
  sampling_s: float = 0.0
  env_reruns: int = 0  # episodes run again because their environment server was lost (RunStats.env_reruns)


class Actor:
  """One rollout worker writing to its own buffer shard (see the module docstring)."""

  def __init__(self, cfg: ActorConfig, model: ModelConfig, suite: TokenTaskSuite, *, buffer_url: str, weights_url: str,
               actor_id: str, reward_terms: tuple[str, ...] | None = None, envs: EnvFactory | None = None):
    """`envs`: where multi-turn episodes' environments run (default: in this process)."""
    self.cfg, self.model, self.suite, self.actor_id = cfg, model, suite, actor_id
    self.envs = envs if envs is not None else InProcessEnvs(suite)
    self.buffer_url = buffer_url
    self.weights = WeightStore(weights_url)
    terms = tasks_lib.reward_terms(suite) if reward_terms is None else reward_terms
    self.writer = RolloutWriter(buffer_url, actor_id, buffer_spec(model, cfg, terms))
    self.sampling = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                   stop_tokens=cfg.stop_tokens)
    self.stats = ActorStats()
    self.version: int | None = None
    self._host_params = None
    self._params = None
    # Groups a previous run of this actor began but never committed (it was killed): re-run first.
    pending = self.writer.pending()
    self._unfinished = {ticket_id for ticket_id, _ in pending}
    self._retried: set[str] = set()
    # New tickets continue the shard's numbering, so a restarted actor draws new tasks and seeds.
    self._next_task = max([self.writer.next_seq + len(pending)] + [t.get("n", -1) + 1 for _, t in pending])
    if self._unfinished:
      logging.info("%s: %d unfinished group(s) from a previous run will be re-run.", actor_id, len(self._unfinished))
    self._contended = False  # the last admission lost a race with another actor's (see _verify)
    self._jitter = random.Random(_seed(actor_id, "jitter"))
    self._runner: AgentRunner | None = None

  # -- weights ------------------------------------------------------------------------------------------------------

  def refresh_weights(self) -> bool:
    """Loads the newest published version if it is newer than the one held; True when the weights changed."""
    got = self.weights.update(self.version, self._host_params)
    if got is None:
      return False
    self.version, self._host_params = got
    self._params = jax.device_put(self._host_params)
    self.stats.weight_loads += 1
    return True

  def wait_for_weights(self, stop: Callable[[], bool]) -> bool:
    """Blocks until the trainer has published weights (False if stopped first)."""
    logged = False
    while not self.refresh_weights():
      if stop():
        return False
      if not logged:
        logging.info("%s: waiting for the trainer's first weights at %s", self.actor_id, self.weights.url)
        logged = True
      time.sleep(self.cfg.poll_interval_s)
    return True

  # -- tasks and admission --------------------------------------------------------------------------------------------

  def _new_ticket(self) -> dict:
    n = self._next_task
    self._next_task += 1
    index = _seed(self.cfg.seed, self.actor_id, "task", n) % self.suite.size(self.cfg.split)
    return {"n": n, "task_index": int(index), "split": self.cfg.split,
            "sample_seed": _seed(self.cfg.seed, self.actor_id, "sample", n)}

  def _admit(self, already: int) -> int:
    """How many new groups (up to groups_per_call - already) admission lets this actor start now."""
    status = admission.read_status(self.buffer_url, pending_lease_s=self.cfg.pending_lease_s)
    n = 0
    while already + n < self.cfg.groups_per_call and admission.admit(
        dataclasses.replace(status, pending=status.pending + n), self.version, self.cfg.max_lag):
      n += 1
    return n

  def _take_tickets(self) -> list[tuple[str, dict]]:
    """This call's groups: resumed tickets first (already counted as pending), then admitted new ones."""
    tickets = []
    for ticket_id, ticket in self.writer.pending()[:self.cfg.groups_per_call]:
      if ticket_id in self._unfinished and ticket_id not in self._retried:
        # A group begun by a previous run: count the attempt, so that a group that kills its actor every time
        # (a poison task) is dropped after MAX_ATTEMPTS instead of crash-looping the actor forever.
        self.writer.cancel(ticket_id)
        attempts = int(ticket.get("attempts", 0)) + 1
        if attempts >= MAX_ATTEMPTS:
          logging.warning("%s: dropping group %s (task %s of %s) after %d attempts that did not finish.",
                          self.actor_id, ticket_id, ticket.get("task_index"), ticket.get("split"), attempts)
          continue
        ticket = {**ticket, "attempts": attempts}
        ticket_id = self.writer.begin(ticket)
        self._unfinished.add(ticket_id)
        self._retried.add(ticket_id)
      tickets.append((ticket_id, ticket))
    new = []
    for _ in range(self._admit(len(tickets))):
      ticket = self._new_ticket()
      new.append((self.writer.begin(ticket), ticket))
    keep = self._verify(len(new)) if new else 0
    for ticket_id, _ in new[keep:]:
      self.writer.cancel(ticket_id)
    self._next_task -= len(new) - keep  # a cancelled draw is made again by the next admission
    self._contended = keep < len(new)
    return tickets + new[:keep]

  def _verify(self, n: int) -> int:
    """How many of the `n` tickets this actor has just begun stay within the budget, now that they are visible to
    every actor (begin, then verify). Another actor admitted by the same status read sees these tickets when it
    verifies its own, and this one sees theirs, so the budget is never exceeded; each counts its own tickets last,
    and when both back off, each retries after a random pause (`run`)."""
    status = admission.read_status(self.buffer_url, pending_lease_s=self.cfg.pending_lease_s)
    keep = 0
    while keep < n and admission.admit(dataclasses.replace(status, pending=status.pending - n + keep), self.version,
                                       self.cfg.max_lag):
      keep += 1
    return keep

  # -- sampling ------------------------------------------------------------------------------------------------------

  def _prompts(self, tasks: list[TokenTask]) -> tuple[np.ndarray, np.ndarray]:
    g, p = self.cfg.group_size, self.cfg.prompt_len
    rows = self.cfg.groups_per_call * g
    prompts = np.zeros((rows, p), np.int32)
    lengths = np.zeros((rows,), np.int32)
    for r in range(rows):
      task = tasks[min(r // g, len(tasks) - 1)]  # unused groups repeat the last real one and are dropped
      if len(task.prompt) > p:
        raise ValueError(f"Task {task.task_id} has a {len(task.prompt)}-token prompt; the actor's prompt buffer is "
                         f"prompt_len={p}.")
      prompts[r, :len(task.prompt)] = task.prompt
      lengths[r] = len(task.prompt)
    return prompts, lengths

  def sample(self, tasks: list[TokenTask], seed: int, stop: Callable[[], bool] = lambda: False):
    """Samples G rows per task (in-flight weight swaps between chunks); returns the sampler's output on the host."""
    prompts, lengths = self._prompts(tasks)
    kw = dict(cfg=self.model, sampling=self.sampling)
    state = sampler_lib.prefill(self._params, prompts, lengths, jax.random.key(seed), version=self.version, **kw)
    while not bool(np.all(jax.device_get(state.done))):
      self.writer.heartbeat(self.cfg.pending_lease_s / 4)
      if self.cfg.weight_updates is WeightUpdates.IN_FLIGHT and self.refresh_weights():
        self.stats.in_flight_swaps += 1
      state = sampler_lib.decode(self._params, state, steps=self.cfg.chunk_steps, version=self.version, **kw)
    return jax.device_get(sampler_lib.finish(self._params, state, cfg=self.model))

  def runner(self) -> AgentRunner:
    """The agent loop of a MULTI_TURN actor (made on first use: its engine holds the slots' caches)."""
    if self._runner is None:
      self._runner = AgentRunner(self.model, self.cfg.engine_config(), self.sampling, self.cfg.agent_config(),
                                 text_tokenizer(self.suite), chat_format=suite_chat_format(self.suite))
    return self._runner

  def sample_episodes(self, tasks: list[TokenTask], seeds: list[int],
                      where: Sequence[tuple[str, int]] | None = None) -> list[Trajectory]:
    """Runs G multi-turn episodes per task (episode i of a group draws with fold_in(key(seed), i)); in-flight
    weight swaps between device calls. `where`: each task's (split, index), what an environment server builds it
    from (in-process environments need only the task)."""

    def weights():
      if self.cfg.weight_updates is WeightUpdates.IN_FLIGHT and self.refresh_weights():
        self.stats.in_flight_swaps += 1
      return self._params, self.version

    g = self.cfg.group_size
    where = list(where) if where is not None else [(None, None)] * len(tasks)
    coding_task = getattr(self.suite, "coding_task", None)
    max_turn_tokens = self.runner().agent.max_turn_tokens
    # A coding task whose user interrupts a turn mid-way has that turn cut (`interruptions.turn_tokens`).
    budgets = [interruptions.turn_tokens(coding_task(task), max_turn_tokens) if coding_task else () for task in tasks]
    episodes = [Episode(prompt=task.prompt, make_env=self.envs(task, split, index),
                        key=jax.random.fold_in(jax.random.key(seed), i), first_observation=task.text,
                        turn_tokens=turns)
                for task, seed, (split, index), turns in zip(tasks, seeds, where, budgets) for i in range(g)]
    trajectories = self.runner().run(episodes, weights=weights,
                                     on_chunk=lambda: self.writer.heartbeat(self.cfg.pending_lease_s / 4))
    self.stats.env_reruns = self.runner().stats.env_reruns  # the runner's count is over all of its runs
    return trajectories

  def _episode_group(self, trajectories: list[Trajectory]) -> dict:
    """The buffer record of one group of multi-turn trajectories (`episode_group`)."""
    names = self.writer.spec.reward_terms
    graded = [t for t in trajectories if t.end is not EpisodeEnd.ENV_ERROR]
    missing = [n for n in names if graded and n not in graded[0].reward_terms]
    if missing:
      raise ValueError(f"Suite {self.suite.name!r} returned no reward term(s) {missing} the buffer expects.")
    return episode_group(trajectories, seq_len=self.cfg.seq_len, reward_terms=names,
                         summary_tokens=self.cfg.summary_tokens, expert_ids=self.model.n_moe_layers > 0)

  def _group(self, out, g: int, task: TokenTask) -> dict:
    """The buffer record of group g of a sampler output (rows g*G .. (g+1)*G - 1)."""
    rows = slice(g * self.cfg.group_size, (g + 1) * self.cfg.group_size)
    s = out.samples
    prompt_length = np.full(self.cfg.group_size, len(task.prompt), np.int32)
    lengths = np.asarray(s.lengths[rows], np.int32)
    tokens = np.asarray(s.tokens[rows], np.int32)
    terms = tasks_lib.rewards(self.suite, [task] * self.cfg.group_size,
                              [tokens[i, len(task.prompt):len(task.prompt) + lengths[i]]
                               for i in range(self.cfg.group_size)])
    names = self.writer.spec.reward_terms
    missing = [n for n in names if n not in terms[0]]
    if missing:
      raise ValueError(f"Suite {self.suite.name!r} returned no reward term(s) {missing} the buffer expects.")
    group = {
        "tokens": tokens,
        "loss_mask": np.asarray(s.loss_mask[rows], np.float32),
        "behaviour_logprobs": np.asarray(s.logprobs[rows], np.float32),
        "policy_version": np.asarray(out.policy_version[rows], np.int32),
        "reward_terms": {n: np.array([t[n] for t in terms], np.float32) for n in names},
        "truncated": (~np.asarray(s.stopped[rows], bool)).astype(np.float32),
        "chain_id": np.arange(self.cfg.group_size, dtype=np.int32),
        "segment": np.zeros(self.cfg.group_size, np.int32),
        "prompt_length": prompt_length,
        "length": lengths,
    }
    if self.model.n_moe_layers:
      group["expert_ids"] = np.asarray(s.expert_ids[:, rows], np.int32)
    return group

  # -- the loop ------------------------------------------------------------------------------------------------------

  def step(self, stop: Callable[[], bool] = lambda: False) -> int:
    """One iteration (see the module docstring); returns the number of groups committed (0 when not admitted)."""
    self.refresh_weights()
    tickets = self._take_tickets()
    if not tickets:
      return 0
    tasks = [self.suite.task(t["split"], t["task_index"]) for _, t in tickets]
    start_version = self.version
    t0 = time.perf_counter()
    if self.cfg.episodes is EpisodeKind.MULTI_TURN:
      trajectories = self.sample_episodes(tasks, [t["sample_seed"] for _, t in tickets],
                                          [(t["split"], int(t["task_index"])) for _, t in tickets])
      g = self.cfg.group_size
      groups = [self._episode_group(trajectories[i * g:(i + 1) * g]) for i in range(len(tasks))]
    else:
      out = self.sample(tasks, _seed(*(t["sample_seed"] for _, t in tickets)), stop)
      groups = [self._group(out, g, task) for g, task in enumerate(tasks)]
    self.stats.sampling_s += time.perf_counter() - t0
    metas = [{"task_id": task.task_id, "actor": self.actor_id, "start_version": start_version,
              "end_version": self.version, "sample_seed": ticket["sample_seed"], "time": time.time()}
             for (_, ticket), task in zip(tickets, tasks)]
    # One write per array for the whole call, then the groups' commit records (each group still whole or absent).
    self.writer.commit_many(groups, metas, ticket_ids=[ticket_id for ticket_id, _ in tickets])
    self.stats.groups += len(groups)
    self.stats.resumed_groups += sum(ticket_id in self._unfinished for ticket_id, _ in tickets)
    self.stats.rows += sum(int(g["tokens"].shape[0]) for g in groups)
    self.stats.tokens += int(sum(g["loss_mask"].sum() for g in groups))
    return len(tickets)

  def run(self, stop: Callable[[], bool] = lambda: False, max_groups: int | None = None,
          on_step: Callable[[Actor], None] | None = None) -> ActorStats:
    """Loops until `stop()` or `max_groups` groups are committed."""
    if not self.wait_for_weights(stop):
      return self.stats
    while not stop() and (max_groups is None or self.stats.groups < max_groups):
      if not self.step(stop):
        t0 = time.perf_counter()
        if self._contended:  # lost a race for the budget: another actor may back off too, so retry soon, apart
          time.sleep(self._jitter.uniform(0.0, self.cfg.poll_interval_s))
        else:
          self._wait_for_progress(stop)
        self.stats.waited_s += time.perf_counter() - t0
      elif on_step is not None:
        on_step(self)
    return self.stats

  def _wait_for_progress(self, stop: Callable[[], bool]) -> None:
    """After a refused admission: sleeps until the trainer's progress changes (what can admit this actor), polling
    trainer.json alone every `poll_interval_s`, and at most `admission_recheck_s` (a full re-check then catches
    what progress does not show: a gone actor's lease running out, a cancelled ticket)."""
    seen = admission.read_progress(self.buffer_url)
    deadline = time.perf_counter() + self.cfg.admission_recheck_s
    while not stop() and time.perf_counter() < deadline:
      self.writer.heartbeat(self.cfg.pending_lease_s / 4)
      time.sleep(self.cfg.poll_interval_s)
      if admission.read_progress(self.buffer_url) != seen:
        return
