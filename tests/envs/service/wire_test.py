"""The environment service's payloads and configuration without a server: every TurnResult field round-trips,
malformed payloads are refused in one sentence, a suite spec builds the same suite, and bad configs and secrets are
refused."""

import json
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.chat import markup
from c2jax.envs.chat.chat_format import Continuation, ToolResult
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.core.agent_env import TurnResult
from c2jax.envs.service import wire
from c2jax.envs.service.config import EnvServiceConfig, read_secret
from c2jax.envs.service.suites import SuiteCache, build_suite, suite_spec
from c2jax.envs.token_tasks.char_class import CharClassSuite

CONT = Continuation((markup.Piece("<tool>", markup.Kind.CONTROL), markup.Piece("out ✓\n")),
                    (markup.Piece("budget"), markup.Piece("<|Assistant|>", markup.Kind.CONTROL)))
FULL = TurnResult(observation=CONT.observation, notice=CONT.notice, done=True, reason="turn_budget",
                  results=(ToolResult("ok", call=0, ok=True, tool="run"), ToolResult("bad call", None, False, "")),
                  budget="[2 turns left]", continuation=CONT)


def _wire(obj) -> dict:
  return wire.decode(wire.encode(obj), "Step")


class WireTest(parameterized.TestCase):

  @parameterized.parameters(FULL, TurnResult(observation="plain"), TurnResult(observation="", done=True))
  def test_turn_results_round_trip(self, result):
    self.assertEqual(wire.turn_result(_wire(wire.turn_result_plain(result))), result)

  def test_reward_terms_round_trip(self):
    terms = {"outcome": 0.1 + 0.2, "hack_attempts": 0.0, "turns": 3}
    self.assertEqual(wire.reward_terms(_wire(wire.reward_plain(terms))), {k: float(v) for k, v in terms.items()})

  @parameterized.named_parameters(
      ("not_json", b"{", "not UTF-8 JSON"),
      ("not_an_object", b"[1]", "not an object"),
      ("missing", wire.encode({k: v for k, v in wire.turn_result_plain(FULL).items() if k != "done"}),
       "'done' is missing"),
      ("wrong_type", wire.encode({**wire.turn_result_plain(FULL), "done": 1}), "'done' is a int, not bool"),
      ("bad_kind", wire.encode({**wire.turn_result_plain(FULL),
                                "continuation": {"observation": [["x", "script"]], "notice": []}}), "piece kind"),
      ("continuation_disagrees", wire.encode({**wire.turn_result_plain(FULL), "observation": "other"}),
       "continuation must spell"),
      ("bad_call", wire.encode({**wire.turn_result_plain(FULL), "results": [{"text": "", "call": -1, "ok": True,
                                                                            "tool": ""}]}), "call index"),
  )
  def test_malformed_results_are_refused(self, data, message):
    with self.assertRaisesRegex(wire.WireError, message):
      wire.turn_result(wire.decode(data, "Step"))

  def test_malformed_requests_are_refused(self):
    with self.assertRaisesRegex(wire.WireError, "not an episode id"):
      wire.episode_id({"episode": "A" * 32}, "Step")
    with self.assertRaisesRegex(wire.WireError, "token ids"):
      wire.step_ids({"ids": [1, True]})
    with self.assertRaisesRegex(wire.WireError, "token ids"):
      wire.step_ids({"ids": [-1]})
    with self.assertRaisesRegex(wire.WireError, "not a finite number"):
      wire.reward_terms(json.loads('{"terms": {"outcome": NaN}}'))
    self.assertTrue(wire.valid_client_token("0a" * 16))
    self.assertFalse(wire.valid_client_token("0A" * 16))


class SuiteSpecTest(absltest.TestCase):

  def test_specs_build_equal_suites(self):
    for suite in (CharClassSuite(seed=4, prefix_len=2),
                  CodingTaskSuite(coding_suite="tiny_spec", suite_options={"max_difficulty": 1}, max_turns=3)):
      spec = json.loads(json.dumps(suite_spec(suite)))  # as it crosses the wire
      self.assertEqual(build_suite(spec), suite)
    cache = SuiteCache(size=1)
    spec = suite_spec(CharClassSuite(seed=4))
    self.assertIs(cache.suite(spec), cache.suite(dict(spec)))
    env = cache.agent_env(spec, "heldout", 2)
    self.assertEqual(env.task, CharClassSuite(seed=4).task("heldout", 2))

  def test_bad_specs_are_refused(self):
    with self.assertRaisesRegex(ValueError, "Unknown task suite 'nope'"):
      build_suite({"suite": "nope"})
    with self.assertRaisesRegex(ValueError, "needs a suite name"):
      build_suite({"seed": 1})
    with self.assertRaisesRegex(ValueError, "suite has no field .bogus."):
      build_suite({"suite": "char_class", "bogus": 1})
    with self.assertRaisesRegex(ValueError, "task index"):
      SuiteCache().agent_env({"suite": "char_class"}, "train", -1)
    with self.assertRaisesRegex(ValueError, "Unknown split"):
      SuiteCache().agent_env({"suite": "char_class"}, "test", 0)


class ConfigTest(absltest.TestCase):

  def test_in_process_by_default(self):
    self.assertFalse(EnvServiceConfig().remote)
    self.assertTrue(EnvServiceConfig(local=2).remote)
    self.assertTrue(EnvServiceConfig(servers=["h:1"]).remote)

  def test_bad_configs_are_refused(self):
    for kwargs, message in (({"servers": ("nohost",)}, "not host:port"), ({"local": -1}, "local=-1"),
                            ({"down_s": 0}, "down_s=0"), ({"tls_cert": "a.pem"}, "go together"),
                            ({"secret_env": ""}, "secret_env")):
      with self.assertRaisesRegex(ValueError, message):
        EnvServiceConfig(**kwargs)

  def test_secrets(self):
    with mock.patch.dict(os.environ, {"S1": "x" * 16, "S2": "short", "S3": "é" * 20}):
      self.assertEqual(read_secret("S1"), "x" * 16)
      for name in ("S2", "S3", "UNSET_VARIABLE_OF_THIS_TEST"):
        with self.assertRaisesRegex(ValueError, f"^Environment variable {name} must hold"):
          read_secret(name)


if __name__ == "__main__":
  absltest.main()
