"""The BPE of a coding suite's own text (`c2jax.data.bpe`), trained on first use and cached: what a run config's
tokenizer spec "bpe:<vocab_size>" names (report section 3: the tokenizer is part of the model).

  path = resolve("bpe:512", "tiny_compositions")     # the tokenizer.json path; "byte" and paths pass through
  path = suite_tokenizer("tiny_functions", vocab_size=1024, cache_dir="~/.cache/c2jax")

The training text is the suite's train-split demonstrations (`c2jax.envs.demonstrations`: prompts in every help
format, and the reference answers): held-out tasks never shape the vocabulary. The file is cached under a name that
hashes the text and the settings, so a change to the prompts trains a new one.
"""

from __future__ import annotations

import hashlib
import os

from c2jax.data.bpe import default_cache_dir, train_bpe
from c2jax.envs import demonstrations


def suite_texts(suite: str, suite_options=None) -> list[str]:
  """The train split's demonstrations of `suite` under every help format: prompts and answers."""
  texts = []
  for instructions in ("none", "brief", "full"):
    for prompt, answer in demonstrations.sft_examples(suite, "train", instructions=instructions,
                                                      suite_options=suite_options):
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
  path = os.path.join(os.path.abspath(os.path.expanduser(cache_dir)),
                      f"bpe-{suite}-{vocab_size}-{h.hexdigest()[:16]}", "tokenizer.json")
  if not os.path.exists(path):
    train_bpe(texts, vocab_size, path)
  return path


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
