"""The BPE of a coding suite's own text (`c2jax.data.bpe`), trained on first use and cached: what a run config's
tokenizer spec "bpe:<vocab_size>[:<text>]" names (report section 3: the tokenizer is part of the model).

  path = resolve("bpe:512", "tiny_compositions")     # the tokenizer.json path; "byte" and paths pass through
  path = resolve("bpe:512:repository", "tiny_long_horizon")
  path = resolve("bpe:512:episodes", "tiny_spec")         # and the observations the suite's teacher is shown
  path = suite_tokenizer("tiny_functions", vocab_size=1024, cache_dir="~/.cache/c2jax")

The training text is the suite's train split (`TokenizerText`): its demonstrations
(`c2jax.envs.teachers.demonstrations`: prompts in every help format, and the reference answers), and with "repository"
also the files of its tasks' repositories, which a multi-turn agent reads (a long-horizon task's notes: without them
their words stay bytes); with "episodes" also the observations of the suite's teacher (`TEACHER` of the suite, a
scripted policy) played on every train task through the real environment: tool-result wrappers, budget lines and test
runs' output, which are most of a multi-turn episode's tokens (without them a failing unittest run of 666 bytes is 465
tokens of a 512-token BPE). Held-out tasks never shape the vocabulary. The file is cached under a name that hashes the
text and the settings (for "episodes": the teacher's name and `EPISODES_FORMAT`, not its observations, which would take
playing the episodes to hash), so a change to the prompts trains a new one.
"""

from __future__ import annotations

import concurrent.futures
import enum
import hashlib
import os

from c2jax.data.bpe import default_cache_dir, train_bpe
from c2jax.envs.teachers import demonstrations


class TokenizerText(enum.Enum):
  """What of a suite's train split the BPE is trained on."""

  DEMONSTRATIONS = "demonstrations"  # prompts and reference answers (single-turn: the prompt holds everything)
  REPOSITORY = "repository"  # those, and every file of the tasks' starting repositories (what an agent reads)
  EPISODES = "episodes"  # those, and the observations of the suite's teacher's episodes (what an agent is shown)


# Bump when what the teacher's episodes show changes (the environment's observation formats, a suite's TEACHER).
EPISODES_FORMAT = 3
DEFAULT_TEACHER = "explorer"  # a suite without a TEACHER: looks around, writes the reference, checks it


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
  if text in (TokenizerText.REPOSITORY, TokenizerText.EPISODES):
    for task in demonstrations.suite_tasks(suite, "train", suite_options):
      texts += [task.files[path] for path in sorted(task.files)]
  return texts


def teacher_name(suite: str) -> str:
  """The scripted policy whose episodes show a suite's observations: the suite's `TEACHER`, else DEFAULT_TEACHER."""
  from c2jax.envs.tasks.coding_tasks import CODING_SUITES
  return getattr(CODING_SUITES.get(suite), "TEACHER", DEFAULT_TEACHER)


def teacher_observations(suite: str, suite_options=None, workers: int = 4) -> list[str]:
  """Every observation after the first of the suite's teacher (`teacher_name`) on each train task, played through
  CodingEnv with the real sandbox (help format "none", the environment's default budgets), in task order. The
  episodes are not graded: their observations are the text, their reward is not."""
  # Imported here: the environment (sandboxes) is needed only for this text.
  from c2jax.envs.core.env import EnvConfig
  from c2jax.envs.tools.protocol import HelpDetail
  from c2jax.envs.teachers.scripted_policies import POLICIES, play
  policy = POLICIES.get(teacher_name(suite))()
  config = EnvConfig(instructions=HelpDetail.NONE)
  tasks = demonstrations.suite_tasks(suite, "train", suite_options)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    played = pool.map(lambda task: play(policy, task, config, graded=False), tasks)
    # The run tool shows no test run's duration (`env.without_timings`), so two plays give the same text and the
    # BPE, its merges and vocabulary, is the same on every machine and every run.
    return [o for observations, _ in played for o in observations[1:]]


def suite_tokenizer(suite: str, vocab_size: int, cache_dir: str, suite_options=None,
                    text: TokenizerText = TokenizerText.DEMONSTRATIONS) -> str:
  """The path of the BPE of `suite`'s train text (trained once, then reused from `cache_dir`)."""
  texts = suite_texts(suite, suite_options, text)
  h = hashlib.sha256(f"bpe/v1/{vocab_size}".encode())
  for t in texts:
    h.update(t.encode())
  if text is TokenizerText.EPISODES:
    h.update(f"episodes/v{EPISODES_FORMAT}/{teacher_name(suite)}".encode())
  suffix = "" if text is TokenizerText.DEMONSTRATIONS else f"-{text.value}"
  path = os.path.join(os.path.abspath(os.path.expanduser(cache_dir)),
                      f"bpe-{suite}-{vocab_size}{suffix}-{h.hexdigest()[:16]}", "tokenizer.json")
  if not os.path.exists(path):
    if text is TokenizerText.EPISODES:
      texts += teacher_observations(suite, suite_options)
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
