"""An OpenAI-compatible endpoint over the agent engine: `/v1/chat/completions` (tools, streaming, the model's own
chat template and tool-call format) and `/v1/models`, an ASGI app (starlette) served by uvicorn.

  server = ChatServer(runner, Weights(params=params), limits)   # runner: an `AgentRunner` (engine, chat format)
  server.start()                                                 # the engine thread
  uvicorn.run(make_app(server), host="127.0.0.1", port=8000)     # or `experiments/serve_main.py`

One engine thread owns the engine: it runs `AgentRunner.run` with a `feed`, so requests join the running ones
between device calls (continuous batching): a request takes a free slot (or waits in the queue for one), its
conversation is appended (chunked prefill), and its reply is decoded in chunks of `AgentConfig.chunk_steps` steps
together with every other running reply. A streamed reply reads its tokens after every device call
(`Episode.on_tokens`). Each request is an agent-loop episode (`chat_completions`: its earlier assistant messages
forced, the messages after them replayed as the environment's continuations, its reply the last turn), so its
tokens are the agent loop's for the same seed.

Seed: a request's `seed` s keys its episode with `jax.random.key(s)`, as the agent loop keys an `Episode` whose
key is the int s; the d-th token drawn in the conversation (its forced turns' tokens counted) uses fold_in(that key,
d), whatever slot or batch it runs in. Without a seed the server draws one from its own generator
(`ChatServer(seed=...)`).

Weights: `Weights` is asked before every device call; with a weight store it polls for a newer version at most
every `poll_s` seconds and swaps the params in flight (the caches stay). Each drawn token is stamped with the
version that drew it; a reply reports the version of its last token as `system_fingerprint` ("c2jax-v<version>").

Answers: OpenAI's chat.completion (or chat.completion.chunk events ending with `data: [DONE]`), each choice also
carrying `token_ids` (the reply's ids, as vLLM's return_token_ids does). A bad request is a 400 whose body is
OpenAI's error object with one sentence.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import queue
import random
import threading
import time
import uuid
from typing import Any, Callable

import jax
import numpy as np

from c2jax.actors.agent_loop import AgentRunner, Episode
from c2jax.actors.ledger import EpisodeEnd, Source, Trajectory
from c2jax.services import chat_completions as cc

# Assistant messages the server answered whose drawn ids it keeps, so that a conversation sent back forces them
# exactly (`chat_completions.render`); the oldest are forgotten first.
KNOWN_TURNS = 4096


class Weights:
  """(params, version) for the engine thread: fixed params, or the newest version of a weight store.

  Args:
    params: the params served until the store has a version (then the store's newest, whatever its number).
    version: their version.
    store: a `c2jax.rollouts.weight_store.WeightStore` polled for newer versions, or None.
    poll_s: the least time between two polls of the store.
  """

  def __init__(self, params: Any = None, version: int = 0, store: Any = None, poll_s: float = 1.0):
    self.params, self.version, self.store, self.poll_s = params, version, store, poll_s
    self._host = None  # the store's version as loaded (host arrays): the base of the next delta
    self._polled = -float("inf")
    if params is None and store is None:
      raise ValueError("Weights need params or a weight store.")
    self._poll()
    if self.params is None:
      raise ValueError(f"The weight store {store.url} has no published version yet; publish one, or give params.")

  def _poll(self) -> None:
    now = time.monotonic()
    if self.store is None or now - self._polled < self.poll_s:
      return
    self._polled = now
    have = self.version if self._host is not None else None
    got = self.store.update(have, self._host)
    if got is not None:
      self.version, self._host = got
      self.params = jax.device_put(self._host)

  def __call__(self) -> tuple[Any, int]:
    self._poll()
    return self.params, self.version


@dataclasses.dataclass(frozen=True)
class Reply:
  """A finished reply: its ids, why it ended, the conversation's positions before it, the version of its last
  token; or `error` (one sentence) when the engine could not answer."""

  ids: np.ndarray
  finish: EpisodeEnd | None
  prompt_tokens: int
  version: int
  error: str = ""


@dataclasses.dataclass
class _Ticket:
  index: int
  history: int  # forced turns before the reply
  sink: Callable[[tuple[str, Any]], None]


class ChatServer:
  """The engine thread and its request queue (see the module docstring).

  Args:
    runner: the agent runner (model, engine, sampling, chat format); its `AgentConfig` budgets should not bind
      (max_turns, max_episode_tokens large: a request's budgets are its own).
    weights: () -> (params, version), asked before every device call (`Weights`).
    limits: what requests may ask (`chat_completions.Limits`).
    seed: the generator of the seeds of requests that give none.
  """

  def __init__(self, runner: AgentRunner, weights: Callable[[], tuple[Any, int]], limits: cc.Limits,
               seed: int = 0):
    self.runner, self.weights, self.limits = runner, weights, limits
    self.chat = runner.chat
    self._inbox: queue.Queue = queue.Queue()
    self._tickets: dict[int, _Ticket] = {}
    self._next = 0
    self._known: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
    self._lock = threading.Lock()
    self._rng = random.Random(seed)
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._serve, name="engine", daemon=True)
    self.error = ""

  def start(self) -> None:
    self._thread.start()

  def stop(self) -> None:
    """Stops taking requests; the engine thread ends once the running ones are answered."""
    self._stop.set()
    self._thread.join()

  # -- requests (any thread) ------------------------------------------------------------------------------------

  def prepare(self, request: cc.Request) -> cc.Conversation:
    """The request's conversation; BadRequest when it does not fit the engine."""
    with self._lock:
      conv = cc.render(request, self.chat, lambda m: self._known.get(cc.turn_key(m)))
    for k, ids in enumerate(conv.turns):
      if len(ids) > self.limits.max_forced:
        raise cc.BadRequest(f"Assistant message {k} is {len(ids)} tokens, more than the {self.limits.max_forced} "
                            "this server replays (--max_forced); shorten the conversation.")
    n = conv.length(self.chat)
    if n >= self.limits.context:
      raise cc.BadRequest(f"The conversation is {n} tokens; this server's context is {self.limits.context} "
                          "(--context), so it leaves no room for a reply; shorten it.")
    return conv

  def submit(self, request: cc.Request, conv: cc.Conversation, sink: Callable[[tuple[str, Any]], None]) -> None:
    """Queues the request; `sink` gets ("tokens", the reply's ids so far) after device calls, then ("done",
    `Reply`), from the engine thread."""
    if self.error:
      sink(("done", Reply(np.zeros(0, np.int32), None, 0, 0, error=self.error)))
      return
    seed = request.seed if request.seed is not None else self._rng.getrandbits(63)
    self._inbox.put((request, conv, seed, sink))

  def remember(self, message: dict, ids: np.ndarray) -> None:
    """Keeps the ids drawn for an assistant message returned to a client (`KNOWN_TURNS` of them)."""
    with self._lock:
      self._known[cc.turn_key(message)] = np.asarray(ids, np.int32)
      self._known.move_to_end(cc.turn_key(message))
      while len(self._known) > KNOWN_TURNS:
        self._known.popitem(last=False)

  # -- the engine thread ----------------------------------------------------------------------------------------

  def _serve(self) -> None:
    try:
      self.runner.run([], weights=self.weights, feed=self._feed, on_trajectory=self._done)
    except Exception as e:  # every waiting request is answered with it, then it is raised again
      self.error = f"The engine stopped: {type(e).__name__}: {str(e)[:300]}"
      for ticket in self._tickets.values():
        ticket.sink(("done", Reply(np.zeros(0, np.int32), None, 0, 0, error=self.error)))
      while not self._inbox.empty():
        self._inbox.get()[3](("done", Reply(np.zeros(0, np.int32), None, 0, 0, error=self.error)))
      raise

  def _feed(self, idle: bool) -> list[Episode] | None:
    """The requests queued since the last call (waiting a little for one when the engine is idle); None once
    stopping."""
    if self._stop.is_set():
      return None
    items = []
    try:
      items.append(self._inbox.get(timeout=0.05) if idle else self._inbox.get_nowait())
      while True:
        items.append(self._inbox.get_nowait())
    except queue.Empty:
      pass
    return [self._episode(*item) for item in items]

  def _episode(self, request: cc.Request, conv: cc.Conversation, seed: int, sink) -> Episode:
    ticket = _Ticket(index=self._next, history=len(conv.turns), sink=sink)
    self._tickets[self._next] = ticket
    self._next += 1
    turns = conv.turns

    def on_tokens(turn: int, ids: np.ndarray) -> None:
      if turn == ticket.history:
        sink(("tokens", ids))

    return Episode(prompt=conv.prompt, make_env=lambda: cc.ReplayEnv(conv.continuations), key=seed,
                   script=lambda turn, observations: turns[turn] if turn < len(turns) else None,
                   turn_tokens=tuple(len(t) for t in turns) + (request.max_tokens,),
                   on_tokens=on_tokens if request.stream else None)

  def _done(self, index: int, traj: Trajectory) -> None:
    ticket = self._tickets.pop(index)
    reply = (traj.source == int(Source.MODEL)) & (traj.turn == ticket.history)
    ids = np.asarray(traj.tokens[reply], np.int32)
    if traj.end is EpisodeEnd.ENV_ERROR:
      ticket.sink(("done", Reply(ids, None, 0, 0, error="The engine could not run this conversation.")))
      return
    first = int(np.argmax(reply)) if reply.any() else len(traj.tokens)
    version = int(traj.versions[reply][-1]) if reply.any() else 0
    ticket.sink(("done", Reply(ids, traj.end, first, version)))


def error_body(message: str, status: int = 400) -> dict:
  """OpenAI's error object."""
  kind = "invalid_request_error" if status < 500 else "server_error"
  return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _finish_reason(reply: Reply, message: dict) -> str:
  if reply.finish is EpisodeEnd.FINISHED:
    return "tool_calls" if message.get("tool_calls") else "stop"
  return "length"


def _usage(reply: Reply) -> dict:
  return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": len(reply.ids),
          "total_tokens": reply.prompt_tokens + len(reply.ids)}


def _partial_content(chat, ids: np.ndarray, tools_on: bool) -> str | None:
  """The content a reply's ids so far certainly begin with, or None while their parse may still change it (an
  open call or reasoning block); a trailing undecodable byte sequence is held back (its character may go on)."""
  text = chat.turn_text(ids).rstrip("\ufffd")
  if not chat.native:
    return text
  turn = chat.format.tool_format.turn(text)
  if not tools_on and not turn.calls:
    return text
  return turn.content if turn.exact else None


def make_app(server: ChatServer):
  """The ASGI app (starlette) of `server`."""
  from starlette.applications import Starlette
  from starlette.requests import Request
  from starlette.responses import JSONResponse, StreamingResponse
  from starlette.routing import Route

  limits = server.limits

  async def models(request: Request):
    del request
    return JSONResponse({"object": "list", "data": [{"id": limits.model, "object": "model", "created": 0,
                                                     "owned_by": "c2jax"}]})

  async def completions(request: Request):
    try:
      body = await request.json()
    except ValueError:
      return JSONResponse(error_body("The request body is not valid JSON."), status_code=400)
    try:
      req = cc.parse_request(body, limits)
      conv = server.prepare(req)
    except cc.BadRequest as e:
      return JSONResponse(error_body(str(e)), status_code=400)
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    server.submit(req, conv, lambda event: loop.call_soon_threadsafe(events.put_nowait, event))
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": body.get("model") or limits.model}
    if req.stream:
      return StreamingResponse(_stream(server, head, req, events), media_type="text/event-stream")
    while True:
      kind, reply = await events.get()
      if kind == "done":
        break
    if reply.error:
      return JSONResponse(error_body(reply.error, 500), status_code=500)
    return JSONResponse(_completion(server, head, req, reply))

  return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                           Route("/v1/chat/completions", completions, methods=["POST"])])


