"""The walkthrough (docs/walkthrough.md, "From a real checkpoint to RL and back"), command for command: convert an
HF DeepSeek-V3 release, evaluate it in its own chat format, run RL from it, export the RL policy to HF.

The commands are read from the doc's code block and run as subprocesses, with tiny budgets appended, on a tiny
random release the test writes as a real one is laid out: `hf_export.export_params` of a 2-layer tiny MoE with an
MTP module (bf16, router float32) and, in the same directory, its tokenizer: a byte-level BPE trained here on the
suites' rendered native prompts and files, holding the DeepSeek template's control tokens as single tokens (BOS 0
and EOS 1, as DeepSeek's), saved by transformers with the template. The references are independent of the
commands: the release's own params, the run's own task suite re-rendered, HF transformers' model and tokenizer.
Only the DeepSeek-V3 layout is walked: Kimi K2.5 releases go through the same converter
(tests/model/hf_convert_kimi_test.py).
"""

import json
import os
import pathlib
import re
import shlex
import shutil
import string
import subprocess
import sys
import tempfile

from absl.testing import absltest
import chex
import jax
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers

from c2jax.actors.ledger import Source
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, chat_format
from c2jax.envs.core.env import EnvConfig, first_observation
from c2jax.model import checkpoint as ckpt_lib
from c2jax.model import hf_export
from c2jax.model import params as params_lib
from c2jax.model import presets
from c2jax.model import transformer
from c2jax.rollouts.buffer import RolloutReader
from c2jax.rollouts.weight_store import WeightStore
from c2jax.eval import suite_eval
from c2jax.services import rl_run_config
from tests import tiny

pytestmark = pytest.mark.e2e  # four entry points as subprocesses, an RL run with an actor process and sandboxes

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_DOC = "docs/walkthrough.md"
_TITLE = "# From a real checkpoint to RL and back: a walkthrough"
_FORMAT = "deepseek_v3"
_VOCAB = 2048
_RTOL = 1e-4  # tests/model/hf_export_test.py's
# What each command of the walkthrough runs, in order, and what the test appends to it: no progress bars; one task
# and one episode of two turns for the evaluation; two RL updates of one group of two episodes, one held-out episode
# (the prompts are ~50 tokens of this BPE: slots of 256 positions).
_BUDGETS = {
    "tools/convert_hf.py": ["--noprogress"],
    "experiments/eval_main.py": [
        "--config.max_tasks=1", "--config.samples=1", "--config.workers=1", "--config.env.max_turns=2",
        "--config.sampling.slots=1", "--config.sampling.context=256", "--config.sampling.max_new_tokens=16",
        "--config.sampling.max_episode_tokens=32"],
    "experiments/rl_main.py": [
        "--config.trainer.steps=2", "--config.trainer.groups_per_step=1", "--config.actors.group_size=2",
        "--config.actors.groups_per_call=1", "--config.actors.num=1", "--config.actors.context=256",
        "--config.actors.max_turns=2", "--config.task.max_turns=2", "--config.actors.max_new_tokens=16",
        "--config.actors.max_episode_tokens=32", "--config.eval.tasks=1", "--config.eval.samples=1",
        "--config.eval.best_of=1", "--config.rl.pass_k=(1,)", "--config.eval.process=False"],
    "tools/export_hf.py": ["--noprogress"],
}
# The suites the commands use (eval_realistic's, the RL command's): their prompts and files train the BPE.
_SUITES = (("realistic", "heldout"), ("tiny_spec", "train"), ("tiny_spec", "heldout"))


def walkthrough_commands() -> tuple[set[str], list[list[str]]]:
  """(the variables the code block assigns, its commands as argv lists) from the walkthrough doc's bash block."""
  text = (_ROOT / _DOC).read_text(encoding="utf-8")
  if not text.startswith(_TITLE + "\n"):
    raise AssertionError(f"{_DOC} does not start with {_TITLE!r}.")
  blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
  if len(blocks) != 1:
    raise AssertionError(f"{_DOC} has {len(blocks)} bash blocks; the walkthrough is one.")
  block = blocks[0].replace("\\\n", " ")
  variables, commands = set(), []
  for line in block.splitlines():
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    if re.match(r"[A-Z_]+=", line):
      variables |= {word.split("=", 1)[0] for word in shlex.split(line)}
    else:
      commands.append(shlex.split(line))
  return variables, commands




