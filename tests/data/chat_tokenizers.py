"""Small tokenizers for the chat-template tests: a byte-level BPE trained in the test on a few KB of text, with a
template's control tokens as added special tokens (single ids, as in the real vocabularies), wrapped as a
transformers `PreTrainedTokenizerFast` that carries the template."""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# What the merges are learned from: code, prose, JSON and tool results, so that they span piece boundaries
# (a BPE that never merged across "}" and "<" could not show drift where there is some).
CORPUS = [
    "def add(a, b):\n    return a + b\n\n\nclass T(unittest.TestCase):\n    def test_add(self):\n",
    'The tool returned {"path": "calc.py", "content": "x = 1\\n"} and exit code 0.\n',
    "[turn 2 of 8; about 130 of 8192 tokens used]\nwrote calc.py (3 lines).\nedited m.py at line 1\n",
    "You are a coding agent. Fix the bug in calc.py; read the file, edit it and run the tests.\n",
    "## Return of functions.read_file:0\n### run\nDescription: Run a shell command.\nParameters: {}\n",
] * 8


@functools.lru_cache(maxsize=8)
def tokenizer(control_tokens: tuple[str, ...], chat_template: str, bos_token: str | None = None,
              eos_token: str | None = None, vocab_size: int = 600) -> PreTrainedTokenizerFast:
  """A trained byte-level BPE carrying `control_tokens` as special tokens and `chat_template`."""
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(control_tokens), show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(CORPUS, trainer)
  return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos_token, eos_token=eos_token,
                                 chat_template=chat_template)


def encode(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
  """The ids of `text` as the engine encodes a piece: control tokens as single ids, no BOS / EOS added."""
  return tok(text, add_special_tokens=False)["input_ids"]