def _completion(server: ChatServer, head: dict, req: cc.Request, reply: Reply) -> dict:
  """A chat.completion of a finished reply."""
  message = cc.assistant_message(server.chat, reply.ids, req.tools_on)
  server.remember(message, reply.ids)
  return {**head, "object": "chat.completion", "system_fingerprint": f"c2jax-v{reply.version}",
          "choices": [{"index": 0, "message": message, "logprobs": None,
                       "finish_reason": _finish_reason(reply, message), "token_ids": [int(i) for i in reply.ids]}],
          "usage": _usage(reply)}


async def _stream(server: ChatServer, head: dict, req: cc.Request, events: asyncio.Queue):
  """The server-sent events of a streamed reply: its content as it is drawn (as far as its parse is settled), then
  its reasoning and tool calls, the finish reason, usage if asked, [DONE]."""

  def chunk(delta: dict, finish: str | None = None, **extra) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, **extra}
    return "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": [choice]}) + "\n\n"

  yield chunk({"role": "assistant", "content": ""})
  sent = ""
  while True:
    kind, value = await events.get()
    if kind == "done":
      break
    content = _partial_content(server.chat, value, req.tools_on)
    if content is not None and content.startswith(sent) and len(content) > len(sent):
      yield chunk({"content": content[len(sent):]})
      sent = content
  if value.error:
    yield "data: " + json.dumps(error_body(value.error, 500)) + "\n\n"
    yield "data: [DONE]\n\n"
    return
  message = cc.assistant_message(server.chat, value.ids, req.tools_on)
  server.remember(message, value.ids)
  if message["content"].startswith(sent) and len(message["content"]) > len(sent):
    yield chunk({"content": message["content"][len(sent):]})
  if message.get("reasoning_content"):
    yield chunk({"reasoning_content": message["reasoning_content"]})
  for k, call in enumerate(message.get("tool_calls", [])):
    yield chunk({"tool_calls": [{"index": k, **call}]})
  head = {**head, "system_fingerprint": f"c2jax-v{value.version}"}
  yield chunk({}, _finish_reason(value, message), token_ids=[int(i) for i in value.ids])
  if req.include_usage:
    yield "data: " + json.dumps({**head, "object": "chat.completion.chunk", "choices": [],
                                 "usage": _usage(value)}) + "\n\n"
  yield "data: [DONE]\n\n"


