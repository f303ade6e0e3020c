"""The agent loop: multi-turn episodes through the slot engine with continuous batching, tools on host workers
overlapping generation, and a token ledger per trajectory (report section 4: RL episodes are agent sessions that
read, edit, run and test; section 6: in-flight weight updates).

  runner = AgentRunner(model_cfg, EngineConfig(slots=8, context=2048), sampling, AgentConfig(max_turns=8), tok)
  trajectories = runner.run([Episode(prompt=ids, make_env=lambda: suite.agent_env(task), key=k), ...],
                            weights=lambda: (params, version))

One loop iteration:
  1. free slots take the next queued episodes (their environments start on a tool worker at once);
  2. one `engine.append` feeds everything waiting to be appended: new prompts (prefill), observations (chunked
     prefill at the slot's offset, after the pending last token of its turn), and final feeds of finished
     episodes; long appends go in chunks of the largest bucket;
  3. one `engine.decode` of `chunk_steps` steps runs every slot whose turn is running, with the newest weights
     (`weights()` is asked before every device call: an actor swaps in newer weights there, the caches stay);
  4. slots whose turn ended hand their text to a tool worker (`AgentEnv.step`); their KV stays where it is;
  5. finished tool calls come back as observation tokens (or end the episode); a finished episode's row is read
     from its slot, the slot is refilled, and its grading (`AgentEnv.reward`) runs on a tool worker.
When nothing can run on the device, the loop waits for the first tool worker to finish.

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
two prompts share; an observation that does not fit beside a summary ends such an episode (CONTEXT).

A trajectory does not depend on its slot or on the other episodes (each draws with its own key and draw index),
so a run with S slots equals running each episode alone with the same keys (tests/actors/agent_loop_test.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import time
from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from c2jax.actors import engine as engine_lib
from c2jax.actors import placement
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import EpisodeEnd, Segment, Source, Trajectory
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.chat import self_summary
from c2jax.envs.core.agent_env import AgentEnv, TurnResult
from c2jax.envs.chat.chat_tokens import ChatTokens, prefix_length
from c2jax.model.config import ModelConfig
from c2jax.model.sharding import Layout


@dataclasses.dataclass(frozen=True)
class Episode:
  """One episode to run.

  Attributes:
    prompt: the prompt's ids (`ChatTokens.prompt`: BOS and the first observation for brief, the rendered system
      and user messages and the generation prompt for a native chat format).
    make_env: builds the episode's environment (called on the loop's thread; `reset` runs on a tool worker).
    key: the episode's PRNG key (typed) or an int seed.
    script: (turn, observations) -> the turn's text to force through the engine, or None to sample it; the
      observations are the texts so far (the prompt's first, then each turn's tool results and notice). Forced
      turns need `EngineConfig.max_forced`; their tokens (the text's ids and EOS) are decoded step by step and
      carry the model's log-probs of them.
    first_observation: the prompt's user message; a native chat format re-renders the prompt from it when a
      self-summary starts a new segment (brief appends the framed summary and needs none).
  """

  prompt: Sequence[int]
  make_env: Callable[[], AgentEnv]
  key: jax.Array | int = 0
  script: Callable[[int, Sequence[str]], str | None] | None = None
  first_observation: str = ""


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
  """

  max_turns: int = 8
  max_turn_tokens: int = 256
  max_episode_tokens: int = 2048
  chunk_steps: int = 16
  tool_workers: int = 4
  tool_cpus: str = ""
  summary: SummaryConfig = SummaryConfig()

  def __post_init__(self):
    for name in ("max_turns", "max_turn_tokens", "max_episode_tokens", "chunk_steps", "tool_workers"):
      if getattr(self, name) < 1:
        raise ValueError(f"AgentConfig.{name}={getattr(self, name)} must be >= 1.")
    placement.parse_cpus(self.tool_cpus)  # one sentence on a bad list


@dataclasses.dataclass
class RunStats:
  """What one `run` did, for the benchmark and the actor's metrics.

  positions: positions of all finished trajectories; positions_fed: positions the model was run on (appends and
  decode steps); their difference is what was prefilled twice (0 by construction). decode_intervals / tool
  intervals: wall-clock spans of device decode calls and of tool-worker calls, for the overlap fraction.
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
  weight_swaps: int = 0
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


@dataclasses.dataclass
class _Run:
  """Host bookkeeping of one episode in a slot (tokens, source, turn and observations: its current segment)."""

  index: int
  env: AgentEnv
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

  def add(self, ids, source: Source, turn: int) -> None:
    self.tokens += [int(i) for i in ids]
    self.source += [int(source)] * len(ids)
    self.turn += [turn] * len(ids)


@jax.jit
def _slot_tokens(tokens: jax.Array, slot) -> jax.Array:
  """[C] the tokens of one slot (the slot index traced: one program for every slot)."""
  return jax.lax.dynamic_index_in_dim(tokens, slot, axis=0, keepdims=False)


@jax.jit
def _slot_rows(state: engine_lib.SlotState, slot):
  """A slot's tokens, logprobs, versions [C] and expert ids [Lm, C, K]."""
  take = lambda a, axis=0: jax.lax.dynamic_index_in_dim(a, slot, axis=axis, keepdims=False)
  return take(state.tokens), take(state.logprobs), take(state.versions), take(state.expert_ids, 1)


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

  def _append(self, params, version, pieces: dict[int, tuple[list[int], bool, bool, int, jax.Array, int]],
              forced_turns: dict[int, np.ndarray], longest: int):
    """One append call: pieces[slot] = (ids, reset, draw, turn_end, key, keep) (keep >= 0: rewind the slot to its
    first keep positions first, -1: no rewind); forced_turns[slot] = a forced turn's ids; longest: the largest new
    length of a slot taking part (the attention window's bound).

    Only the taking-part slots are computed (`engine.append` rows, padded with idle slots to a power of two), so
    an observation arriving alone costs its own slot, not all S; under a mesh every slot is."""
    s = self.engine.slots
    pending = self._host_pending
    need = max(len(ids) + (0 if reset or keep >= 0 else pending[slot])
               for slot, (ids, reset, _, _, _, keep) in pieces.items())
    c = self.engine.bucket(max(need, 1))
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
      ids, r, d, end, key, kp = pieces[slot]
      take_part[i] = True
      chunk[i, :len(ids)] = ids
      lengths[i] = len(ids)
      reset[i], draw[i], turn_end[i], keep[i] = r, d, end, kp
      if r:
        keys = keys.at[slot].set(key)
      self.stats.positions_fed += len(ids) + (0 if r or kp >= 0 else pending[slot])
    self._keys = keys
    forced = forced_len = None
    if self.engine.max_forced:
      forced = np.zeros((k, self.engine.max_forced), np.int32)
      forced_len = np.zeros((k,), np.int32)
      for i, slot in enumerate(rows):
        if slot in forced_turns:
          ids = forced_turns[slot][:self.engine.max_forced]
          forced[i, :len(ids)] = ids
          forced_len[i] = len(ids)
    elif forced_turns:
      raise ValueError("An episode's script forces a turn, but EngineConfig.max_forced is 0.")
    self._state = engine_lib.append(params, self._state, chunk, lengths, take_part=take_part, reset=reset, draw=draw,
                                    turn_end=turn_end, keys=keys if subset is None else keys[subset],
                                    version=version, forced=forced, forced_len=forced_len, keep=keep,
                                    window=self.engine.window(longest), rows=subset, **self._kw)
    self.stats.appends += 1

  def _rows(self, slots) -> np.ndarray | None:
    """The rows a device call computes: `slots` padded with idle ones to a power of two (each k compiles once), or
    None for all S (as many, or under a mesh, whose shards need every slot)."""
    s, k = self.engine.slots, 1
    while k < len(slots):
      k *= 2
    if k >= s or self.layout is not None:
      return None
    chosen = set(int(i) for i in slots)
    return np.asarray(sorted(chosen) + [i for i in range(s) if i not in chosen][:k - len(chosen)], np.int32)

  # -- the loop -------------------------------------------------------------------------------------------------

  def run(self, episodes: Sequence[Episode], weights: Callable[[], tuple[object, int]],
          on_chunk: Callable[[], None] | None = None) -> list[Trajectory]:
    """Runs every episode to its end; returns their trajectories in order (see the module docstring).

    Args:
      episodes: what to run.
      weights: () -> (params, version), asked before every device call (in-flight updates swap params there).
      on_chunk: called once per loop iteration (an actor renews its lease there).
    """
    t_run = time.perf_counter()
    agent, s_slots, context = self.agent, self.engine.slots, self.engine.context
    summary = agent.summary
    native = self.chat.native
    request_text = self.chat.format.summary_request(summary.max_tokens) if summary.enabled else ""
    # Brief appends the request after the notice; a native format renders it as a user turn in place of the
    # generation prompt, whose tokens (the turn's framing) bound it here.
    request_ids = (self._encode(self.chat.format.continuation("", (), "", request=request_text).notice) if native
                   else self._encode(request_text))
    # Positions a summary needs after a segment's last one: the request and the summary's budget.
    reserve = len(request_ids) + summary.max_tokens if summary.enabled else 0
    for i, ep in enumerate(episodes):
      if len(ep.prompt) < 1 or len(ep.prompt) + reserve >= context:
        raise ValueError(f"Episode {i} has a {len(ep.prompt)}-token prompt; it needs 1 to {context - 1 - reserve} "
                         f"tokens (the engine's context is {context}"
                         + (f", {reserve} of them kept for a summary)." if reserve else ")."))
      if native and summary.enabled and not ep.first_observation:
        raise ValueError(f"Episode {i} has no first_observation; chat format {self.chat.format.name!r} re-renders "
                         "the prompt from it after a self-summary.")
    queue = collections.deque(range(len(episodes)))
    results: list[Trajectory | None] = [None] * len(episodes)
    slot_run: list[_Run | None] = [None] * s_slots
    # What the host knows of each slot between device calls: its length, and whether a drawn token is unfed.
    host_len = np.zeros(s_slots, np.int64)
    known_len = np.zeros(s_slots, np.int64)  # each slot's length as of the last device call (the window's bound)
    self._host_pending = np.zeros(s_slots, np.int64)
    waiting: dict[int, list] = {}  # slot -> pieces still to append [(ids, reset, keep)]; the last starts a turn
    finishing: set[int] = set()  # slots whose pending token is fed for routing, then released
    closing: set[int] = set()  # slots whose summary's pending token is fed, then a new segment starts
    tools: dict[concurrent.futures.Future, int] = {}
    grading: dict[concurrent.futures.Future, dict] = {}  # -> the trajectory's fields read from its slot
    decoding = np.zeros(s_slots, bool)
    last_version = None
    max_piece = self.engine.chunk_sizes[-1] - 1  # leaves room for a pending token

    def timed(fn, run: _Run):
      def call(*args):
        t0 = time.perf_counter()
        try:
          return fn(*args)
        finally:
          t1 = time.perf_counter()
          run.tool_s += t1 - t0
          self.stats.tool_intervals.append((t0, t1))
      return call

    def can_summarize(run: _Run) -> bool:
      return summary.enabled and len(run.segments) + 1 < summary.max_segments

    def turn_end(slot: int, run: _Run, start: int) -> int:
      if run.summarizing:
        return int(min(start + summary.max_tokens, context))
      left = min(agent.max_turn_tokens, agent.max_episode_tokens - run.model_tokens)
      # While a summary may follow, a turn leaves room for it (the request and the summary's budget).
      return int(min(start + left, context - (reserve if can_summarize(run) else 0)))

    def pieces_of(ids, keep: int = -1) -> list:
      """Appends of at most max_piece tokens; the first rewinds the slot to `keep` (-1: no rewind)."""
      return [(ids[k:k + max_piece], False, keep if k == 0 else -1) for k in range(0, len(ids), max_piece)] or \
          [([], False, keep)]

    pool = concurrent.futures.ThreadPoolExecutor(
        agent.tool_workers, thread_name_prefix="agent-tools",
        initializer=functools.partial(placement.pin_thread, placement.parse_cpus(agent.tool_cpus)))
    tick = time.perf_counter()
    try:
      while queue or any(r is not None for r in slot_run) or grading:
        now = time.perf_counter()
        self.stats.slot_s += (now - tick) * s_slots
        if queue:
          self.stats.slot_wait_s += (now - tick) * len(tools)
        tick = now
        if on_chunk is not None:
          on_chunk()
        # 1. Refill free slots.
        for slot in range(s_slots):
          if slot_run[slot] is None and queue:
            i = queue.popleft()
            run = _Run(index=i, env=episodes[i].make_env())
            run.started = pool.submit(timed(run.env.reset, run))
            slot_run[slot] = run
            prompt = [int(t) for t in episodes[i].prompt]
            run.add(prompt, Source.PROMPT, 0)
            if episodes[i].script is not None:
              run.observations.append(self.tokenizer.decode(prompt))
            waiting[slot] = [(prompt[k:k + max_piece], k == 0, -1) for k in range(0, len(prompt), max_piece)]
            host_len[slot] = 0
            self._host_pending[slot] = 0
        # 2. One append for everything waiting (each slot's next piece).
        pieces, forced_turns = {}, {}
        for slot, chunks in waiting.items():
          ids, reset, keep = chunks[0]
          last = len(chunks) == 1
          run = slot_run[slot]
          start = (0 if reset else keep if keep >= 0 else host_len[slot]) + len(ids)
          end = turn_end(slot, run, start) if last else 0
          key = episodes[run.index].key
          key = jax.random.key(key) if isinstance(key, int) else key
          pieces[slot] = (ids, reset, last, end, key, keep)
          script = episodes[run.index].script
          if last and script is not None:
            text = script(run.turns, run.observations)
            if text is not None:
              forced_turns[slot] = self.chat.turn_ids(text)
        for slot in finishing | closing:
          pieces[slot] = ([], False, False, 0, None, -1)
        if pieces:
          params, version = weights()
          self.stats.weight_swaps += last_version is not None and version != last_version
          last_version = version
          base = lambda slot, reset, keep: 0 if reset else keep if keep >= 0 else host_len[slot]
          longest = max(base(slot, p[1], p[5]) + len(p[0]) + (0 if p[1] or p[5] >= 0 else self._host_pending[slot])
                        for slot, p in pieces.items())
          self._append(params, version, pieces, forced_turns, longest)
          for slot, (ids, reset, draw, _, _, keep) in pieces.items():
            host_len[slot] = base(slot, reset, keep) + len(ids)
            known_len[slot] = host_len[slot] + draw
            self._host_pending[slot] = 0
            if slot in waiting:
              waiting[slot].pop(0)
              if not waiting[slot]:
                del waiting[slot]
                decoding[slot] = True  # the turn started; read back below (it may end on its first token)
          for slot in sorted(finishing):
            run = slot_run[slot]
            slot_run[slot] = None
            grading[pool.submit(timed(self._grade, run), run)] = self._release(slot, run)
          finishing.clear()
          for slot in sorted(closing):  # a new segment: the summary framed, after the task's first observation
            run = slot_run[slot]
            prompt, head = self._segment_head(episodes[run.index], run)
            more = summary.enabled and len(run.segments) + 2 < summary.max_segments  # may the new one summarize?
            if len(prompt) + sum(len(ids) for ids, _ in head) + 1 + (reserve if more else 0) > context:
              run.end = EpisodeEnd.CONTEXT  # the summary and what it carries leave no room to go on
              finishing.add(slot)  # the episode ends with the segment just summarized
              continue
            run.segments.append(self._segment(slot, run))
            run.tokens, run.source, run.turn, run.carried = [], [], [], []
            run.add(prompt, Source.PROMPT, run.turns - 1)
            for ids, src in head:
              run.add(ids, src, run.turns - 1)
            if episodes[run.index].script is not None:
              texts = [self.tokenizer.decode(ids) for ids, _ in head]
              run.observations = [self.tokenizer.decode(prompt) + texts[0]] + ["".join(texts[1:])] * (len(head) > 1)
            run.summarizing, run.kept = False, len(prompt)
            waiting[slot] = pieces_of([int(t) for ids, _ in head for t in ids], keep=len(prompt))
          closing.clear()
        # 3. Decode every running turn.
        if decoding.any():
          params, version = weights()
          self.stats.weight_swaps += last_version is not None and version != last_version
          last_version = version
          t0 = time.perf_counter()
          window = self.engine.window(int(known_len[decoding].max()) + agent.chunk_steps)
          self._state = engine_lib.decode(params, self._state, steps=agent.chunk_steps, version=version,
                                          window=window, rows=self._rows(np.flatnonzero(decoding)), **self._kw)
          view = jax.device_get((self._state.length, self._state.decoding, self._state.turn_start,
                                 self._state.stopped))
          self.stats.decode_intervals.append((t0, time.perf_counter()))
          self.stats.decodes += 1
        else:
          view = jax.device_get((self._state.length, self._state.decoding, self._state.turn_start,
                                 self._state.stopped))
        length, still, turn_start, stopped = view
        known_len = np.asarray(length, np.int64).copy()
        ended = [slot for slot in range(s_slots) if decoding[slot] and not still[slot]]
        decoding = np.asarray(still, bool).copy()
        # 4. Ended turns go to the tools; the slot keeps its cache.
        if ended:
          for slot in ended:
            run = slot_run[slot]
            ids = np.asarray(jax.device_get(_slot_tokens(self._state.tokens, slot)))[turn_start[slot]:length[slot]]
            self.stats.positions_fed += len(ids) - 1 if len(ids) else 0  # decode steps fed all but the newest
            host_len[slot] = int(length[slot])
            self._host_pending[slot] = 1 if len(ids) else 0
            if not len(ids):  # no budget was left to draw (the checks below end such an episode first)
              run.end = EpisodeEnd.SUMMARY_BUDGET if run.summarizing else EpisodeEnd.TOKEN_BUDGET
              finishing.add(slot)
              continue
            if run.summarizing:  # the summary: no tool runs; the segment ends (or the episode, if it overran)
              run.add(ids, Source.SUMMARY, run.turns)
              run.turns += 1
              run.summaries += 1
              self.stats.summaries += 1
              stop = len(ids) and int(ids[-1]) in self.sampling.stop_tokens
              run.summary_text = (self.chat.turn_text(ids) if native
                                  else self.tokenizer.decode(ids[:-1] if stop else ids))
              if stopped[slot]:
                closing.add(slot)
              else:
                run.end = EpisodeEnd.SUMMARY_BUDGET
                finishing.add(slot)
              continue
            run.add(ids, Source.MODEL, run.turns)
            run.model_tokens += len(ids)
            run.turns += 1
            run.last_stopped = bool(stopped[slot])
            text = self.chat.turn_text(ids)
            ended_by_eot = bool(stopped[slot]) and int(ids[-1]) == self.chat.end_of_turn_id
            if not np.array_equal(self.chat.turn_ids(text) if ended_by_eot else self._encode(text), ids):
              run.retokenized += 1
            run.last_text = text
            run.unended = native and not ended_by_eot
            tools[pool.submit(timed(self._step, run), run, ids, text)] = slot
        # 5. Finished tool calls: observations in, or the episode's end.
        if tools and not decoding.any() and not waiting and not finishing:
          concurrent.futures.wait(list(tools) + list(grading), return_when=concurrent.futures.FIRST_COMPLETED)
        for fut in [f for f in tools if f.done()]:
          slot = tools.pop(fut)
          run = slot_run[slot]
          result: TurnResult = fut.result()
          end = self._episode_end(run, result)
          obs_ids = self._encode(result.observation)
          if run.unended:
            # A turn cut by its budget has no end-of-turn token; the template writes one after every assistant
            # message, so it opens the observation (the stream stays the conversation's render; not trained on).
            obs_ids = np.concatenate([np.asarray([self.chat.end_of_turn_id], np.int32), obs_ids])
          notice_ids = self._encode(result.notice)
          # host_len counts the turn's pending last token; the next turn needs room for at least one token (and,
          # while a summary may follow it, for the summary).
          grown = int(host_len[slot]) + len(obs_ids) + len(notice_ids)
          summarize = False
          if end is None and not summary.enabled and grown + 1 > context:
            end = EpisodeEnd.CONTEXT
          if end is None and run.model_tokens >= agent.max_episode_tokens:
            end = EpisodeEnd.TOKEN_BUDGET
          if end is None and summary.enabled and (grown >= summary.trigger_tokens or grown + 1 + reserve > context):
            summarize = can_summarize(run)
            end = None if summarize else EpisodeEnd.SEGMENT_LIMIT
          if end is not None:
            run.end = end
            finishing.add(slot)
            continue
          script = episodes[run.index].script is not None
          ids, appended = [], False
          if summarize and grown + reserve > context and native:
            # A native template has no place for tool results before the turn that called them: the episode is cut.
            run.end = EpisodeEnd.CONTEXT
            finishing.add(slot)
            continue
          if summarize and grown + reserve > context:
            # The observation does not fit beside a summary: the summary comes first, the observation opens the
            # next segment (nothing the environment said is lost).
            run.carried = [(obs_ids, Source.OBSERVATION), (notice_ids, Source.NOTICE)]
          else:
            if script:
              run.observations.append(result.observation + result.notice)
            run.add(obs_ids, Source.OBSERVATION, run.turns - 1)
            if summarize and native:
              # The template writes the request as a user turn in place of the generation prompt: the harness's
              # message and the request, re-rendered together (the ledger marks them all as the request).
              notice_ids = self._encode(self.chat.format.continuation(
                  run.last_text, result.results, result.budget, request=request_text).notice)
              run.add(notice_ids, Source.SUMMARY_REQUEST, run.turns - 1)
            else:
              run.add(notice_ids, Source.NOTICE, run.turns - 1)
            ids = [int(t) for t in obs_ids] + [int(t) for t in notice_ids]
            appended = True
          if summarize and native:
            if script:
              run.observations[-1] = result.observation + self.tokenizer.decode(notice_ids)
            run.summarizing = True
          elif summarize:
            if script:
              text = self_summary.request(summary.max_tokens)
              if appended:
                run.observations[-1] += text
              else:
                run.observations.append(text)
            run.add(request_ids, Source.SUMMARY_REQUEST, run.turns - 1)
            ids += [int(t) for t in request_ids]
            run.summarizing = True
          waiting[slot] = pieces_of(ids)
        if not tools and not decoding.any() and not waiting and not finishing and grading:
          concurrent.futures.wait(list(grading), return_when=concurrent.futures.FIRST_COMPLETED)
        for fut in [f for f in grading if f.done()]:
          partial = grading.pop(fut)
          terms, tool_s = fut.result()
          results[partial["index"]] = Trajectory(**{k: v for k, v in partial.items() if k != "index"},
                                                 reward_terms=terms, tool_seconds=tool_s)
          self.stats.episodes += 1
    finally:
      pool.shutdown(wait=True, cancel_futures=True)
      for run in slot_run:
        if run is not None:
          try:
            run.env.close()
          except Exception:  # pylint: disable=broad-except
            pass
    self.stats.wall_s += time.perf_counter() - t_run
    return results

  # -- episode steps on tool workers ----------------------------------------------------------------------------

  def _encode(self, text: str) -> np.ndarray:
    return self.chat.encode(text)

  @staticmethod
  def _step(run: _Run, ids: np.ndarray, text: str) -> TurnResult:
    run.started.result()  # the reset was queued first, so it runs before (or while) this waits: no deadlock
    return run.env.step(ids, text)

  @staticmethod
  def _grade(run: _Run) -> tuple[Mapping[str, float], float]:
    try:
      run.started.result()
      terms = dict(run.env.reward())
    finally:
      run.env.close()
    return terms, run.tool_s

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
      return prompt, [(self._encode(self_summary.resume(run.summary_text)), Source.RESUME)] + \
          [(ids, src) for ids, src in run.carried if len(ids)]
    new = self.chat.segment_prompt(episode.first_observation, run.summary_text)
    keep = max(1, min(prefix_length(prompt, new), len(new) - 1))
    return [int(t) for t in new[:keep]], [(new[keep:], Source.RESUME)]

  def _release(self, slot: int, run: _Run) -> dict:
    """Reads a finished episode's last segment out of its slot (after its final feed), with the earlier ones."""
    last = self._segment(slot, run)
    self.stats.model_tokens += run.model_tokens
    return {"index": run.index, **{f.name: getattr(last, f.name) for f in dataclasses.fields(Segment)},
            "turns": run.turns, "end": run.end, "retokenized_turns": run.retokenized,
            "earlier": tuple(run.segments)}
