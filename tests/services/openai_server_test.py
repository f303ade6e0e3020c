"""The OpenAI-compatible endpoint through the official `openai` client, against a uvicorn server on a loopback port
(in-process thread) over the tiny byte model: /v1/models, a multi-turn tool-calling conversation token for token
against the agent loop run directly (zero drift), streaming against non-streaming, concurrent clients against
each alone, an in-flight weight reload from the weight store, and bad requests (400, one sentence)."""

import concurrent.futures
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import jax
import openai
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import Source
from c2jax.actors.sampling import SamplingConfig
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, Continuation, ToolResult, chat_format
from c2jax.envs.chat.tool_formats import tool_schemas
from c2jax.envs.core.agent_env import TurnResult
from c2jax.envs.tools import protocol
from c2jax.model.checkpoint import save_checkpoint
from c2jax.rollouts.weight_store import WeightStore
from c2jax.services import chat_completions as cc
from c2jax.services import openai_server
from tests import tiny
from tests.data import chat_attacks

MAX_TOKENS = 24
LIMITS = cc.Limits(model="tiny", temperature=1.0, top_p=1.0, max_tokens=64, max_forced=tiny.ENGINE.max_forced,
                   context=tiny.ENGINE.context)
AGENT = AgentConfig(max_turns=1000, max_turn_tokens=MAX_TOKENS, max_episode_tokens=10**6, chunk_steps=8,
                    tool_workers=1)
USER = "Read a.py and fix the bug."
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# A native format's prompt declares every tool (~1,800 tokens of the small BPEs): the engine of
# tests/actors/agent_loop_chat_test.py, whose programs this one shares.
NATIVE_ENGINE = EngineConfig(slots=2, context=4096, chunk_sizes=(16, 256, 1024), max_forced=512)


def _runner(chat_format_name: str = "brief") -> AgentRunner:
  if chat_format_name == "brief":
    return AgentRunner(tiny.BYTES, tiny.ENGINE, tiny.ENGINE_SAMPLING, AGENT, ByteTokenizer())
  return AgentRunner(tiny.MODEL, NATIVE_ENGINE, SamplingConfig(max_new_tokens=1, temperature=1.0), AGENT,
                     make_tokenizer(chat_attacks.model_dir(chat_format_name)), chat_format=chat_format_name)


def _serve(weights, chat_format_name: str = "brief") -> tuple[openai_server.ChatServer, openai_server.Serving,
                                                               openai.OpenAI]:
  runner = _runner(chat_format_name)
  limits = LIMITS if chat_format_name == "brief" else dataclasses.replace(
      LIMITS, max_forced=NATIVE_ENGINE.max_forced, context=NATIVE_ENGINE.context)
  server = openai_server.ChatServer(runner, weights, limits)
  server.start()
  serving = openai_server.Serving(openai_server.make_app(server)).start()
  client = openai.OpenAI(base_url=serving.url, api_key="unused", max_retries=0, timeout=300)
  return server, serving, client


class _Scripted:
  """The agent loop's side of the conversation: each turn's continuation as the chat format writes it."""

  def __init__(self, steps, name: str = "brief"):
    self.steps, self.k, self.name = steps, 0, name

  def reset(self):
    pass

  def step(self, ids, text):
    del ids
    k, self.k = self.k, self.k + 1
    if k >= len(self.steps):
      return TurnResult(observation="", done=True, reason="finish")
    results, notice = self.steps[k]
    cont = chat_format(self.name).continuation(text, results, notice)
    return TurnResult(observation=cont.observation, notice=cont.notice,
                      continuation=Continuation(cont.observation_markup, cont.notice_markup))

  def reward(self):
    return {}

  def close(self):
    pass


def _ids(completion) -> list[int]:
  return completion.choices[0].model_extra["token_ids"]


