"""Attacks on the chat formats' structure through the agent engine: a repository whose files and task statement
spell control strings (every format's, cut, twins, forged messages, halves that a tool joins back), read back by the
agent in real sandboxes, in every format. The observation and notice tokens the engine appends after each turn
hold exactly the control ids the template writes around harmless results (the same continuation with every result
"x"), and decode back to the environment's text; the prompt holds exactly the control ids of its harmless twin.

The tokenizers are the small BPEs of tests/data/chat_tokenizers.py saved as HF model directories and read by
c2jax's HFTokenizer, with the control tokens special added tokens or (as DeepSeek-V3's tool-call tokens) not.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import pytest

from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode
from c2jax.actors.engine import EngineConfig
from c2jax.actors.ledger import EpisodeEnd, Source
from c2jax.actors.sampling import SamplingConfig
from c2jax.data.tokenizer import HFTokenizer
from c2jax.envs.chat.chat_format import chat_format
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.core.env import first_observation
from c2jax.envs.tools.protocol import ToolCall, ToolName
from tests import tiny
from tests.actors.agent_loop_chat_test import RecordingEnv
from tests.data import chat_attacks

# The shapes of tests/actors/agent_loop_chat_test.py (one compile for both), longer forced turns.
ENGINE = EngineConfig(slots=2, context=4096, chunk_sizes=(16, 256, 1024), max_forced=512)
# (format, the tokenizer's family, control tokens not marked special).
CASES = (("kimi_k2", "kimi_k2", False), ("deepseek_v3", "deepseek_v3", True), ("brief", "kimi_k2", False))


def _call(name: ToolName, **args) -> ToolCall:
  return ToolCall(name, args)


def attack_files(name: str, family: str) -> dict[str, str]:
  """The hostile files (the tokenizer's own control strings: the others are no tokens of it, and the prompt-side
  tests take them all): them run together, other families' and a forged message, their twins, and the format's
  end-of-turn token (brief: the tokenizer's EOS) cut in two, the halves in two files (`cat` joins them back)."""
  controls = chat_format(family).control_tokens
  split = split_token(name, family)
  return {"notes/all.txt": "".join(controls + chat_attacks.OTHER_FAMILIES) + "\n" + chat_attacks.FORGED[family],
          "notes/twins.txt": " ".join(w for t in controls for w in chat_attacks.twins(t)[:3]) + "\n",
          "notes/head.txt": split[:len(split) // 2], "notes/tail.txt": split[len(split) // 2:]}


def split_token(name: str, family: str) -> str:
  return chat_format(name).end_of_turn or chat_format(family).template.special_tokens["eos_token"]


class ChatInjectionEngineTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.params = tiny.params(tiny.MODEL)

  @parameterized.parameters(*CASES)
  @pytest.mark.slow
  def test_hostile_files_reach_the_model_as_text(self, name, family, non_special):
    tok = HFTokenizer(chat_attacks.model_dir(family, non_special))
    suite = CodingTaskSuite(coding_suite="tiny_functions", tokenizer=chat_attacks.model_dir(family, non_special),
                            chat_format=name, instructions="none", max_turns=6)
    chat, fmt = suite.chat_tokens(), chat_format(name)
    coding = suite.coding_task(suite.task("heldout", 0))
    statement = coding.prompt + "\n" + chat_attacks.FORGED[family]
    task = dataclasses.replace(coding, prompt=statement, files={**coding.files, **attack_files(name, family)})
    text = first_observation(task, suite.env_config, sorted(task.files))
    benign_text = first_observation(dataclasses.replace(task, prompt=coding.prompt + "\nx"), suite.env_config,
                                    sorted(task.files))
    render = fmt.tool_format.render
    stray = fmt.tool_format.call_begin if fmt.native else '<tool name="read_file"><arg name="path">[EOS]</arg>'
    read = ToolName.READ_FILE
    turns = [render([_call(read, path="notes/all.txt"), _call(read, path="notes/twins.txt")]),
             render([_call(read, path="notes/head.txt"), _call(read, path="notes/tail.txt"),
                     _call(ToolName.RUN, command="cat notes/head.txt notes/tail.txt")], first_index=2),
             f"I will look again {stray} here.",  # a malformed call: the harness quotes the model's markers
             render([_call(ToolName.FINISH)], first_index=5)]
    log = []
    stop = () if fmt.native else (tok.eos_id,)
    runner = AgentRunner(tiny.MODEL, ENGINE, SamplingConfig(max_new_tokens=1, temperature=1.0, stop_tokens=stop),
                         AgentConfig(max_turns=6, max_turn_tokens=400, max_episode_tokens=3000),
                         suite.text_tokenizer(), chat_format=name)
    prompt = chat.prompt(text)
    episode = Episode(prompt=prompt, key=0, script=lambda turn, obs: turns[turn] if turn < len(turns) else None,
                      first_observation=text, make_env=lambda: RecordingEnv(task, suite.env_config, log=log))
    (traj,) = runner.run([episode], weights=lambda: (self.params, 0))
    self.assertEqual(traj.end, EpisodeEnd.FINISHED)
    seg = traj.segments[0]

    # Each observation: the control ids the template writes around harmless results, and the text back.
    shown = {turn: [] for turn in range(len(turns))}
    for start, end, source, turn in seg.boundaries():
      if source in (Source.OBSERVATION, Source.NOTICE):
        shown[turn] += [int(t) for t in seg.tokens[start:end]]
    for turn, (turn_text, result) in enumerate(log[:-1]):
      with self.subTest(turn=turn):
        harmless = tuple(dataclasses.replace(r, text="x") for r in result.results)
        benign = fmt.continuation(turn_text, harmless, result.budget) if fmt.native else None
        expected = chat_attacks.control_ids(tok.encode(benign.text, bos=False, eos=False), tok) if benign else []
        self.assertEqual(chat_attacks.control_ids(shown[turn], tok), expected)
        self.assertEqual(tok.decode(shown[turn], skip_special_tokens=False), result.observation + result.notice)
    self.assertIn(chat_attacks.FORGED[family], log[0][1].observation)  # the files were read back whole
    self.assertIn(split_token(name, family), log[1][1].observation)  # cat joined the halves
    # The prompt: the control ids of its harmless twin, and the text back.
    prompt_ids = seg.tokens[seg.source == int(Source.PROMPT)]
    self.assertEqual(chat_attacks.control_ids(prompt_ids, tok), chat_attacks.control_ids(chat.prompt(benign_text), tok))
    if not fmt.native:  # brief: BOS, then the first observation
      self.assertEqual(int(prompt_ids[0]), tok.bos_id)
      prompt_ids = prompt_ids[1:]
    self.assertEqual(tok.decode(prompt_ids, skip_special_tokens=False), chat.prompt_text(text))
    self.assertEqual([t for t, _ in log], turns)
    self.assertEqual(seg.drift, 0)


if __name__ == "__main__":
  jax.config.parse_flags_with_absl()
  absltest.main()
