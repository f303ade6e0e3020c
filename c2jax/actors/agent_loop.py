"""The agent loop: multi-turn episodes through the slot engine with continuous batching, tools on host workers
overlapping generation, and a token ledger per trajectory (report section 4: RL episodes are agent sessions that
read, edit, run and test; section 6: in-flight weight updates).

  runner = AgentRunner(model_cfg, EngineConfig(slots=8, context=2048), sampling, AgentConfig(max_turns=8), tok)
  trajectories = runner.run([Episode(prompt=ids, make_env=lambda: suite.agent_env(task), key=k), ...],
                            weights=lambda: (params, version))

One loop iteration (`AgentRunner.run`; an episode in a slot is in one `_Phase`, which says the stage that takes it
next):
  1. `_admit`: free slots take the next queued episodes (their environments start on a tool worker at once);
  2. `_append_pieces`: one `engine.append` feeds everything waiting to be appended: new prompts (prefill),
     observations (chunked prefill at the slot's offset, after the pending last token of its turn), a new segment's
     head, and final feeds of finished episodes, whose rows are then read from their slots (freed for step 1) while
     their grading (`AgentEnv.reward`) runs on a tool worker; long appends go in chunks of the largest bucket;
  3. `_decode_turns`: one `engine.force` advances every turn a script forces by up to a chunk of its tokens in one
     forward (`ForcedTurns.PREFILL`), and one `engine.decode` of `chunk_steps` steps runs every slot whose turn is
     sampled, with the newest weights (`weights()` is asked before every device call: an actor swaps in newer
     weights there, the caches stay);
  4. `_end_turns`: slots whose turn ended hand their text to a tool worker (`AgentEnv.step`); their KV stays where
     it is;
  5. `_take_tool_results`: finished tool calls come back as observation tokens (or end the episode);
     `_take_gradings`: finished gradings become trajectories.
When nothing can run on the device, the loop waits for the first tool worker to finish. With a `feed` the run is
open-ended: new episodes join the queue at the top of every iteration (a server's requests, continuous batching;
`c2jax.services.openai_server`), and each trajectory goes to `on_trajectory` as it is done.

An environment that raises ends its episode alone (EpisodeEnd.ENV_ERROR, reward terms `ENV_ERROR_TERMS`). One lost
with its host (`EnvLost`: a remote environment server that stopped answering) drops that attempt whole and runs the
episode again from its start in a fresh environment, with the same key (`RunStats.env_reruns`; at most
`MAX_ENV_RERUNS` times, then ENV_ERROR): each episode returns exactly one trajectory.

Budgets per episode: `max_turns` model turns, `max_turn_tokens` per turn, `max_episode_tokens` model tokens in all
(summaries not counted: they have their own budget), the slot's context, and the environment's own budgets
(CodingEnv's tool wall time, workdir caps). A turn that spends a budget still runs its tool calls; then the episode
ends, recorded as cut (`ledger.EpisodeEnd`).

Self-summaries (`SummaryConfig`, report section 4). Without them an observation that would overflow the slot ends
the episode (EpisodeEnd.CONTEXT: the truncation baseline). With them, when an observation comes back and the slot
would hold `trigger_tokens` positions, or the next turn would leave no room for a summary:
  a. the summary request (`c2jax.envs.chat.self_summary.request`) is appended after the observation (or, if the
     observation does not fit beside a summary, instead of it: it is carried into the next segment), and the model's
     next turn is its summary, within `max_tokens` (no tool runs);
  b. the summary's last token is fed (routing replay) and the segment is read out of the slot as a row;
  c. the slot is rewound to the task's first observation, whose cache stays (`engine.append` keep), and the new
     segment appends the summary framed (`self_summary.resume`) and the carried observation; the episode's next turn
     is drawn there, with its environment (sandbox, repository, budgets) as the agent left it.
A summary that runs past `max_tokens` ends the episode as cut (SUMMARY_BUDGET), and so does a context that fills
in the last of `max_segments` segments (SEGMENT_LIMIT). Normal turns end `max_tokens` + the request's length before
the context's end while a summary may still follow, so one always fits.

Chat formats (`chat_format=`, `c2jax.envs.chat.chat_tokens.ChatTokens`): "brief" is raw text (BOS + the first
observation, turns ended by EOS, the summary request and the framed summary appended as text). A native format
(a real model's template) ends turns with its end-of-turn token, decodes them with their control tokens, appends
the template's continuation after each turn, asks for a summary with a user turn in place of the generation prompt,
and starts the next segment with the prompt re-rendered around the summary, keeping the cache of the prefix the
two prompts share; an observation that does not fit beside a summary ends such an episode (CONTEXT). In every
format the environment's text (observations, notices, the framed summary) is appended with special-token matching
off (`ChatTokens.encode_text` / `encode_markup`): only the template's structure writes control ids.

A trajectory does not depend on its slot or on the other episodes (each draws with its own key and draw index),
so a run with S slots equals running each episode alone with the same keys (tests/actors/agent_loop_test.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import enum
import functools
import sys
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np
import tqdm

from c2jax.actors import engine as engine_lib
from c2jax.actors import placement
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import EpisodeEnd, Segment, Source, Trajectory
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.chat import self_summary
from c2jax.envs.core.agent_env import AgentEnv, EnvLost, TurnResult
from c2jax.envs.chat.chat_format import Continuation
from c2jax.envs.chat.chat_tokens import ChatTokens, prefix_length
from c2jax.model.config import ModelConfig
from c2jax.model.sharding import Layout
from c2jax.sandbox.sandbox import SandboxUnavailable

# The reward terms of an episode whose environment raised (EpisodeEnd.ENV_ERROR): the outcome is 0, and a term a
# buffer expects that is missing here reads as 0 (`actor.episode_group`).
ENV_ERROR_TERMS: Mapping[str, float] = {"outcome": 0.0, "env_error": 1.0}
# Runs of one episode after the first whose environment was lost with its host (`EnvLost`): a task that takes down
# every environment server it runs on ends as ENV_ERROR after these, instead of taking down the rest in turn.
MAX_ENV_RERUNS = 2


@dataclasses.dataclass(frozen=True)
class Episode:
  """One episode to run.

  Attributes:
    prompt: the prompt's ids (`ChatTokens.prompt`: BOS and the first observation for brief, the rendered system
      and user messages and the generation prompt for a native chat format).
    make_env: builds the episode's environment (called on the loop's thread; `reset` runs on a tool worker).
    key: the episode's PRNG key (typed) or an int seed.
    script: (turn, observations) -> the turn's text to force through the engine, its ids (the text's ids and the
      token that ends the turn, as a sampled turn drew them: a served conversation's earlier turns), or None to
      sample it; the observations are the texts so far (the prompt's first, then each turn's tool results and
      notice). Forced turns need `EngineConfig.max_forced`; their tokens (the text's ids and EOS) carry the
      model's log-probs of them, read from one forward per chunk of the turn or decoded step by step
      (`AgentConfig.forced_turns`).
    first_observation: the prompt's user message; a native chat format re-renders the prompt from it when a
      self-summary starts a new segment (brief appends the framed summary and needs none).
    turn_tokens: the budgets of the first turns, turn i's at [i] (a served request: its forced history turns'
      lengths, then its max_tokens; a user interrupting turn i mid-way: its cut, after which the environment appends
      the user's message, `c2jax.envs.tasks.interruptions.turn_tokens`); `AgentConfig.max_turn_tokens` for the
      turns past them. A turn that reaches its budget ends there, the episode goes on (unless a budget of the
      episode is spent).
    on_tokens: (turn, ids) called after every device call that advanced one of the episode's turns, with the
      turn's ids so far (a served request streams them); None: not called.
  """

  prompt: Sequence[int]
  make_env: Callable[[], AgentEnv]
  key: jax.Array | int = 0
  script: Callable[[int, Sequence[str]], str | np.ndarray | None] | None = None
  first_observation: str = ""
  turn_tokens: tuple[int, ...] = ()
  on_tokens: Callable[[int, np.ndarray], None] | None = None


@dataclasses.dataclass(frozen=True)
class SummaryConfig:
  """Self-summarization inside the engine (see the module docstring; report section 4).

  Attributes:
    trigger_tokens: a segment ends with a summary once the slot would hold this many positions after an
      observation (or sooner, when the next turn would leave no room for one); 0: no summaries (the truncation
      baseline: an episode whose next observation does not fit its slot is cut).
    max_tokens: the budget of one summary turn; a summary that does not end within it ends the episode as cut.
    max_segments: segments per episode (summaries written + 1).
  """

  trigger_tokens: int = 0
  max_tokens: int = 128
  max_segments: int = 4

  def __post_init__(self):
    if self.trigger_tokens < 0 or self.max_tokens < 1 or self.max_segments < 1:
      raise ValueError(f"SummaryConfig: trigger_tokens={self.trigger_tokens} must be >= 0 (0: off), "
                       f"max_tokens={self.max_tokens} and max_segments={self.max_segments} >= 1.")

  @property
  def enabled(self) -> bool:
    return self.trigger_tokens > 0 and self.max_segments > 1


class ForcedTurns(enum.Enum):
  """How the engine runs a turn an episode's script forces (`Episode.script`): its tokens are known, so the model
  only scores them."""

  PREFILL = "prefill"  # in chunks of the largest bucket, one forward each (`engine.force`)
  DECODE = "decode"  # step by step as a sampled turn is run (the engine's real schedule: benchmarks, parity tests)


@dataclasses.dataclass(frozen=True)
class AgentConfig:
  """Budgets and scheduling of the agent loop.

  Attributes:
    max_turns: model turns per episode.
    max_turn_tokens: model tokens per turn.
    max_episode_tokens: model tokens over the whole episode.
    chunk_steps: decode steps between host checks (ended turns, finished tools, newer weights).
    tool_workers: threads running environments (sandbox start, tool calls, grading).
    tool_cpus: CPUs of the tool workers and the sandboxes they start, e.g. "1" or "4-7" (`placement.parse_cpus`);
      empty: wherever this process runs. On a host whose cores also run the model, tools on their own cores are
      what a cluster does with sandboxes on other machines.
    summary: self-summarization (off by default).
    forced_turns: how scripted turns run (`ForcedTurns`); the trajectories are the same either way (tokens and
      versions exactly, log-probs and expert ids as the model computes a chunk against a step).
    force_chunk: at most this many tokens of each forced turn per forward (rounded up to an engine bucket): every
      forcing slot is padded to the call's chunk, so one long turn in a large chunk costs the short ones beside it
      (docs/benchmarks.md, tools/bench_forced_turns.py).
  """

  max_turns: int = 8
  max_turn_tokens: int = 256
  max_episode_tokens: int = 2048
  chunk_steps: int = 16
  tool_workers: int = 4
  tool_cpus: str = ""
  summary: SummaryConfig = SummaryConfig()
  forced_turns: ForcedTurns = ForcedTurns.PREFILL
  force_chunk: int = 64

  def __post_init__(self):
    for name in ("max_turns", "max_turn_tokens", "max_episode_tokens", "chunk_steps", "tool_workers", "force_chunk"):
      if getattr(self, name) < 1:
        raise ValueError(f"AgentConfig.{name}={getattr(self, name)} must be >= 1.")
    placement.parse_cpus(self.tool_cpus)  # one sentence on a bad list


@dataclasses.dataclass
class RunStats:
  """What one `run` did, for the benchmark and the actor's metrics.

  positions: positions of all finished trajectories; positions_fed: positions the model was run on (appends and
  decode steps); their difference is what was prefilled twice (0 by construction). decode_intervals / tool
  intervals: wall-clock spans of device decode (and force) calls and of tool-worker calls, for the overlap fraction.
  slot_s: slot-seconds of the runs; slot_wait_s: slot-seconds in which a slot only held a cache while its tools ran
  and episodes were queued (the capacity offloading waiting caches to host memory could give back).
  """

  episodes: int = 0
  model_tokens: int = 0
  summaries: int = 0
  positions: int = 0
  positions_fed: int = 0
  appends: int = 0
  decodes: int = 0
  forces: int = 0
  weight_swaps: int = 0
  env_errors: int = 0
  env_reruns: int = 0
  wall_s: float = 0.0
  slot_s: float = 0.0
  slot_wait_s: float = 0.0
  decode_intervals: list = dataclasses.field(default_factory=list)
  tool_intervals: list = dataclasses.field(default_factory=list)

  @property
  def reprefill_fraction(self) -> float:
    return (self.positions_fed - self.positions) / max(self.positions, 1)

  @property
  def slot_wait_fraction(self) -> float:
    return self.slot_wait_s / max(self.slot_s, 1e-9)

  @property
  def tool_overlap(self) -> float:
    """The fraction of tool wall time during which the device was decoding other slots."""
    return overlap_fraction(self.tool_intervals, self.decode_intervals)


def overlap_fraction(spans: Sequence[tuple[float, float]], cover: Sequence[tuple[float, float]]) -> float:
  """sum over `spans` of their length covered by the union of `cover`, over their total length."""
  total = sum(max(0.0, b - a) for a, b in spans)
  if total <= 0:
    return 0.0
  merged: list[list[float]] = []
  for a, b in sorted(cover):
    if merged and a <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], b)
    else:
      merged.append([a, b])
  starts = np.array([m[0] for m in merged]) if merged else np.zeros(0)
  ends = np.array([m[1] for m in merged]) if merged else np.zeros(0)
  covered = 0.0
  for a, b in spans:
    covered += float(np.sum(np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None)))
  return covered / total


class _Phase(enum.Enum):
  """Where an episode in a slot stands between two device calls (before it has a slot it is queued; after it leaves
  its slot it is graded on a tool worker, and then its trajectory is done).

  A new episode starts APPENDING its prompt; the append of its last piece draws its turn's first token: DECODING;
  an ended model turn goes IN_TOOL, and its result brings it back to APPENDING (an observation, maybe a summary
  request) or ends it: FINISHING; an ended summary turn is CLOSING, and its next segment starts APPENDING (or the
  episode is FINISHING when that segment would have no room).
  """

  APPENDING = enum.auto()  # pieces wait for `engine.append`; the last one draws the turn's first token
  DECODING = enum.auto()  # its turn runs on the device
  IN_TOOL = enum.auto()  # its ended model turn runs on a tool worker; the slot keeps its cache
  CLOSING = enum.auto()  # its summary ended: the next append feeds the summary's last token, then a new segment
  FINISHING = enum.auto()  # it ended: the next append feeds its last token (routing replay), then it leaves


@dataclasses.dataclass(frozen=True)
class _Piece:
  """One slot's part of an `engine.append` call.

  Attributes:
    ids: the tokens appended (at most the largest bucket less one: room for a pending token).
    reset: the slot starts a new episode (its key is set; nothing of the slot's cache is kept).
    keep: >= 0: the slot is rewound to its first `keep` positions first (a new segment); -1: no rewind.
    draw: the last piece before a turn: the append draws the turn's first token.
    turn_end: the position the turn may not reach (with `draw`).
    key: the episode's PRNG key (used with `reset`).
    start: the slot position of the first of `ids` (0 with `reset`, `keep` with a rewind, else the slot's length).
    pending: 1 if the slot's drawn last token is fed before `ids` (never with `reset` or a rewind), else 0.
  """

  ids: list[int]
  reset: bool = False
  keep: int = -1
  draw: bool = False
  turn_end: int = 0
  key: jax.Array | None = None
  start: int = 0
  pending: int = 0

  @property
  def fed(self) -> int:
    """Positions the model runs on for this piece."""
    return len(self.ids) + self.pending


@dataclasses.dataclass
class _Run:
  """Host bookkeeping of one episode in a slot (tokens, source, turn and observations: its current segment)."""

  index: int
  env: AgentEnv
  phase: _Phase = _Phase.APPENDING  # a new episode first appends its prompt
  pieces: list = dataclasses.field(default_factory=list)  # [`_Piece`] still to append (APPENDING)
  tool: concurrent.futures.Future | None = None  # the tool call of its last turn (IN_TOOL)
  tokens: list = dataclasses.field(default_factory=list)
  source: list = dataclasses.field(default_factory=list)
  turn: list = dataclasses.field(default_factory=list)
  observations: list = dataclasses.field(default_factory=list)  # texts of the segment, for a script
  turns: int = 0  # model turns, summaries included (the ledger's turn index)
  summaries: int = 0  # summary turns written
  summarizing: bool = False  # the running (or next) model turn is a summary
  carried: list = dataclasses.field(default_factory=list)  # [(ids, Source)] held back for the next segment
  segments: list = dataclasses.field(default_factory=list)  # finished segments (`Segment`), oldest first
  summary_text: str = ""  # the last summary's text (without its stop token)
  last_text: str = ""  # the last model turn's text (a native format re-renders its results with a summary request)
  unended: bool = False  # the last model turn (native format) was cut before its end-of-turn token
  kept: int = 0  # positions of the segment reused from the slot's cache (a later segment's task prompt)
  model_tokens: int = 0
  end: EpisodeEnd | None = None
  retokenized: int = 0
  last_stopped: bool = False
  tool_s: float = 0.0
  started: concurrent.futures.Future | None = None
  error: str = ""  # what the environment raised (EpisodeEnd.ENV_ERROR), "" if nothing
  lost: bool = False  # the environment was lost with its host (`EnvLost`): the episode runs again from its start

  def add(self, ids, source: Source, turn: int) -> None:
    self.tokens += [int(i) for i in ids]
    self.source += [int(source)] * len(ids)
    self.turn += [turn] * len(ids)


@dataclasses.dataclass(frozen=True)
class _SlotView:
  """What the host reads of the slots after a device call: length, decoding (the turn still runs), turn_start and
  stopped (the turn ended on a stop token), each [S]."""

  length: np.ndarray
  decoding: np.ndarray
  turn_start: np.ndarray
  stopped: np.ndarray


@dataclasses.dataclass
class _Loop:
  """One `AgentRunner.run` in progress; mutable by design: each stage of the loop advances it.

  Attributes:
    episodes: what the run runs.
    weights: () -> (params, version), asked before every device call.
    pool: the tool workers.
    request_text: the summary request's text (empty without summaries).
    request_ids: the request's tokens as appended after a turn's results: brief appends the text after the
      notice; a native format renders it as a user turn in place of the generation prompt, whose tokens (the
      turn's framing) bound it here.
    reserve: positions a summary needs after a segment's last one: the request and the summary's budget.
    queue: indices of the episodes still waiting for a slot.
    results: the trajectories, by episode index (None until graded).
    slot_run: each slot's episode (None: free).
    host_len: [S] what the host knows of each slot between device calls: its length (a drawn token included)...
    pending: [S] ... and whether its drawn last token is still unfed (1) or not (0).
    known_len: [S] each slot's length as of the last device call (the attention window's bound).
    forced_left: [S] tokens of the slot's forced turn not yet written (0: its turn is sampled), as the host
      bounds them (the device stops a turn at its budget first).
    grading: the gradings running on tool workers -> the trajectory's fields read from its slot.
    reruns: episodes run again after their environment was lost (`EnvLost`), by index.
    last_version: the weights version of the last device call (weight swaps are counted against it).
    tick: when the slot-seconds were last counted.
    on_trajectory: where done trajectories go instead of `results` (`AgentRunner.run`).
  """

  episodes: list
  weights: Callable[[], tuple[object, int]]
  pool: concurrent.futures.ThreadPoolExecutor
  request_text: str
  request_ids: np.ndarray
  reserve: int
  queue: collections.deque
  results: list
  slot_run: list
  host_len: np.ndarray
  pending: np.ndarray
  known_len: np.ndarray
  forced_left: np.ndarray
  grading: dict = dataclasses.field(default_factory=dict)
  reruns: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by episode index
  last_version: int | None = None
  tick: float = dataclasses.field(default_factory=time.perf_counter)
  on_trajectory: Callable[[int, Trajectory], None] | None = None

  @property
  def running(self) -> bool:
    """Episodes are queued, in slots or being graded."""
    return bool(self.queue) or any(r is not None for r in self.slot_run) or bool(self.grading)

  def slots_in(self, *phases: _Phase) -> list[int]:
    """The slots whose episode is in one of `phases`, ascending."""
    return [slot for slot, run in enumerate(self.slot_run) if run is not None and run.phase in phases]

  def mask(self, phase: _Phase) -> np.ndarray:
    """[S] bool: the slots whose episode is in `phase`."""
    return np.asarray([run is not None and run.phase is phase for run in self.slot_run], bool)


@jax.jit
def _slot_tokens(tokens: jax.Array, slot) -> jax.Array:
  """[C] the tokens of one slot (the slot index traced: one program for every slot)."""
  return jax.lax.dynamic_index_in_dim(tokens, slot, axis=0, keepdims=False)


@jax.jit
def _slot_rows(state: engine_lib.SlotState, slot):
  """A slot's tokens, logprobs, versions [C] and expert ids [Lm, C, K]."""
  take = lambda a, axis=0: jax.lax.dynamic_index_in_dim(a, slot, axis=axis, keepdims=False)
  return take(state.tokens), take(state.logprobs), take(state.versions), take(state.expert_ids, 1)


_COMPILES_ANNOUNCED: set[str] = set()  # (model, engine shapes) whose first run this process announced


class AgentRunner:
  """Runs episodes through the engine's slots (see the module docstring); one runner per model and shapes.

  Args:
    model: the architecture.
    engine: slots, context per slot, chunk buckets.
    sampling: how tokens are drawn; `max_new_tokens` is unused (the turn budget is `agent.max_turn_tokens`);
      stop tokens (EOS) and stop sequences end a turn.
    agent: budgets and scheduling.
    tokenizer: encodes observations (once each) and decodes the model's turns for the tools.
    layout: a data/expert mesh (`c2jax.model.sharding.Layout`), or None for one device.
    chat_format: the episodes' chat format (`c2jax.envs.chat.chat_format.CHAT_FORMATS`), as their environments speak
      it: "brief" (raw text, turns end with EOS), or a native format whose end-of-turn token joins the stop tokens,
      whose turns are decoded with their control tokens, and whose summaries are user turns re-rendered by the
      template (`ChatTokens`).
  """

  def __init__(self, model: ModelConfig, engine: EngineConfig, sampling: SamplingConfig, agent: AgentConfig,
               tokenizer, layout: Layout | None = None, chat_format: str = "brief"):
    self.chat = ChatTokens.of(chat_format, tokenizer)
    # The engine ignores max_new_tokens (turns end at their budget): one value keeps one compiled program.
    sampling = dataclasses.replace(sampling, max_new_tokens=1)
    if self.chat.native and self.chat.end_of_turn_id not in sampling.stop_tokens:
      sampling = dataclasses.replace(sampling, stop_tokens=tuple(sampling.stop_tokens) + (self.chat.end_of_turn_id,))
    self.model, self.engine, self.sampling, self.agent, self.tokenizer = model, engine, sampling, agent, tokenizer
    self.layout = layout
    self.stats = RunStats()
    self._state = engine_lib.init_state(model, engine, sampling, layout=layout)
    # Episode keys of the slots, passed to every append (apart from the state, which each call donates).
    self._keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(0), np.arange(engine.slots))
    self._kw = dict(cfg=model, sampling=sampling, layout=layout)

  # -- device calls ---------------------------------------------------------------------------------------------

  def _append(self, params, version, pieces: dict[int, _Piece], forced_turns: dict[int, np.ndarray]):
    """One append call: pieces[slot] = what the slot appends; forced_turns[slot] = a forced turn's ids. The
    attention window is bounded by the largest new length of a slot taking part.

    Only the taking-part slots are computed (`engine.append` rows, padded with idle slots to a row bucket), so
    an observation arriving alone costs its own slot, not all S; under a mesh every slot is."""
    s = self.engine.slots
    c = self.engine.bucket(max(max(p.fed for p in pieces.values()), 1))
    subset = self._rows(sorted(pieces))
    rows = list(range(s)) if subset is None else [int(i) for i in subset]
    k = len(rows)
    chunk = np.zeros((k, c), np.int32)
    lengths = np.zeros((k,), np.int32)
    reset = np.zeros((k,), bool)
    draw = np.zeros((k,), bool)
    turn_end = np.zeros((k,), np.int32)
    take_part = np.zeros((k,), bool)
    keep = np.full((k,), -1, np.int32)
    keys = self._keys
    for i, slot in enumerate(rows):
      if slot not in pieces:
        continue
      p = pieces[slot]
      take_part[i] = True
      chunk[i, :len(p.ids)] = p.ids
      lengths[i] = len(p.ids)
      reset[i], draw[i], turn_end[i], keep[i] = p.reset, p.draw, p.turn_end, p.keep
      if p.reset:
        keys = keys.at[slot].set(p.key)
      self.stats.positions_fed += p.fed
    self._keys = keys
    forced, forced_len = self._forced(rows, forced_turns)
    self._state = engine_lib.append(params, self._state, chunk, lengths, take_part=take_part, reset=reset, draw=draw,
                                    turn_end=turn_end, keys=keys if subset is None else keys[subset],
                                    version=version, forced=forced, forced_len=forced_len, keep=keep,
                                    window=self.engine.window(max(p.start + p.fed for p in pieces.values())),
                                    rows=subset, **self._kw)
    self.stats.appends += 1

  def _forced(self, rows: list[int], forced_turns: dict[int, np.ndarray]):
    """The append's forced turns ([k, max_forced] ids, [k] lengths) of its rows, or (None, None) without them."""
    if not self.engine.max_forced:
      if forced_turns:
        raise ValueError("An episode's script forces a turn, but EngineConfig.max_forced is 0.")
      return None, None
    forced = np.zeros((len(rows), self.engine.max_forced), np.int32)
    forced_len = np.zeros((len(rows),), np.int32)
    for i, slot in enumerate(rows):
      if slot in forced_turns:
        ids = forced_turns[slot][:self.engine.max_forced]
        forced[i, :len(ids)] = ids
        forced_len[i] = len(ids)
    return forced, forced_len

  def _announce_compiles(self, how: str) -> None:
    """The engine's programs compile on the first run of a model and shapes in a process (minutes on a CPU, with
    nothing else to show): said once, above any progress bar, so that the wait does not look like a hang."""
    key = repr((self.model, self.engine, self.layout is None))
    if key not in _COMPILES_ANNOUNCED:
      _COMPILES_ANNOUNCED.add(key)
      tqdm.tqdm.write(f"compiling the agent engine's programs ({self.engine.slots} slots x {self.engine.context} "
                      f"positions; {how})", file=sys.stderr)

  def compile_programs(self, params) -> int:
    """Compiles (or reads from the persistent compilation cache) every program `run` can call at these shapes, so
    that a later run compiles none, whichever shapes its episodes meet: appends (and forced turns) per (rows,
    chunk, window), decodes per (rows, window), rows each row bucket and all S (`EngineConfig.rows`). Each is called
    once with no slot taking part, which leaves every slot as it was. Returns how many programs.

    Worth it where a run meets most of the set anyway (`configs/rl_tiny.py`'s buckets: docs/benchmarks.md,
    "tools/bench_main_job.py"); with many buckets it compiles programs no run would meet.
    """
    self._announce_compiles("the whole set, before the first run")
    e, s = self.engine, self.engine.slots
    counts = (s,) if self.layout is not None else (*e.row_counts(), s)
    chunks = e.chunk_sizes
    forcing = e.max_forced > 0 and self.agent.forced_turns is ForcedTurns.PREFILL
    force_chunks = [c for c in chunks if c <= e.bucket(min(self.agent.force_chunk, chunks[-1]))] if forcing else []
    n = 0
    for k in counts:
      rows = None if k == s else np.arange(k, dtype=np.int32)
      keys = self._keys if rows is None else self._keys[rows]
      idle, zeros = np.zeros((k,), bool), np.zeros((k,), np.int32)
      forced, forced_len = self._forced(list(range(k)), {})
      for window in e.windows():
        for c in chunks:
          self._state = engine_lib.append(params, self._state, np.zeros((k, c), np.int32), zeros, take_part=idle,
                                          reset=idle, draw=idle, turn_end=zeros, keys=keys, version=0,
                                          forced=forced, forced_len=forced_len, window=window, rows=rows, **self._kw)
        for c in force_chunks:
          self._state = engine_lib.force(params, self._state, chunk=c, version=0, window=window, rows=rows,
                                         **self._kw)
        self._state = engine_lib.decode(params, self._state, steps=self.agent.chunk_steps, version=0,
                                        window=window, rows=rows, **self._kw)
        n += len(chunks) + len(force_chunks) + 1
    jax.block_until_ready(self._state)
    return n

  def _rows(self, slots) -> np.ndarray | None:
    """The rows a device call computes: `slots` padded with idle ones to a row bucket (`EngineConfig.rows`: each
    compiles once), or None for all S (under a mesh, whose shards need every slot, too)."""
    s, k = self.engine.slots, self.engine.rows(len(slots))
    if k >= s or self.layout is not None:
      return None
    chosen = set(int(i) for i in slots)
    return np.asarray(sorted(chosen) + [i for i in range(s) if i not in chosen][:k - len(chosen)], np.int32)

  def _weights(self, loop: _Loop) -> tuple[object, int]:
    """The newest (params, version), asked before every device call (an actor swaps in newer weights there)."""
    params, version = loop.weights()
    self.stats.weight_swaps += loop.last_version is not None and version != loop.last_version
    loop.last_version = version
    return params, version

  def _view(self) -> _SlotView:
    return _SlotView(*jax.device_get((self._state.length, self._state.decoding, self._state.turn_start,
                                      self._state.stopped)))

  # -- the loop -------------------------------------------------------------------------------------------------

  def run(self, episodes: Sequence[Episode], weights: Callable[[], tuple[object, int]],
          on_chunk: Callable[[], None] | None = None,
          feed: Callable[[bool], Sequence[Episode] | None] | None = None,
          on_trajectory: Callable[[int, Trajectory], None] | None = None) -> list[Trajectory | None]:
    """Runs every episode to its end; returns their trajectories in order (see the module docstring, whose steps
    1 to 5 are the stages below; an episode's `_Phase` says which of them takes it next).

    Args:
      episodes: what to run.
      weights: () -> (params, version), asked before every device call (in-flight updates swap params there).
      on_chunk: called once per loop iteration (an actor renews its lease there).
      feed: (idle) -> more episodes, queued behind the others and numbered after them, or None once no more will
        come; asked once per loop iteration while it has not returned None, and the run lasts until then (a
        server's loop: requests join the running episodes between device calls). `idle`: nothing is queued, in a
        slot or graded, so it may block until an episode comes.
      on_trajectory: (index, trajectory) called as each trajectory is done; its place in the returned list then
        stays None (a server's loop keeps none of them).
    """
    t_run = time.perf_counter()
    self._announce_compiles("first call, cached after")
    loop = self._start(episodes, weights)
    loop.on_trajectory = on_trajectory
    try:
      while loop.running or feed is not None:
        if feed is not None:
          more = feed(not loop.running)
          if more is None:
            feed = None
          else:
            self._queue(loop, more)
          if not loop.running:
            continue
        self._count_slot_time(loop)
        if on_chunk is not None:
          on_chunk()
        self._admit(loop)
        self._append_pieces(loop)
        view = self._decode_turns(loop)
        self._report_tokens(loop, view)
        self._end_turns(loop, view)
        self._take_tool_results(loop)
        self._take_gradings(loop)
    finally:
      self._shut_down(loop)
    self.stats.wall_s += time.perf_counter() - t_run
    return loop.results

  def _start(self, episodes: Sequence[Episode], weights: Callable[[], tuple[object, int]]) -> _Loop:
    """Checks the episodes' prompts against the slots' context and starts the tool workers: the loop's state."""
    summary, native = self.agent.summary, self.chat.native
    request_text = self.chat.format.summary_request(summary.max_tokens) if summary.enabled else ""
    request_ids = (self.chat.encode_markup(self.chat.format.continuation("", (), "", request=request_text)
                                           .notice_markup) if native else self.chat.encode_text(request_text))
    reserve = len(request_ids) + summary.max_tokens if summary.enabled else 0
    for i, ep in enumerate(episodes):
      self._check_episode(i, ep, reserve)
    s = self.engine.slots
    pool = concurrent.futures.ThreadPoolExecutor(
        self.agent.tool_workers, thread_name_prefix="agent-tools",
        initializer=functools.partial(placement.pin_thread, placement.parse_cpus(self.agent.tool_cpus)))
    return _Loop(episodes=list(episodes), weights=weights, pool=pool, request_text=request_text,
                 request_ids=request_ids, reserve=reserve, queue=collections.deque(range(len(episodes))),
                 results=[None] * len(episodes), slot_run=[None] * s, host_len=np.zeros(s, np.int64),
                 pending=np.zeros(s, np.int64), known_len=np.zeros(s, np.int64), forced_left=np.zeros(s, np.int64))

  def _check_episode(self, i: int, ep: Episode, reserve: int) -> None:
    """Refuses (one sentence) an episode whose prompt does not fit a slot beside a summary's reserve."""
    context = self.engine.context
    if len(ep.prompt) < 1 or len(ep.prompt) + reserve >= context:
      raise ValueError(f"Episode {i} has a {len(ep.prompt)}-token prompt; it needs 1 to {context - 1 - reserve} "
                       f"tokens (the engine's context is {context}"
                       + (f", {reserve} of them kept for a summary)." if reserve else ")."))
    if self.chat.native and self.agent.summary.enabled and not ep.first_observation:
      raise ValueError(f"Episode {i} has no first_observation; chat format {self.chat.format.name!r} re-renders "
                       "the prompt from it after a self-summary.")

  def _queue(self, loop: _Loop, episodes: Sequence[Episode]) -> None:
    """Episodes a `feed` brought: checked, numbered after the run's others and queued."""
    for ep in episodes:
      self._check_episode(len(loop.episodes), ep, loop.reserve)
      loop.queue.append(len(loop.episodes))
      loop.episodes.append(ep)
      loop.results.append(None)

  def _report_tokens(self, loop: _Loop, view: _SlotView) -> None:
    """Each DECODING episode with `on_tokens`: its running (or just ended) turn's ids so far."""
    for slot in loop.slots_in(_Phase.DECODING):
      run = loop.slot_run[slot]
      on_tokens = loop.episodes[run.index].on_tokens
      if on_tokens is not None:
        ids = np.asarray(jax.device_get(_slot_tokens(self._state.tokens, slot)))
        on_tokens(run.turns, ids[view.turn_start[slot]:view.length[slot]])

  def _shut_down(self, loop: _Loop) -> None:
    """Stops the tool workers and closes the environments of episodes still in slots (after an error)."""
    loop.pool.shutdown(wait=True, cancel_futures=True)
    for run in loop.slot_run:
      if run is not None:
        try:
          run.env.close()
        except Exception:  # noqa: BLE001  (on the way out: one env that fails to close must not keep the rest open)
          pass

  def _count_slot_time(self, loop: _Loop) -> None:
    """Slot-seconds since the last iteration, and those in which slots only held caches while episodes queued."""
    now = time.perf_counter()
    self.stats.slot_s += (now - loop.tick) * self.engine.slots
    if loop.queue:
      self.stats.slot_wait_s += (now - loop.tick) * len(loop.slots_in(_Phase.IN_TOOL))
    loop.tick = now

  def _timed(self, fn, run: _Run):
    """`fn` as a tool worker runs it: its wall time is counted in the episode's `tool_s` and in the tool
    intervals."""

    def call(*args):
      t0 = time.perf_counter()
      try:
        return fn(*args)
      finally:
        t1 = time.perf_counter()
        run.tool_s += t1 - t0
        self.stats.tool_intervals.append((t0, t1))

    return call

  def _can_summarize(self, run: _Run) -> bool:
    summary = self.agent.summary
    return summary.enabled and len(run.segments) + 1 < summary.max_segments

  def _turn_end(self, loop: _Loop, run: _Run, start: int) -> int:
    """The position a turn starting at `start` may not reach: its budget, the episode's and the context's."""
    agent, context = self.agent, self.engine.context
    if run.summarizing:
      return int(min(start + agent.summary.max_tokens, context))
    turn_tokens = loop.episodes[run.index].turn_tokens
    budget = turn_tokens[run.turns] if run.turns < len(turn_tokens) else agent.max_turn_tokens
    left = min(budget, agent.max_episode_tokens - run.model_tokens)
    # While a summary may follow, a turn leaves room for it (the request and the summary's budget).
    return int(min(start + left, context - (loop.reserve if self._can_summarize(run) else 0)))

  def _pieces(self, ids: list[int], keep: int = -1, reset: bool = False) -> list[_Piece]:
    """`ids` as appends of at most the largest bucket less one (room for a pending token); the first one resets
    the slot (`reset`) or rewinds it to `keep` (-1: no rewind)."""
    n = self.engine.chunk_sizes[-1] - 1
    return [_Piece(ids[k:k + n], reset=reset and k == 0, keep=keep if k == 0 else -1)
            for k in range(0, len(ids), n)] or [_Piece([], keep=keep)]

  def _admit(self, loop: _Loop) -> None:
    """Free slots take the next queued episodes: APPENDING their prompts, their environments starting (`reset`)
    on a tool worker at once."""
    for slot in range(self.engine.slots):
      if loop.slot_run[slot] is None and loop.queue:
        i = loop.queue.popleft()
        episode = loop.episodes[i]
        run = _Run(index=i, env=episode.make_env())
        run.started = loop.pool.submit(self._timed(run.env.reset, run))
        loop.slot_run[slot] = run
        prompt = [int(t) for t in episode.prompt]
        run.add(prompt, Source.PROMPT, 0)
        if episode.script is not None:
          run.observations.append(self.tokenizer.decode(prompt))
        run.pieces = self._pieces(prompt, reset=True)
        loop.host_len[slot] = 0
        loop.pending[slot] = 0

  def _append_pieces(self, loop: _Loop) -> None:
    """One `engine.append` feeds the next piece of every APPENDING slot (a slot whose last piece goes is DECODING)
    and the pending last token of every FINISHING and CLOSING one (for routing replay); then FINISHING episodes
    leave their slots and CLOSING ones start their next segment."""
    finishing, closing = loop.slots_in(_Phase.FINISHING), loop.slots_in(_Phase.CLOSING)
    pieces, forced_turns = self._next_pieces(loop)
    for slot in finishing + closing:
      pieces[slot] = _Piece([], start=loop.host_len[slot], pending=loop.pending[slot])
    if not pieces:
      return
    params, version = self._weights(loop)
    self._append(params, version, pieces, forced_turns)
    for slot, ids in forced_turns.items():  # the append drew the turn's first token
      loop.forced_left[slot] = max(min(len(ids), self.engine.max_forced) - 1, 0)
    for slot, piece in pieces.items():
      loop.host_len[slot] = piece.start + len(piece.ids)
      loop.known_len[slot] = loop.host_len[slot] + piece.draw
      loop.pending[slot] = 0
      run = loop.slot_run[slot]
      if run.phase is _Phase.APPENDING:
        run.pieces.pop(0)
        if not run.pieces:
          run.phase = _Phase.DECODING  # the turn started; read back after the decode (it may end on its first token)
    for slot in finishing:
      self._release(loop, slot)
    for slot in closing:
      self._next_segment(loop, slot)

  def _next_pieces(self, loop: _Loop) -> tuple[dict[int, _Piece], dict[int, np.ndarray]]:
    """Each APPENDING slot's next piece, placed in its slot (the last one with its turn's end), and the turns the
    episodes' scripts force."""
    pieces, forced_turns = {}, {}
    for slot in loop.slots_in(_Phase.APPENDING):
      run = loop.slot_run[slot]
      episode = loop.episodes[run.index]
      piece = run.pieces[0]
      last = len(run.pieces) == 1
      start = 0 if piece.reset else piece.keep if piece.keep >= 0 else loop.host_len[slot]
      end = self._turn_end(loop, run, start + len(piece.ids)) if last else 0
      key = jax.random.key(episode.key) if isinstance(episode.key, int) else episode.key
      pending = 0 if piece.reset or piece.keep >= 0 else loop.pending[slot]
      pieces[slot] = dataclasses.replace(piece, draw=last, turn_end=end, key=key, start=start, pending=pending)
      if last and episode.script is not None:
        text = episode.script(run.turns, run.observations)
        if text is not None:
          forced_turns[slot] = self.chat.turn_ids(text) if isinstance(text, str) else np.asarray(text, np.int32)
    return pieces, forced_turns

  def _release(self, loop: _Loop, slot: int) -> None:
    """A FINISHING episode (its last token fed) leaves its slot: its last segment is read out with the earlier
    ones, and its grading (`AgentEnv.reward`) goes to a tool worker."""
    run = loop.slot_run[slot]
    loop.slot_run[slot] = None
    last = self._segment(slot, run)
    self.stats.model_tokens += run.model_tokens
    partial = {"index": run.index, **{f.name: getattr(last, f.name) for f in dataclasses.fields(Segment)},
               "turns": run.turns, "end": run.end, "retokenized_turns": run.retokenized,
               "earlier": tuple(run.segments)}
    loop.grading[loop.pool.submit(self._timed(self._grade, run), run)] = partial

  def _next_segment(self, loop: _Loop, slot: int) -> None:
    """A CLOSING episode's segment is read out of its slot and the next starts APPENDING: the slot is rewound to
    the task's first positions, whose cache stays, and appends the summary framed and what the last segment
    carried over. An episode whose new segment would leave no room to go on is FINISHING instead (CONTEXT), with
    the segment just summarized."""
    run = loop.slot_run[slot]
    episode = loop.episodes[run.index]
    summary = self.agent.summary
    prompt, head = self._segment_head(episode, run)
    more = summary.enabled and len(run.segments) + 2 < summary.max_segments  # may the new one summarize?
    if len(prompt) + sum(len(ids) for ids, _ in head) + 1 + (loop.reserve if more else 0) > self.engine.context:
      run.end = EpisodeEnd.CONTEXT  # the summary and what it carries leave no room to go on
      run.phase = _Phase.FINISHING
      return
    run.segments.append(self._segment(slot, run))
    run.tokens, run.source, run.turn, run.carried = [], [], [], []
    run.add(prompt, Source.PROMPT, run.turns - 1)
    for ids, src in head:
      run.add(ids, src, run.turns - 1)
    if episode.script is not None:
      texts = [self.tokenizer.decode(ids) for ids, _ in head]
      run.observations = [self.tokenizer.decode(prompt) + texts[0]] + ["".join(texts[1:])] * (len(head) > 1)
    run.summarizing, run.kept = False, len(prompt)
    run.pieces = self._pieces([int(t) for ids, _ in head for t in ids], keep=len(prompt))
    run.phase = _Phase.APPENDING

  def _decode_turns(self, loop: _Loop) -> _SlotView:
    """The DECODING slots' turns advance with the newest weights: forced ones by one `engine.force` of up to the
    largest bucket of their tokens (`ForcedTurns.PREFILL`), sampled ones by one `engine.decode` of `chunk_steps`
    steps; returns the slots as the host reads them after both."""
    decoding = loop.mask(_Phase.DECODING)
    forcing = decoding & (loop.forced_left > 0) & (self.agent.forced_turns is ForcedTurns.PREFILL)
    sampled = decoding & ~forcing
    if decoding.any():
      params, version = self._weights(loop)
      t0 = time.perf_counter()
      if forcing.any():
        most = min(self.agent.force_chunk, self.engine.chunk_sizes[-1])
        chunk = self.engine.bucket(int(min(loop.forced_left[forcing].max(), most)))
        window = self.engine.window(int(loop.known_len[forcing].max()) + chunk)
        self._state = engine_lib.force(params, self._state, chunk=chunk, version=version, window=window,
                                       rows=self._rows(np.flatnonzero(forcing)), **self._kw)
        loop.forced_left[forcing] = np.maximum(loop.forced_left[forcing] - chunk, 0)
        self.stats.forces += 1
      if sampled.any():
        window = self.engine.window(int(loop.known_len[sampled].max()) + self.agent.chunk_steps)
        self._state = engine_lib.decode(params, self._state, steps=self.agent.chunk_steps, version=version,
                                        window=window, rows=self._rows(np.flatnonzero(sampled)), **self._kw)
        self.stats.decodes += 1
      view = self._view()
      self.stats.decode_intervals.append((t0, time.perf_counter()))
    else:
      view = self._view()
    loop.known_len = np.asarray(view.length, np.int64).copy()
    return view

  def _end_turns(self, loop: _Loop, view: _SlotView) -> None:
    """The DECODING slots whose turn ended: a model turn goes IN_TOOL, a summary CLOSING (or, past its budget,
    FINISHING), a turn that had no budget left to draw FINISHING."""
    for slot in loop.slots_in(_Phase.DECODING):
      if view.decoding[slot]:
        continue
      run = loop.slot_run[slot]
      ids = np.asarray(jax.device_get(_slot_tokens(self._state.tokens, slot)))[
          view.turn_start[slot]:view.length[slot]]
      self.stats.positions_fed += len(ids) - 1 if len(ids) else 0  # decode steps fed all but the newest
      loop.forced_left[slot] = 0  # a forced turn cut at its budget ends with tokens unwritten
      loop.host_len[slot] = int(view.length[slot])
      loop.pending[slot] = 1 if len(ids) else 0
      if not len(ids):  # no budget was left to draw (the checks after a tool call end such an episode first)
        run.end = EpisodeEnd.SUMMARY_BUDGET if run.summarizing else EpisodeEnd.TOKEN_BUDGET
        run.phase = _Phase.FINISHING
      elif run.summarizing:
        self._end_summary(run, ids, bool(view.stopped[slot]))
      else:
        self._end_model_turn(loop, run, ids, bool(view.stopped[slot]))

  def _end_summary(self, run: _Run, ids: np.ndarray, stopped: bool) -> None:
    """A summary turn ended: no tool runs; the segment ends (or the episode, if the summary overran)."""
    run.add(ids, Source.SUMMARY, run.turns)
    run.turns += 1
    run.summaries += 1
    self.stats.summaries += 1
    stop = len(ids) and int(ids[-1]) in self.sampling.stop_tokens
    run.summary_text = (self.chat.turn_text(ids) if self.chat.native
                        else self.tokenizer.decode(ids[:-1] if stop else ids))
    if stopped:
      run.phase = _Phase.CLOSING
    else:
      run.end = EpisodeEnd.SUMMARY_BUDGET
      run.phase = _Phase.FINISHING

  def _end_model_turn(self, loop: _Loop, run: _Run, ids: np.ndarray, stopped: bool) -> None:
    """A model turn ended: its text goes to a tool worker (`AgentEnv.step`)."""
    run.add(ids, Source.MODEL, run.turns)
    run.model_tokens += len(ids)
    run.turns += 1
    run.last_stopped = stopped
    text = self.chat.turn_text(ids)
    ended_by_eot = stopped and int(ids[-1]) == self.chat.end_of_turn_id
    if not np.array_equal(self.chat.turn_ids(text) if ended_by_eot else self.chat.encode_model_text(text), ids):
      run.retokenized += 1
    run.last_text = text
    run.unended = self.chat.native and not ended_by_eot
    run.tool = loop.pool.submit(self._timed(self._step, run), run, ids, text)
    run.phase = _Phase.IN_TOOL

  def _take_tool_results(self, loop: _Loop) -> None:
    """Finished tool calls: their episodes go APPENDING their observations (and a summary request when the
    segment ends) or FINISHING. When nothing can run on the device, waits for the first tool worker first."""
    in_tool = loop.slots_in(_Phase.IN_TOOL)
    if in_tool and not loop.slots_in(_Phase.DECODING, _Phase.APPENDING, _Phase.FINISHING):
      concurrent.futures.wait([loop.slot_run[slot].tool for slot in in_tool] + list(loop.grading),
                              return_when=concurrent.futures.FIRST_COMPLETED)
    for slot in [slot for slot in in_tool if loop.slot_run[slot].tool.done()]:
      run = loop.slot_run[slot]
      result: TurnResult = run.tool.result()
      run.tool = None
      self._take_tool_result(loop, slot, run, result)

  def _take_tool_result(self, loop: _Loop, slot: int, run: _Run, result: TurnResult) -> None:
    """A tool call's result: the episode goes APPENDING its observation and notice (fed after its turn's pending
    last token), with the summary request when its segment ends here, or FINISHING."""
    # The environment's text is encoded with special-token matching off: only the template's structure (the
    # continuation's CONTROL pieces) writes control ids, never a tool result or a file that spells one.
    cont = result.continuation or Continuation.plain(result.observation, result.notice)
    obs_ids = self.chat.encode_markup(cont.observation_markup)
    if run.unended:
      # A turn cut by its budget has no end-of-turn token; the template writes one after every assistant
      # message, so it opens the observation (the stream stays the conversation's render; not trained on).
      obs_ids = np.concatenate([np.asarray([self.chat.end_of_turn_id], np.int32), obs_ids])
    notice_ids = self.chat.encode_markup(cont.notice_markup)
    # host_len counts the turn's pending last token; the next turn needs room for at least one token (and,
    # while a summary may follow it, for the summary).
    grown = int(loop.host_len[slot]) + len(obs_ids) + len(notice_ids)
    end, summarize = self._after_tool(loop, run, result, grown)
    if end is not None:
      run.end = end
      run.phase = _Phase.FINISHING
      return
    script = loop.episodes[run.index].script is not None
    if summarize and grown + loop.reserve > self.engine.context:
      # The observation does not fit beside a summary: the summary comes first, the observation opens the
      # next segment (nothing the environment said is lost).
      run.carried = [(obs_ids, Source.OBSERVATION), (notice_ids, Source.NOTICE)]
      ids, text = [], ""
    else:
      ids, text = self._observe(loop, run, result, obs_ids, notice_ids, summarize, script)
    if summarize and not self.chat.native:
      text += self_summary.request(self.agent.summary.max_tokens) if script else ""
      run.add(loop.request_ids, Source.SUMMARY_REQUEST, run.turns - 1)
      ids += [int(t) for t in loop.request_ids]
    if script:
      run.observations.append(text)
    if summarize:
      run.summarizing = True
    run.pieces = self._pieces(ids)
    run.phase = _Phase.APPENDING

  def _after_tool(self, loop: _Loop, run: _Run, result: TurnResult, grown: int) -> tuple[EpisodeEnd | None, bool]:
    """(how the episode ends after a tool call, or None; whether its next turn is a summary). `grown`: the slot's
    length once the tool's observation and notice are appended."""
    summary, context = self.agent.summary, self.engine.context
    end, summarize = self._episode_end(run, result), False
    if end is None and not summary.enabled and grown + 1 > context:
      end = EpisodeEnd.CONTEXT
    if end is None and run.model_tokens >= self.agent.max_episode_tokens:
      end = EpisodeEnd.TOKEN_BUDGET
    if end is None and summary.enabled and (grown >= summary.trigger_tokens or grown + 1 + loop.reserve > context):
      summarize = self._can_summarize(run)
      end = None if summarize else EpisodeEnd.SEGMENT_LIMIT
    if end is None and summarize and self.chat.native and grown + loop.reserve > context:
      # A native template has no place for tool results before the turn that called them: the episode is cut.
      end = EpisodeEnd.CONTEXT
    return end, summarize

  def _observe(self, loop: _Loop, run: _Run, result: TurnResult, obs_ids: np.ndarray, notice_ids: np.ndarray,
               summarize: bool, script: bool) -> tuple[list[int], str]:
    """Writes a tool call's observation and notice into the episode's ledger (a native format's summary request
    in place of the notice); returns (their ids to append, their text for a script)."""
    run.add(obs_ids, Source.OBSERVATION, run.turns - 1)
    if summarize and self.chat.native:
      # The template writes the request as a user turn in place of the generation prompt: the harness's
      # message and the request, re-rendered together (the ledger marks them all as the request).
      notice_ids = self.chat.encode_markup(self.chat.format.continuation(
          run.last_text, result.results, result.budget, request=loop.request_text).notice_markup)
      run.add(notice_ids, Source.SUMMARY_REQUEST, run.turns - 1)
      text = result.observation + self.tokenizer.decode(notice_ids) if script else ""
    else:
      run.add(notice_ids, Source.NOTICE, run.turns - 1)
      text = result.observation + result.notice
    return [int(t) for t in obs_ids] + [int(t) for t in notice_ids], text

  def _take_gradings(self, loop: _Loop) -> None:
    """Finished gradings: their trajectories. When nothing but gradings is left to wait for, waits for the first."""
    if loop.grading and not loop.slots_in(_Phase.IN_TOOL, _Phase.DECODING, _Phase.APPENDING, _Phase.FINISHING):
      concurrent.futures.wait(list(loop.grading), return_when=concurrent.futures.FIRST_COMPLETED)
    for fut in [f for f in loop.grading if f.done()]:
      partial = loop.grading.pop(fut)
      terms, tool_s, error, lost = fut.result()
      if lost and loop.reruns[partial["index"]] < MAX_ENV_RERUNS:
        # Its environment's host is gone: this attempt is dropped whole (no trajectory of it leaves the run) and
        # the episode starts again in a fresh environment (`make_env`: another server), with the same key.
        loop.reruns[partial["index"]] += 1
        self.stats.env_reruns += 1
        loop.queue.appendleft(partial["index"])
        continue
      if error:  # its environment raised (a turn or the grading): the episode is cut, its reward 0
        partial["end"] = EpisodeEnd.ENV_ERROR
        self.stats.env_errors += 1
      trajectory = Trajectory(**{k: v for k, v in partial.items() if k != "index"}, reward_terms=terms,
                              tool_seconds=tool_s)
      self.stats.episodes += 1
      if loop.on_trajectory is not None:
        loop.on_trajectory(partial["index"], trajectory)
      else:
        loop.results[partial["index"]] = trajectory

  # -- episode steps on tool workers ----------------------------------------------------------------------------

  @staticmethod
  def _step(run: _Run, ids: np.ndarray, text: str) -> TurnResult:
    """The environment's turn; an exception of its own (a tool, the reset) ends this episode alone (ENV_ERROR)."""
    try:
      run.started.result()  # the reset was queued first, so it runs before (or while) this waits: no deadlock
      return run.env.step(ids, text)
    except SandboxUnavailable:
      raise  # the host lost its sandbox: no episode can go on, and training on zeros would hide it
    except Exception as e:  # noqa: BLE001  (whatever the policy's files made the host raise is this episode's)
      run.error = f"{type(e).__name__}: {e}"[:500]
      run.lost = isinstance(e, EnvLost)  # not the episode's doing: it ends here and runs again (`_take_gradings`)
      return TurnResult(observation="", done=True, reason=EpisodeEnd.ENV_ERROR.value)

  @staticmethod
  def _grade(run: _Run) -> tuple[Mapping[str, float], float, str, bool]:
    """(the episode's reward terms, its tool seconds, what its environment raised or "", whether it was lost with its
    host): `ENV_ERROR_TERMS` when it raised, here or in an earlier step."""
    try:
      if not run.error:
        run.started.result()
        return dict(run.env.reward()), run.tool_s, "", False
    except SandboxUnavailable:
      raise
    except Exception as e:  # noqa: BLE001  (as in _step: the episode's error, not the run's)
      run.error = f"{type(e).__name__}: {e}"[:500]
      run.lost = isinstance(e, EnvLost)
    finally:
      try:
        run.env.close()
      except Exception:  # noqa: BLE001  (closing is best effort; the terms are decided)
        pass
    return dict(ENV_ERROR_TERMS), run.tool_s, run.error, run.lost

  def _episode_end(self, run: _Run, result: TurnResult) -> EpisodeEnd | None:
    if result.done:
      end = EpisodeEnd.from_env(result.reason or "finish")
      # An episode whose last turn ran out of tokens was cut, whatever the environment made of the cut text.
      return EpisodeEnd.TOKEN_BUDGET if end is EpisodeEnd.FINISHED and not run.last_stopped else end
    if run.turns - run.summaries >= self.agent.max_turns:
      return EpisodeEnd.TURN_BUDGET
    return None

  def _segment(self, slot: int, run: _Run) -> Segment:
    """The slot's current segment (after its final feed), with the host's ledger of it."""
    n = len(run.tokens)
    tokens, logprobs, versions, ids = jax.device_get(_slot_rows(self._state, slot))
    tokens, logprobs, versions, ids = tokens[:n], logprobs[:n], versions[:n], ids[:, :n]
    ledger = np.asarray(run.tokens, np.int32)
    self.stats.positions += n - run.kept  # a later segment's prompt was fed once, by the first
    action = np.isin(np.asarray(run.source), [int(Source.MODEL), int(Source.SUMMARY)])
    return Segment(tokens=ledger, source=np.asarray(run.source, np.int8), turn=np.asarray(run.turn, np.int32),
                   logprobs=np.where(action, logprobs, 0.0).astype(np.float32),
                   versions=np.where(action, versions, 0).astype(np.int32), expert_ids=np.asarray(ids, np.int32),
                   drift=int(np.sum(np.asarray(tokens) != ledger)))

  def _segment_head(self, episode: Episode, run: _Run) -> tuple[list[int], list[tuple[np.ndarray, Source]]]:
    """(the new segment's first positions, kept in the slot's cache: a prefix of the episode's prompt; what it
    appends after them). Brief: the whole prompt, then the summary framed and any observation carried over from
    the segment before. A native format: the prompt re-rendered with the summary in its user message
    (`ChatTokens.segment_prompt`), split where it leaves the old prompt (inside the user message)."""
    prompt = [int(t) for t in episode.prompt]
    if not self.chat.native:
      return prompt, [(self.chat.encode_text(self_summary.resume(run.summary_text)), Source.RESUME)] + \
          [(ids, src) for ids, src in run.carried if len(ids)]
    new = self.chat.segment_prompt(episode.first_observation, run.summary_text)
    keep = max(1, min(prefix_length(prompt, new), len(new) - 1))
    return [int(t) for t in new[:keep]], [(new[keep:], Source.RESUME)]