@pytest.mark.e2e
@pytest.mark.slow
class OpenAIServerTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = tiny.params(tiny.BYTES)
    cls.server, cls.serving, cls.client = _serve(openai_server.Weights(params=cls.params, version=7))

  @classmethod
  def tearDownClass(cls):
    cls.serving.stop()
    cls.server.stop()
    super().tearDownClass()

  def _ask(self, messages, seed, **kwargs):
    return self.client.chat.completions.create(model="tiny", messages=messages, seed=seed, max_tokens=MAX_TOKENS,
                                               **kwargs)

  def test_models_lists_the_served_model(self):
    self.assertEqual([m.id for m in self.client.models.list().data], ["tiny"])

  def test_a_tool_calling_conversation_has_the_agent_loops_tokens(self):
    # The conversation: a tool call (written here, as an earlier turn of the model), its result; then three turns
    # the model samples, each answered with a user message.
    call = protocol.ToolCall(protocol.ToolName.READ_FILE, {"path": "a.py"})
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": USER},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_0", "type": "function",
                     "function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}]},
                {"role": "tool", "tool_call_id": "call_0", "content": "def f(x):\n  return x + 2\n"}]
    replies = []
    for k in range(3):
      answer = self._ask(messages, seed=11)
      self.assertEqual(answer.system_fingerprint, "c2jax-v7")
      replies.append(_ids(answer))
      message = answer.choices[0].message
      messages += [{"role": "assistant", "content": message.content}, {"role": "user", "content": f"go on {k}"}]

    # The same conversation played by the agent loop, its first turn forced as the server forces it.
    chat = _runner().chat
    first = chat.turn_ids(protocol.render(call))
    steps = [((ToolResult("def f(x):\n  return x + 2\n", call=0, tool="read_file"),), "")]
    steps += [((), f"go on {k}") for k in range(2)]
    episode = Episode(prompt=chat.prompt(USER), make_env=lambda: _Scripted(steps), key=11,
                      script=lambda turn, obs: first if turn == 0 else None,
                      turn_tokens=(len(first),) + (MAX_TOKENS,) * 3)
    (traj,) = _runner().run([episode], weights=lambda: (self.params, 7))
    model = traj.source == int(Source.MODEL)
    turns = [traj.tokens[model & (traj.turn == t)].tolist() for t in range(4)]
    self.assertEqual(turns[0], first.tolist())
    self.assertEqual(turns[1:], replies)  # zero drift: token for token
    self.assertTrue(all(len(r) > 1 for r in replies))

  def test_streaming_equals_non_streaming(self):
    messages = [{"role": "user", "content": USER}]
    whole = self._ask(messages, seed=5)
    chunks = list(self._ask(messages, seed=5, stream=True, stream_options={"include_usage": True}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    self.assertEqual(content, whole.choices[0].message.content)
    last = [c for c in chunks if c.choices][-1]
    self.assertEqual(last.choices[0].finish_reason, whole.choices[0].finish_reason)
    self.assertEqual(last.choices[0].model_extra["token_ids"], _ids(whole))
    self.assertEqual(chunks[-1].usage.completion_tokens, whole.usage.completion_tokens)
    self.assertGreater(sum(1 for c in chunks if c.choices and c.choices[0].delta.content), 1)  # read as drawn

  def test_concurrent_clients_get_what_they_get_alone(self):
    asks = [([{"role": "user", "content": f"Task {i}: {USER}"}], 100 + i) for i in range(6)]  # 6 asks, 4 slots
    stats = self.server.runner.stats
    decodes = stats.decodes
    alone = [_ids(self._ask(m, seed=s)) for m, s in asks]
    decodes, alone_decodes = stats.decodes, stats.decodes - decodes
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
      together = list(pool.map(lambda a: _ids(self._ask(*a)), asks))
    self.assertEqual(together, alone)
    self.assertGreater(len({tuple(a) for a in alone}), 1)
    self.assertLess(stats.decodes - decodes, alone_decodes)  # they were decoded together

  def test_bad_requests_are_400_with_one_sentence(self):
    user = [{"role": "user", "content": USER}]
    for kwargs, words in ((dict(messages=user, temperature=0.3), "temperature"),
                          (dict(messages=user, max_tokens=10**6), "max_tokens"),
                          (dict(messages=user + [{"role": "assistant", "content": "x"}]), "last message"),
                          (dict(messages=user, tool_choice="required"), "tool_choice"),
                          (dict(messages=[{"role": "robot", "content": "x"}]), "role")):
      with self.subTest(words):
        with self.assertRaises(openai.BadRequestError) as e:
          self.client.chat.completions.create(model="tiny", **kwargs)
        self.assertEqual(e.exception.status_code, 400)
        message = e.exception.body["message"]
        self.assertIn(words, message)
        self.assertEqual(message.count(". "), 0, message)  # one sentence


@pytest.mark.e2e
@pytest.mark.slow
class NativeFormatTest(absltest.TestCase):

  def test_deepseek_tool_calls_in_its_own_template_have_the_agent_loops_tokens(self):
    name = "deepseek_v3"
    fmt = chat_format(name)
    params = tiny.params(tiny.MODEL)
    server, serving, client = _serve(openai_server.Weights(params=params), name)
    call = protocol.ToolCall(protocol.ToolName.READ_FILE, {"path": "a.py"})
    first_text = fmt.tool_format.render((call,), first_index=0)
    written = fmt.assistant_message(first_text)
    result = "def f(x):\n  return x + 2\n"
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": USER},
                {"role": "assistant", "content": written["content"], "tool_calls": written["tool_calls"]},
                {"role": "tool", "content": result}]
    replies = []
    try:
      for k in range(2):
        answer = client.chat.completions.create(model="tiny", messages=messages, tools=tool_schemas(), seed=4,
                                                max_tokens=MAX_TOKENS)
        replies.append(_ids(answer))
        message = answer.choices[0].message
        messages += [{"role": "assistant", "content": message.content,
                      **({"tool_calls": [c.model_dump() for c in message.tool_calls]} if message.tool_calls
                         else {})},
                     {"role": "user", "content": f"go on {k}"}]
    finally:
      serving.stop()
      server.stop()
    runner = _runner(name)
    chat = runner.chat
    first = chat.turn_ids(first_text)
    steps = [((ToolResult(result, call=0, tool="read_file"),), ""), ((), "go on 0")]
    episode = Episode(prompt=chat.prompt(USER), make_env=lambda: _Scripted(steps, name), key=4,
                      script=lambda turn, obs: first if turn == 0 else None,
                      turn_tokens=(len(first),) + (MAX_TOKENS,) * 2)
    (traj,) = runner.run([episode], weights=lambda: (params, 0))
    model = traj.source == int(Source.MODEL)
    turns = [traj.tokens[model & (traj.turn == t)].tolist() for t in range(3)]
    self.assertEqual(turns[0], first.tolist())
    self.assertEqual(turns[1:], replies)  # zero drift in the model's own template
    self.assertTrue(all(len(r) > 1 for r in replies))


@pytest.mark.e2e
@pytest.mark.slow
class WeightReloadTest(absltest.TestCase):

  def test_a_new_version_is_picked_up_in_flight(self):
    # A publisher writes version 2 while a reply is being decoded: the store is asked before every device call,
    # and the third call of the reply (its second decode chunk) is where version 2 lands.
    url = tempfile.mkdtemp()
    store = WeightStore(url)
    old, new = tiny.params(tiny.BYTES), tiny.params(tiny.BYTES, seed=1)
    store.publish(1, jax.device_get(old))
    polled = openai_server.Weights(store=WeightStore(url), poll_s=0.0)
    calls = []

    def weights():
      calls.append(None)
      if len(calls) == 3:
        store.publish(2, jax.device_get(new))
      return polled()

    server, serving, client = _serve(weights)
    messages = [{"role": "user", "content": USER}]
    try:
      chunks = list(client.chat.completions.create(model="tiny", messages=messages, seed=3, max_tokens=64,
                                                   stream=True))
      after = client.chat.completions.create(model="tiny", messages=messages, seed=3, max_tokens=64)
    finally:
      serving.stop()
      server.stop()
    last = [c for c in chunks if c.choices][-1]
    during = last.choices[0].model_extra["token_ids"]
    self.assertEqual((last.system_fingerprint, after.system_fingerprint), ("c2jax-v2", "c2jax-v2"))

    def played(switch_at: int) -> list[int]:
      """The agent loop's reply with version 1 for its first switch_at - 1 device calls, then version 2."""
      n = []

      def swap():
        n.append(None)
        return (old, 1) if len(n) < switch_at else (new, 2)

      episode = Episode(prompt=_runner().chat.prompt(USER), make_env=lambda: _Scripted([]), key=3,
                        turn_tokens=(64,))
      (traj,) = _runner().run([episode], weights=swap)
      model = traj.source == int(Source.MODEL)
      self.assertEqual(traj.versions[model][-1], 1 if switch_at > len(n) else 2)
      return traj.tokens[model].tolist()

    self.assertEqual(during, played(3))  # the tokens after the reload follow the new params
    self.assertEqual(_ids(after), played(1))
    self.assertNotEqual(during, played(10**9))  # ... and differ from version 1's (the reload was mid-reply)
    self.assertGreater(len(during), 1 + AGENT.chunk_steps)  # tokens were drawn after the swap (append + 1 chunk)


@pytest.mark.e2e
@pytest.mark.slow
class ServeMainTest(absltest.TestCase):

  def test_the_entry_point_serves_a_checkpoint(self):
    directory = os.path.join(tempfile.mkdtemp(), "ckpt")
    save_checkpoint(directory, tiny.params(tiny.BYTES), tiny.BYTES)
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    main = os.path.join(ROOT, "experiments", "serve_main.py")
    proc = subprocess.Popen([sys.executable, main, f"--checkpoint={directory}", f"--port={port}", "--slots=4",
                             "--context=1280", "--max_forced=256", "--max_tokens=16", "--model_name=tiny"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
      client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=300)
      deadline = time.monotonic() + 120
      while True:
        try:
          self.assertEqual([m.id for m in client.models.list().data], ["tiny"])
          break
        except openai.APIConnectionError:
          self.assertIsNone(proc.poll(), "serve_main.py exited before it answered")
          self.assertLess(time.monotonic(), deadline, "serve_main.py did not answer within 120 s")
          time.sleep(0.5)
      answer = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": USER}], seed=2)
      self.assertBetween(len(_ids(answer)), 1, 16)
    finally:
      proc.terminate()
      proc.wait(timeout=60)

  def test_a_path_that_does_not_exist_is_refused_in_one_sentence(self):
    main = os.path.join(ROOT, "experiments", "serve_main.py")
    out = subprocess.run([sys.executable, main, "--checkpoint=/nonexistent"], capture_output=True, text=True,
                         timeout=120)
    self.assertEqual(out.returncode, 2, out.stderr)
    self.assertIn("does not exist", out.stderr)
    self.assertNotIn("Traceback", out.stderr)


if __name__ == "__main__":
  absltest.main()