class Serving:
  """uvicorn serving `app` on host:port in a thread (tests, notebooks); `experiments/serve_main.py` runs it in
  the foreground. port 0 picks a free one (`port` holds it once started)."""

  def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
    import uvicorn
    self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                 lifespan="off"))
    self.host = host
    self.port = port
    self._thread = threading.Thread(target=self._server.run, name="uvicorn", daemon=True)

  def start(self, timeout_s: float = 30.0) -> Serving:
    self._thread.start()
    t0 = time.monotonic()
    while not self._server.started:
      if time.monotonic() - t0 > timeout_s or not self._thread.is_alive():
        raise RuntimeError(f"uvicorn did not start on {self.host}:{self.port} within {timeout_s} s.")
      time.sleep(0.02)
    self.port = self._server.servers[0].sockets[0].getsockname()[1]
    return self

  @property
  def url(self) -> str:
    return f"http://{self.host}:{self.port}/v1"

  def stop(self) -> None:
    self._server.should_exit = True
    self._thread.join()


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  """What `experiments/serve_main.py` serves (its flags, one each).

  Attributes:
    checkpoint: a c2jax checkpoint directory: the model's architecture and its first params.
    tokenizer: "byte", or a tokenizer.json / HF model directory (the model's own, for a native chat format).
    chat_format: "brief", "deepseek_v3" or "kimi_k2" (`c2jax.envs.chat.chat_format.CHAT_FORMATS`).
    weights: a weight store URL polled for newer versions every poll_s seconds ("" : the checkpoint's params).
    model_name: the name /v1/models lists.
    slots, context, max_forced: the engine's `EngineConfig` (S, C, F).
    max_tokens: the longest reply, and a request's default.
    temperature, top_p: the sampling of every slot.
    chunk_steps: decode steps between two looks at the queue (new requests join, streams read their tokens).
    seed: the generator of the seeds of requests that give none.
  """

  checkpoint: str
  tokenizer: str = "byte"
  chat_format: str = "brief"
  weights: str = ""
  poll_s: float = 5.0
  model_name: str = "c2jax"
  slots: int = 8
  context: int = 4096
  max_forced: int = 1024
  max_tokens: int = 1024
  temperature: float = 1.0
  top_p: float = 1.0
  chunk_steps: int = 16
  seed: int = 0

  def __post_init__(self):
    from c2jax.envs.chat.chat_format import CHAT_FORMATS
    if not self.checkpoint:
      raise ValueError("--checkpoint is required: the c2jax checkpoint to serve (its architecture and params).")
    if self.chat_format not in CHAT_FORMATS:
      raise ValueError(f"--chat_format={self.chat_format!r} is not one of {', '.join(CHAT_FORMATS.names())}.")
    if not 1 <= self.max_tokens < self.context:
      raise ValueError(f"--max_tokens={self.max_tokens} must be from 1 to --context - 1 = {self.context - 1}.")
    if not 1 <= self.max_forced <= self.context:
      raise ValueError(f"--max_forced={self.max_forced} must be from 1 to --context={self.context}.")
    if self.poll_s < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
      raise ValueError(f"--poll_s={self.poll_s} and --temperature={self.temperature} must be >= 0 and "
                       f"--top_p={self.top_p} in (0, 1].")


