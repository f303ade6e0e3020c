"""A byte-level BPE tokenizer trained on a coding suite's own text, for the tiny models (report section 3: the
tokenizer is part of the model; at CPU scale it decides what a 2-layer model can read).

  path = suite_tokenizer("tiny_functions", vocab_size=1024, cache_dir="~/.cache/c2jax")
  tok = make_tokenizer(path)              # c2jax.data.tokenizer.HFTokenizer
  path = resolve("bpe:1024", "tiny_functions")   # the same from a run config's tokenizer spec

Byte-level, so any text round-trips (no unknown tokens). Numbers are not split into digits: " 16" is one token, so
copying a constant from the statement is one attention lookup, like copying a word. Specials: <pad> 0, <s> 1 (BOS),
</s> 2 (EOS). The training text is the suite's train-split demonstrations (prompts in every help format, and the
reference answers): held-out tasks never shape the vocabulary. Training is deterministic, and the file is cached
under a name that hashes the text and the settings.

Why: a byte model has to compose two attention layers to recognise a word ("plus", "every 'u'") before it can copy
the constant after it, and the CPU-sized models do not form that circuit within a few minutes of SFT
(WORKSPACE_NOTES.md). With words as single tokens the lookup is one attention layer, and prompts are ~3x shorter.
"""

from __future__ import annotations

import hashlib
import os

from c2jax.data import sft

SPECIALS = ("<pad>", "<s>", "</s>")


def train_bpe(texts, vocab_size: int, path: str) -> str:
  """Trains a byte-level BPE of `vocab_size` tokens (specials included) on `texts`; writes tokenizer.json to `path`
  atomically and returns it."""
  import tokenizers  # pylint: disable=g-import-not-at-top  (only runs that train one need it)
  from tokenizers import decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
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


def suite_texts(suite: str, suite_options=None) -> list[str]:
  """The train split's demonstrations of `suite` under every help format: prompts and answers."""
  texts = []
  for instructions in ("none", "brief", "full"):
    for prompt, answer in sft.sft_examples(suite, "train", instructions=instructions, suite_options=suite_options):
      texts.append(prompt)
      if instructions == "none":  # the answers are the same under every format
        texts.append(answer)
  return texts


def suite_tokenizer(suite: str, vocab_size: int, cache_dir: str, suite_options=None) -> str:
  """The path of the BPE of `suite`'s train text (trained once, then reused from `cache_dir`)."""
  texts = suite_texts(suite, suite_options)
  h = hashlib.sha256(f"bpe/v1/{vocab_size}".encode())
  for t in texts:
    h.update(t.encode())
  path = os.path.join(os.path.abspath(os.path.expanduser(cache_dir)), f"bpe-{suite}-{vocab_size}-{h.hexdigest()[:16]}",
                      "tokenizer.json")
  if not os.path.exists(path):
    train_bpe(texts, vocab_size, path)
  return path


def default_cache_dir() -> str:
  """$C2JAX_CACHE_DIR, or ~/.cache/c2jax."""
  return os.environ.get("C2JAX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "c2jax")


def resolve(spec: str, suite: str, cache_dir: str | None = None) -> str:
  """A tokenizer spec for `make_tokenizer`: "bpe:<vocab_size>" becomes the path of `suite`'s BPE (trained on first
  use); "byte" and tokenizer.json paths are returned as they are."""
  if not isinstance(spec, str) or not spec.startswith("bpe:"):
    return spec
  try:
    vocab_size = int(spec.split(":", 1)[1])
  except ValueError:
    raise ValueError(f"Tokenizer spec {spec!r}: write bpe:<vocab_size>, e.g. bpe:1024.") from None
  return suite_tokenizer(suite, vocab_size, cache_dir or default_cache_dir())
