"""The BPE of a coding suite's own text (`c2jax.data.bpe`), trained on first use and cached: what a run config's
tokenizer spec "bpe:<vocab_size>[:<text>]" names (report section 3: the tokenizer is part of the model).

  path = resolve("bpe:512", "tiny_compositions")     # the tokenizer.json path; "byte" and paths pass through
  path = resolve("bpe:512:repository", "tiny_long_horizon")
  path = suite_tokenizer("tiny_functions", vocab_size=1024, cache_dir="~/.cache/c2jax")

The training text is the suite's train split (`TokenizerText`): its demonstrations (`c2jax.envs.demonstrations`:
prompts in every help format, and the reference answers), and with "repository" also the files of its tasks'
repositories, which a multi-turn agent reads (a long-horizon task's notes: without them their words stay bytes).
Held-out tasks never shape the vocabulary. The file is cached under a name that hashes the text and the settings,
so a change to the prompts trains a new one.
"""

from __future__ import annotations

import enum
import hashlib
import os

from c2jax.data.bpe import default_cache_dir, train_bpe
from c2jax.envs import demonstrations


class TokenizerText(enum.Enum):
  """What of a suite's train split the BPE is trained on."""

  DEMONSTRATIONS = "demonstrations"  # prompts and reference answers (single-turn: the prompt holds everything)
  REPOSITORY = "repository"  # those, and every file of the tasks' starting repositories (what an agent reads)


def suite_texts(suite: str, suite_options=None, text: TokenizerText = TokenizerText.DEMONSTRATIONS) -> list[str]:
  """The train split's demonstrations of `suite` under every help format (prompts and answers), and with
  `TokenizerText.REPOSITORY` its tasks' repository files (in task and path order)."""
  texts = []
  for instructions in ("none", "brief", "full"):
    for prompt, answer in demonstrations.sft_examples(suite, "train", instructions=instructions,
                                                      suite_options=suite_options):
      texts.append(prompt)
      if instructions == "none":  # the answers are the same under every format
        texts.append(answer)
  if text is TokenizerText.REPOSITORY:
    for task in demonstrations.suite_tasks(suite, "train", suite_options):
      texts += [task.files[path] for path in sorted(task.files)]
  return texts


def suite_tokenizer(suite: str, vocab_size: int, cache_dir: str, suite_options=None,
                    text: TokenizerText = TokenizerText.DEMONSTRATIONS) -> str:
  """The path of the BPE of `suite`'s train text (trained once, then reused from `cache_dir`)."""
  texts = suite_texts(suite, suite_options, text)
  h = hashlib.sha256(f"bpe/v1/{vocab_size}".encode())
  for t in texts:
    h.update(t.encode())
  suffix = "" if text is TokenizerText.DEMONSTRATIONS else f"-{text.value}"
  path = os.path.join(os.path.abspath(os.path.expanduser(cache_dir)),
                      f"bpe-{suite}-{vocab_size}{suffix}-{h.hexdigest()[:16]}", "tokenizer.json")
  if not os.path.exists(path):
    train_bpe(texts, vocab_size, path)
  return path


def resolve(spec: str, suite: str, cache_dir: str | None = None) -> str:
  """A tokenizer spec for `make_tokenizer`: "bpe:<vocab_size>" becomes the path of `suite`'s BPE (trained on first
  use), "bpe:<vocab_size>:repository" that of its BPE with the repositories' files in the text (`TokenizerText`);
  "byte" and tokenizer.json paths are returned as they are."""
  if not isinstance(spec, str) or not spec.startswith("bpe:"):
    return spec
  parts = spec.split(":")
  texts = [t.value for t in TokenizerText]
  try:
    vocab_size = int(parts[1])
    text = TokenizerText(parts[2]) if len(parts) == 3 else TokenizerText.DEMONSTRATIONS
    if len(parts) > 3:
      raise ValueError
  except ValueError:
    raise ValueError(f"Tokenizer spec {spec!r}: write bpe:<vocab_size>[:<text>] with <text> one of {texts}, e.g. "
                     "bpe:1024 or bpe:512:repository.") from None
  return suite_tokenizer(suite, vocab_size, cache_dir or default_cache_dir(), text=text)
