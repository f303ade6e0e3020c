"""A byte-level BPE tokenizer trained on given text, for the tiny models (report section 3: the tokenizer is part
of the model; at CPU scale it decides what a 2-layer model can read). `c2jax.envs.teachers.suite_tokenizer` trains one
on a coding suite's own text.

  path = train_bpe(texts, vocab_size=1024, path="tokenizer.json")
  tok = make_tokenizer(path)              # c2jax.data.tokenizer.HFTokenizer

Byte-level, so any text round-trips (no unknown tokens). Numbers are not split into digits: " 16" is one token, so
copying a constant from the statement is one attention lookup, like copying a word. Specials: <pad> 0, <s> 1 (BOS),
</s> 2 (EOS). Training is deterministic.

Why: a byte model has to compose two attention layers to recognise a word ("plus", "every 'u'") before it can copy
the constant after it, and the CPU-sized models do not form that circuit within a few minutes of SFT
(docs/experiments/main_job.md). With words as single tokens the lookup is one attention layer, and prompts are ~3x
shorter.
"""

from __future__ import annotations

import os

SPECIALS = ("<pad>", "<s>", "</s>")


def train_bpe(texts, vocab_size: int, path: str) -> str:
  """Trains a byte-level BPE of `vocab_size` tokens (specials included) on `texts`; writes tokenizer.json to `path`
  atomically and returns it."""
  import tokenizers  # only runs that train one need it
  from tokenizers import decoders, models, pre_tokenizers, trainers
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(alphabet) + len(SPECIALS):
    raise ValueError(f"vocab_size={vocab_size} cannot hold the 256 byte tokens and {len(SPECIALS)} specials; use "
                     f">= {len(alphabet) + len(SPECIALS)}.")
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), initial_alphabet=alphabet,
                                show_progress=False)
  tok.train_from_iterator(texts, trainer)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  tok.save(tmp)
  os.replace(tmp, path)
  return path


def default_cache_dir() -> str:
  """$C2JAX_CACHE_DIR, or ~/.cache/c2jax."""
  return os.environ.get("C2JAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "c2jax")