def _bf16_rounded(params, cfg):
  """The params as a bf16 file holds them: every leaf rounded to bf16 but the float32 router and its bias."""
  keep = jax.tree.map(lambda s: s.dtype == "float32", params_lib.param_specs(cfg),
                      is_leaf=lambda x: isinstance(x, params_lib.ParamSpec))
  return jax.tree.map(lambda p, k: np.asarray(p, np.float32) if k else
                      np.asarray(p).astype(ml_dtypes.bfloat16).astype(np.float32), params, keep)


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
  """A byte-level BPE of the suites' native prompts and files, with the template's control tokens first."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  import c2jax.envs.tasks.suites  # noqa: F401  (registers the suites)
  from c2jax.envs.tasks.coding_tasks import CODING_SUITES
  fmt = chat_format(_FORMAT)
  corpus = []
  for suite, split in _SUITES:
    for task in CODING_SUITES.get(suite)().tasks(split)[:8]:
      obs = first_observation(task, EnvConfig(max_turns=2, chat_format=_FORMAT), sorted(task.files))
      corpus += [fmt.prompt(SYSTEM_PROMPT, obs), *task.files.values()]
  # No pre-tokenizer split: merges may span words, so the prompts' long tool declarations take a few tokens.
  # Piece boundaries all fall on control tokens, so pieces still tokenize as their concatenation does.
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(corpus, trainers.BpeTrainer(
      vocab_size=_VOCAB, special_tokens=list(fmt.control_tokens), show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  special = fmt.template.special_tokens
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special["bos_token"],
                                              eos_token=special["eos_token"], chat_template=fmt.template.source)


def write_release(workdir: str):
  """A tiny random DeepSeek-V3 release in workdir/release (weights and tokenizer files); returns (dir, params,
  cfg)."""
  tok = _tokenizer()
  tok_dir, release = os.path.join(workdir, "tokenizer"), os.path.join(workdir, "release")
  tok.save_pretrained(tok_dir)
  vocab = -(-len(tok) // 128) * 128
  cfg = presets.model_config("tiny", {"vocab_size": vocab, "n_layers": 2, "num_mtp_layers": 1})
  params = tiny.random_params(cfg)
  hf_export.export_params(params, cfg, release, tokenizer_dir=tok_dir, progress=False)  # bf16, as released
  return release, params, cfg


class WalkthroughTest(absltest.TestCase):

  def _run(self, argv: list[str], env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=_ROOT, env=env, capture_output=True, text=True, timeout=900)
    self.assertEqual(proc.returncode, 0, f"{shlex.join(argv[1:])}\n{proc.stderr[-3000:]}")
    return proc

  def test_walkthrough_on_a_tiny_release(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    variables, commands = walkthrough_commands()
    self.assertEqual(variables, {"SRC", "CKPT", "RUNS"})
    self.assertEqual([c[1] for c in commands], list(_BUDGETS))
    work = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    src, params, cfg = write_release(work)
    where = {"SRC": src, "CKPT": os.path.join(work, "ckpt"), "RUNS": os.path.join(work, "runs")}
    env = dict(os.environ, PYTHONPATH=str(_ROOT))
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    out, err = {}, {}
    for argv in commands:
      self.assertEqual(argv[0], ".venv/bin/python")
      argv = [sys.executable] + [string.Template(a).substitute(where) for a in argv[1:]] + _BUDGETS[argv[1]]
      proc = self._run(argv, env)
      out[argv[1]], err[argv[1]] = proc.stdout, proc.stderr
    runs = pathlib.Path(where["RUNS"])

    # 1. The converted checkpoint is the release: its architecture, its params as stored (bf16, router float32).
    got, got_cfg = ckpt_lib.load_checkpoint(where["CKPT"])
    self.assertEqual(got_cfg.to_hf_dict(), cfg.to_hf_dict())
    self.assertEqual(got_cfg.param_dtype, "bfloat16")
    chex.assert_trees_all_equal(jax.tree.map(lambda a: np.asarray(a, np.float32), jax.device_get(got)),
                                _bf16_rounded(params, cfg))

    # 2. The evaluation ran its episode to the end on the suite.
    summary = json.loads(out["experiments/eval_main.py"].strip().splitlines()[-1])
    self.assertEqual((summary["suite"], summary["policy"], summary["episodes"], summary["errors"]),
                     ("realistic", "checkpoint", 1, 0))
    (episode,) = json.loads((runs / "eval" / "report.json").read_text())["episodes"]
    self.assertIsNone(episode["error"])
    self.assertGreaterEqual(episode["turns"], 1)
    # It said what it was doing (a bar over the episodes, the engine's compile announced above it), wrote its
    # resolved config and said where its outputs are.
    said = err["experiments/eval_main.py"]
    self.assertIn("evaluate realistic (heldout): 100%", said)
    self.assertIn("compiling the agent engine's programs", said)
    self.assertIn(f"resolved run config: {runs / 'eval' / 'config.json'}", said)
    written = suite_eval.parse(json.loads((runs / "eval" / "config.json").read_text()))
    self.assertEqual((written.policy, written.checkpoint, written.max_tasks), ("checkpoint", where["CKPT"], 1))
    self.assertIn(f"outputs in {runs / 'eval'}:", out["experiments/eval_main.py"])

    # 3. RL trained on episodes in the native format: each row's prompt is the run's task rendered by the template
    # in the release's tokenizer, and everything the environment appended opens with a control token.
    result = json.loads(out["experiments/rl_main.py"].strip().splitlines()[-1])
    self.assertEqual((result["steps"], result["interrupted"]), (2, False))
    # From a converted checkpoint: no SFT; the engine's programs, then the evaluations and RL.
    self.assertIn("stage 1/4: compiling the sampling programs", err["experiments/rl_main.py"])
    self.assertIn("stage 2/4: held-out evaluation before RL", err["experiments/rl_main.py"])
    self.assertIn("stage 4/4: held-out evaluation after RL done in", err["experiments/rl_main.py"])
    suite = rl_run_config.from_json((runs / "rl" / "config.json").read_text()).task_suite()
    self.assertEqual((suite.chat_format, suite.coding_suite), (_FORMAT, "tiny_spec"))
    release_tok = transformers.AutoTokenizer.from_pretrained(src)
    control = {release_tok.convert_tokens_to_ids(t) for t in chat_format(_FORMAT).control_tokens}
    groups = RolloutReader(str(runs / "rl" / "buffer")).poll()
    self.assertGreaterEqual(len(groups), 2)
    rows = 0
    for g in groups:
      _, split, index = g.meta["task_id"].rsplit("/", 2)
      prompt = suite.task(split, int(index)).prompt
      d = g.data
      for r in range(d["tokens"].shape[0]):
        n = int(d["prompt_length"][r] + d["length"][r])
        tokens, source = d["tokens"][r, :n], d["source"][r, :n]
        np.testing.assert_array_equal(tokens[:int(d["prompt_length"][r])], prompt)
        opens = np.flatnonzero((source[1:] != source[:-1]) & np.isin(source[1:], [Source.OBSERVATION,
                                                                                  Source.NOTICE])) + 1
        self.assertTrue(all(int(tokens[i]) in control for i in opens), tokens)
        rows += 1
    self.assertEqual(rows, 2 * len(groups))
    # The run's model/ is its last published version: the release's architecture, float32 weights.
    rl_params, rl_cfg = ckpt_lib.load_checkpoint(str(runs / "rl" / "model"))
    self.assertEqual(rl_cfg, got_cfg.replace(param_dtype="float32"))
    version, published = WeightStore(str(runs / "rl" / "weights")).load()
    self.assertEqual(version, result["version"])
    chex.assert_trees_all_equal(jax.device_get(rl_params), published)

    # 4. The export: HF transformers loads every tensor (MTP aside: it has no MTP module) and computes the RL
    # policy's logits of an RL row; its tokenizer renders that row's prompt by the copied chat template.
    hf = runs / "hf"
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(hf), dtype=torch.float32,
                                                                    output_loading_info=True)
    self.assertEqual((info["missing_keys"], info["mismatched_keys"]), (set(), set()))
    mtp = f"model.layers.{cfg.n_layers}."
    self.assertEqual([k for k in info["unexpected_keys"] if not k.startswith(mtp)], [])
    d = groups[0].data
    toks = d["tokens"][:1, :int(d["prompt_length"][0] + d["length"][0])]
    with torch.no_grad():
      ref = model.eval()(torch.tensor(toks, dtype=torch.long)).logits.numpy()
    # The export holds the RL policy's float32 weights rounded to bf16 (router float32): c2jax's forward of those.
    rounded = _bf16_rounded(jax.device_get(rl_params), rl_cfg)
    ours = np.asarray(jax.jit(lambda p, t: transformer.forward(p, t, cfg=rl_cfg, with_mtp=False).logits)(rounded, toks))
    chex.assert_shape(ours, ref.shape)
    self.assertLessEqual(float(np.abs(ours - ref).max() / np.abs(ref).max()), _RTOL)
    exported_tok = transformers.AutoTokenizer.from_pretrained(str(hf))
    self.assertIsNotNone(exported_tok.chat_template)
    _, split, index = groups[0].meta["task_id"].rsplit("/", 2)
    task = suite.task(split, int(index))
    first = task.prompt
    messages = chat_format(_FORMAT).messages(SYSTEM_PROMPT, task.text, [])
    text = exported_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, thinking=False)
    self.assertEqual(text, chat_format(_FORMAT).prompt(SYSTEM_PROMPT, task.text))
    np.testing.assert_array_equal(exported_tok(text, add_special_tokens=False)["input_ids"], toks[0, :len(first)])


if __name__ == "__main__":
  absltest.main()