def build(cfg: ServeConfig) -> ChatServer:
  """The server of `cfg` (its engine thread not started): the checkpoint's model and params, the tokenizer, the
  chat format, the weight store. Raises `c2jax.input_errors.InputError` (one sentence) on a path that does not exist
  or a tokenizer larger than the model's vocabulary."""
  from c2jax.actors.agent_loop import AgentConfig
  from c2jax.actors.engine import EngineConfig
  from c2jax.actors.sampling import SamplingConfig
  from c2jax.data.tokenizer import make_tokenizer
  from c2jax.input_errors import MismatchedInput
  from c2jax.model.checkpoint import check_checkpoint, load_checkpoint
  from c2jax.rollouts.weight_store import WeightStore

  check_checkpoint(cfg.checkpoint, "--checkpoint")
  tok = make_tokenizer(cfg.tokenizer)
  params, model = load_checkpoint(cfg.checkpoint)
  if tok.vocab_size > model.vocab_size:
    raise MismatchedInput(f"--tokenizer={cfg.tokenizer!r} has {tok.vocab_size} tokens but the model only "
                          f"{model.vocab_size}; give the model's own tokenizer.")
  engine = EngineConfig(slots=cfg.slots, context=cfg.context, max_forced=cfg.max_forced)
  sampling = SamplingConfig(max_new_tokens=1, temperature=cfg.temperature, top_p=cfg.top_p,
                            stop_tokens=(tok.eos_id,))
  # A request's budgets are its own (Episode.turn_tokens); the agent's must not bind.
  agent = AgentConfig(max_turns=10**9, max_turn_tokens=cfg.max_tokens, max_episode_tokens=10**12,
                      chunk_steps=cfg.chunk_steps, tool_workers=1)
  runner = AgentRunner(model, engine, sampling, agent, tok, chat_format=cfg.chat_format)
  weights = Weights(params=params, store=WeightStore(cfg.weights) if cfg.weights else None, poll_s=cfg.poll_s)
  limits = cc.Limits(model=cfg.model_name, temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                     max_forced=cfg.max_forced, context=cfg.context)
  return ChatServer(runner, weights, limits, seed=cfg.seed)
