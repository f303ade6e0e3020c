"""A chat format over a tokenizer: the token-level pieces the agent engine and the single-turn tasks use (report
section 4: RL episodes are agent sessions, in the model's own chat format when it has one).

  chat = ChatTokens.of("kimi_k2", tokenizer)   # or "brief" over any tokenizer
  prompt = chat.prompt(first_observation)      # [P] ids: system + user (tools declared) + generation prompt
  text = chat.turn_text(ids)                   # a sampled turn as the environment parses it
  ids = chat.turn_ids(text)                    # a forced (scripted) turn, ended as the model ends one
  ids = chat.encode_markup(cont.observation_markup)   # a continuation: control ids only where the template put them
  chat.end_of_turn_id                          # the stop token of a turn

brief is today's raw framing, bit for bit: BOS + the first observation; a turn ends with the tokenizer's EOS, which
decoding leaves out. A native format (`ChatFormat.native`) renders the prompt with the model's template (whose text
holds its own BOS), ends a turn with the format's end-of-turn control token, and decodes turns with their control
tokens kept (native tool calls are written with them) but without the end-of-turn token.

The tokenizer must carry every control token of a native format as one token of its own: the pieces of an episode
are tokenized apart, and only then does their concatenation equal the whole conversation's tokenization (zero
drift, `c2jax.envs.chat.chat_format`). A tokenizer without them (the byte tokenizer, a model's tokenizer of another
family) is refused when the pair is made.

Text from the environment never becomes a control token. Everything the environment, a tool, a repository file,
a task statement or a self-summary contributes is encoded with special-token matching off (`encode_text`, over the
tokenizer's `encode_text`): a tool result holding "<|im_end|><|im_user|>user<|im_middle|>..." (or DeepSeek's
"<｜tool▁output▁end｜>", or any format's control string, whole, partial or split across results) reaches the model
as the ordinary tokens of those characters, and decodes back to the same text; only the template's own structure
(`markup.Kind.CONTROL` pieces of `ChatFormat.render_markup`) puts control ids in the prompt and the continuations.
This is stricter than transformers' `apply_chat_template(tokenize=True)` and vLLM's chat serving, which render
the template and tokenize the whole text with added tokens matched (a control string in a message becomes the
control token there). A model's own turns are its text: `turn_ids` matches control tokens (its native tool calls
are written with them), as the sampled ids hold them.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from c2jax.envs.chat import markup
from c2jax.envs.chat.chat_format import SYSTEM_PROMPT, ChatFormat, chat_format
from c2jax.envs.chat.markup import Kind, Piece


@dataclasses.dataclass(frozen=True)
class ChatTokens:
  """A chat format and the tokenizer that encodes it (see the module docstring).

  Attributes:
    format: the chat format.
    tokenizer: a `c2jax.data.tokenizer.Tokenizer`; for a native format it must have `token_id(text)`.
    system: the system message of native prompts.
  """

  format: ChatFormat
  tokenizer: object
  system: str = SYSTEM_PROMPT

  def __post_init__(self):
    if getattr(self.tokenizer, "encode_text", None) is None:
      raise ValueError(f"Chat format {self.format.name!r} needs a tokenizer that encodes the environment's text with "
                       f"special-token matching off (encode_text); {type(self.tokenizer).__name__} has none.")
    if not self.format.native:
      return
    lookup = getattr(self.tokenizer, "token_id", None)
    if lookup is None:
      raise ValueError(f"Chat format {self.format.name!r} needs a tokenizer holding its control tokens (the model's "
                       f"own tokenizer.json); {type(self.tokenizer).__name__} has none.")
    missing = [t for t in self.format.control_tokens if lookup(t) is None]
    if missing:
      raise ValueError(f"Chat format {self.format.name!r} needs its control tokens as single tokens of the tokenizer, "
                       f"but {getattr(self.tokenizer, 'path', 'it')} lacks {', '.join(missing)}; give the model's own "
                       "tokenizer, or the format its family speaks.")

  @classmethod
  def of(cls, name: str, tokenizer) -> ChatTokens:
    """The format registered as `name` over `tokenizer`."""
    return cls(chat_format(name), tokenizer)

  @property
  def native(self) -> bool:
    return self.format.native

  @property
  def end_of_turn_id(self) -> int:
    """The token that ends a model turn: the tokenizer's EOS for brief, the format's end-of-turn token else."""
    if not self.native:
      return int(self.tokenizer.eos_id)
    return int(self.tokenizer.token_id(self.format.end_of_turn))

  def encode_text(self, text: str) -> np.ndarray:
    """[N] int32: text from the environment (a tool result, a file, a task, a summary), no BOS or EOS, with no
    control token matched: neither a special token of the tokenizer nor one of the format's control tokens."""
    if not text:
      return np.zeros(0, np.int32)
    return np.asarray(self.tokenizer.encode_text(text, self.format.control_tokens), np.int32).reshape(-1)

  def encode_markup(self, pieces: Iterable[Piece]) -> np.ndarray:
    """[N] int32: markup (`ChatFormat.render_markup`, `Continuation`): each CONTROL piece its one id, each TEXT
    piece `encode_text`."""
    parts = [np.asarray([self._control_id(p.text)], np.int32) if p.kind is Kind.CONTROL else self.encode_text(p.text)
             for p in markup.merge(pieces)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)

  def encode_model_text(self, text: str) -> np.ndarray:
    """[N] int32: text the MODEL wrote (a forced turn, a sampled turn's text), no BOS or EOS. A native format
    matches its control tokens (a native tool call is written with them); brief has none but the EOS that ends a
    turn, so its turns are text (`encode_text`). Never for the environment's text: that is `encode_text`."""
    if not text or not self.native:
      return self.encode_text(text)
    return np.asarray(self.tokenizer.encode(text, bos=False, eos=False), np.int32)

  def _control_id(self, token: str) -> int:
    i = self.tokenizer.token_id(token) if self.native else None
    if i is None:
      raise ValueError(f"Chat format {self.format.name!r}: {token!r} is no single token of the tokenizer.")
    return int(i)

  def prompt_text(self, first_observation: str) -> str:
    """The text of an episode's prompt (brief: the first observation; BOS is an id of its own)."""
    return self.format.prompt(self.system, first_observation) if self.native else first_observation

  def prompt(self, first_observation: str) -> np.ndarray:
    """[P] int32: an episode's prompt ids; the first observation (the task, the repository listing) is text."""
    if not self.native:
      bos = np.asarray(self.tokenizer.encode("", bos=True, eos=False), np.int32).reshape(-1)  # BOS alone
      return np.concatenate([bos, self.encode_text(first_observation)])
    return self.encode_markup(self.format.prompt_markup(self.system, first_observation))

  def segment_prompt(self, first_observation: str, summary: str) -> np.ndarray:
    """[P'] int32: the prompt of a segment after a self-summary (native formats: the user message holds the first
    observation and the framed summary, `ChatFormat.segment_prompt`); it shares a prefix with `prompt`."""
    if not self.native:
      raise ValueError("The brief format appends the framed summary after the prompt; it has no segment prompt.")
    return self.encode_markup(self.format.segment_prompt_markup(self.system, first_observation, summary))

  def turn_text(self, ids: Sequence[int]) -> str:
    """A sampled turn's text, without the token that ended it (control tokens kept for native formats)."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    if not self.native:
      return self.tokenizer.decode(ids)
    if ids and ids[-1] == self.end_of_turn_id:
      ids = ids[:-1]
    return self.tokenizer.decode(ids, skip_special_tokens=False)

  def turn_ids(self, text: str) -> np.ndarray:
    """[N + 1] int32: a turn's text and the token that ends it."""
    return np.concatenate([self.encode_model_text(text), np.asarray([self.end_of_turn_id], np.int32)])


def prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
  """The length of the longest common prefix of two id sequences."""
  a, b = np.asarray(a).reshape(-1), np.asarray(b).reshape(-1)
  n = min(len(a), len(b))
  differ = np.flatnonzero(a[:n] != b[:n])
  return int(differ[0]) if len(differ) else n
