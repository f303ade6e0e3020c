"""The OpenAI-compatible endpoint through the official `openai` client, against a uvicorn server on a loopback port
(in-process thread) over the tiny byte model: /v1/models, a multi-turn tool-calling conversation token for token
against the agent loop run directly (zero drift), streaming against non-streaming, concurrent clients against
each alone, an in-flight weight reload from the weight store, and bad requests (400, one sentence)."""

import concurrent.futures
import tempfile

from absl.testing import absltest
import jax
import numpy as np
import openai
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode
from c2jax.actors.ledger import Source
from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.envs.chat.chat_format import Continuation, ToolResult, chat_format
from c2jax.envs.core.agent_env import TurnResult
from c2jax.envs.tools import protocol
from c2jax.rollouts.weight_store import WeightStore
from c2jax.services import chat_completions as cc
from c2jax.services import openai_server
from tests import tiny

MAX_TOKENS = 24
LIMITS = cc.Limits(model="tiny", temperature=1.0, top_p=1.0, max_tokens=64, max_forced=tiny.ENGINE.max_forced,
                   context=tiny.ENGINE.context)
AGENT = AgentConfig(max_turns=1000, max_turn_tokens=MAX_TOKENS, max_episode_tokens=10**6, chunk_steps=8,
                    tool_workers=1)
USER = "Read a.py and fix the bug."


def _runner() -> AgentRunner:
  return AgentRunner(tiny.BYTES, tiny.ENGINE, tiny.ENGINE_SAMPLING, AGENT, ByteTokenizer())


def _serve(weights) -> tuple[openai_server.ChatServer, openai_server.Serving, openai.OpenAI]:
  server = openai_server.ChatServer(_runner(), weights, LIMITS)
  server.start()
  serving = openai_server.Serving(openai_server.make_app(server)).start()
  client = openai.OpenAI(base_url=serving.url, api_key="unused", max_retries=0, timeout=300)
  return server, serving, client


class _Scripted:
  """The agent loop's side of the conversation: each turn's continuation as the brief format writes it."""

  def __init__(self, steps):
    self.steps, self.k = steps, 0

  def reset(self):
    pass

  def step(self, ids, text):
    del ids
    k, self.k = self.k, self.k + 1
    if k >= len(self.steps):
      return TurnResult(observation="", done=True, reason="finish")
    results, notice = self.steps[k]
    cont = chat_format("brief").continuation(text, results, notice)
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
    alone = [_ids(self._ask(m, seed=s)) for m, s in asks]
    with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
      together = list(pool.map(lambda a: _ids(self._ask(*a)), asks))
    self.assertEqual(together, alone)
    self.assertGreater(len({tuple(a) for a in alone}), 1)

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
class WeightReloadTest(absltest.TestCase):

  def test_a_new_version_is_picked_up_in_flight(self):
    url = tempfile.mkdtemp()
    store = WeightStore(url)
    old, new = tiny.params(tiny.BYTES), tiny.params(tiny.BYTES, seed=1)
    store.publish(1, jax.device_get(old))
    server, serving, client = _serve(openai_server.Weights(store=WeightStore(url), poll_s=0.0))
    try:
      messages = [{"role": "user", "content": USER}]
      ask = lambda: client.chat.completions.create(model="tiny", messages=messages, seed=3, max_tokens=MAX_TOKENS)
      before = ask()
      store.publish(2, jax.device_get(new))
      after = ask()
    finally:
      serving.stop()
      server.stop()
    self.assertEqual((before.system_fingerprint, after.system_fingerprint), ("c2jax-v1", "c2jax-v2"))
    episode = lambda: Episode(prompt=_runner().chat.prompt(USER), make_env=lambda: _Scripted([]), key=3,
                              turn_tokens=(MAX_TOKENS,))
    for answer, params in ((before, old), (after, new)):
      (traj,) = _runner().run([episode()], weights=lambda p=params: (p, 0))
      np.testing.assert_array_equal(traj.tokens[traj.source == int(Source.MODEL)], _ids(answer))
    self.assertNotEqual(_ids(before), _ids(after))


if __name__ == "__main__":
  absltest.main()
