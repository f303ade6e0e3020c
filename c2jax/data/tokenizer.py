"""Tokenizers the data pipelines accept: the byte tokenizer (the default) and HF `tokenizers` files.

  tok = make_tokenizer("byte")                      # ByteTokenizer: 256 bytes + PAD, BOS, EOS
  tok = make_tokenizer("/path/to/tokenizer.json")   # HFTokenizer (BOS / EOS / PAD found by their usual names)
  tok = make_tokenizer("/path/to/hf_model_dir")     # its tokenizer.json, with tokenizer_config.json's BOS / EOS
  ids = tok.encode("def f(): pass", bos=True, eos=True)   # [N] int32
  ids = tok.encode_text(tool_output, controls)             # [N] int32, no added token matched (see below)
  text = tok.decode(ids)                                   # special tokens dropped

Both satisfy `Tokenizer`, which is all the pipelines (c2jax/data/pipeline.py) and the training side rely on.

`encode` matches added tokens: the string "<|im_end|>" is the one id of that token, as a model's own text and a
chat template's structure are meant. `encode_text` is for text that someone else wrote (tool results, repository
files, task statements): no special added token, and none of the `controls` the caller names, is matched, so the
string becomes the ordinary tokens of its characters. Neither HF's `add_special_tokens=False` nor transformers'
`split_special_tokens=True` does that (the first only leaves out the post-processor's BOS / EOS; the second sets
the Rust tokenizer's `encode_special_tokens`, which skips special added tokens but still matches non-special ones,
as DeepSeek's tool-call tokens are): `HFTokenizer` encodes such text with a copy of its tokenizer.json from which
those added tokens are removed, and refuses (ValueError) a text whose plain tokens would still hold one of them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.input_errors import MissingInput


@runtime_checkable
class Tokenizer(Protocol):
  """What the pipelines need of a tokenizer."""

  @property
  def vocab_size(self) -> int:
    ...

  @property
  def pad_id(self) -> int:
    ...

  @property
  def bos_id(self) -> int:
    ...

  @property
  def eos_id(self) -> int:
    ...

  def encode(self, text: str, bos: bool = True, eos: bool = True) -> np.ndarray:
    """[N] int32 ids of `text`, with BOS before and EOS after when asked."""

  def encode_text(self, text: str, controls: Sequence[str] = ()) -> np.ndarray:
    """[N] int32 ids of `text` as plain text, no BOS / EOS: no special added token and none of `controls` is
    matched (the module docstring); decoding them (specials kept) gives `text` back."""

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    """The text of `ids`, special tokens dropped unless `skip_special_tokens` is False (a native tool-call format
    writes its calls with special tokens, so a model turn is decoded with them)."""


# Names under which tokenizer.json files commonly declare their special tokens, tried in order.
BOS_NAMES = ("<s>", "<bos>", "<|begin_of_text|>", "<|startoftext|>", "[BOS]", "<｜begin▁of▁sentence｜>",
             "<|endoftext|>")
EOS_NAMES = ("</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "<|endoftext|>", "[EOS]", "<｜end▁of▁sentence｜>")
TOKENIZER_FILE = "tokenizer.json"
TIKTOKEN_FILE = "tiktoken.model"  # Kimi K2 / K2.5 releases ship their tokenizer in tiktoken's format
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"  # an HF model directory's: names its bos_token / eos_token
PAD_NAMES = ("<pad>", "<|pad|>", "[PAD]", "<|padding|>")


def _find(tok, names: Sequence[str]) -> int | None:
  for name in names:
    i = tok.token_to_id(name)
    if i is not None:
      return int(i)
  return None


@dataclasses.dataclass(frozen=True)
class HFTokenizer:
  """A HuggingFace `tokenizers` file (tokenizer.json) as a `Tokenizer`.

  BOS / EOS / PAD are the tokens named `bos` / `eos` / `pad` when given, else those that a tokenizer_config.json
  beside the file names (`bos_token`, `eos_token`, `pad_token`: an HF model directory's own choice), else the
  first of the usual names (BOS_NAMES, EOS_NAMES, PAD_NAMES) the vocabulary holds; a file without a pad token pads
  with EOS (padding is always masked out of the loss, so its id does not matter). The file's own post-processor
  (which may add specials of its own) is not applied: BOS and EOS are added here, exactly when asked.

  Attributes:
    path: the tokenizer.json file, or an HF model directory holding one.
    bos, eos, pad: names of the special tokens, or None to look them up.
  """

  path: str
  bos: str | None = None
  eos: str | None = None
  pad: str | None = None

  def __post_init__(self):
    if os.path.isdir(self.path):
      if not os.path.isfile(os.path.join(self.path, TOKENIZER_FILE)) and os.path.isfile(
          os.path.join(self.path, TIKTOKEN_FILE)):
        raise MissingInput(
            f"{self.path} holds {TIKTOKEN_FILE} (Kimi's tiktoken tokenizer) but no {TOKENIZER_FILE}, the only "
            f"format c2jax reads; write one beside it with transformers' convert_slow_tokenizer.TikTokenConverter "
            f"(pip install tiktoken; the pattern and special tokens of the release's tokenization_kimi.py), "
            f"then `.converted().save('{os.path.join(self.path, TOKENIZER_FILE)}')`.")
      object.__setattr__(self, "path", os.path.join(self.path, TOKENIZER_FILE))
    if not os.path.isfile(self.path):
      raise MissingInput(f"Tokenizer file {self.path!r} does not exist; give the path of a tokenizer.json (or of a "
                       "directory holding one) or 'byte'.")
    declared = _declared_specials(os.path.join(os.path.dirname(self.path), TOKENIZER_CONFIG_FILE))
    ids = {}
    for what, given, names in (("bos", self.bos, BOS_NAMES), ("eos", self.eos, EOS_NAMES),
                               ("pad", self.pad, PAD_NAMES)):
      given = given or declared.get(what)
      found = _find(self._tok, (given,) if given else names)
      if found is None and what == "pad" and not given:
        found = ids["eos"]
      if found is None:
        tried = repr(given) if given else ", ".join(names)
        raise ValueError(f"Tokenizer {self.path} has no {what.upper()} token ({tried}); name it with "
                         f"HFTokenizer(path, {what}='<token>').")
      ids[what] = found
    object.__setattr__(self, "_ids", ids)

  @functools.cached_property
  def _tok(self):
    import tokenizers  # only runs that use a tokenizer file need it
    return tokenizers.Tokenizer.from_file(self.path)

  @property
  def vocab_size(self) -> int:
    return int(self._tok.get_vocab_size(with_added_tokens=True))

  @property
  def pad_id(self) -> int:
    return self._ids["pad"]

  @property
  def bos_id(self) -> int:
    return self._ids["bos"]

  @property
  def eos_id(self) -> int:
    return self._ids["eos"]

  def encode(self, text: str, bos: bool = True, eos: bool = True) -> np.ndarray:
    ids = self._tok.encode(text, add_special_tokens=False).ids
    out = np.empty(len(ids) + int(bos) + int(eos), np.int32)
    out[int(bos):int(bos) + len(ids)] = ids
    if bos:
      out[0] = self.bos_id
    if eos:
      out[-1] = self.eos_id
    return out

  def encode_text(self, text: str, controls: Sequence[str] = ()) -> np.ndarray:
    if not text:
      return np.zeros(0, np.int32)
    tok, banned = self._plain(frozenset(controls))
    ids = np.asarray(tok.encode(text, add_special_tokens=False).ids, np.int32)
    if banned.size and np.isin(ids, banned).any():  # the model itself merges text into a control token
      raise ValueError(f"Tokenizer {self.path} turns plain text into one of its added tokens "
                       f"({self.decode(ids[np.isin(ids, banned)][:1], skip_special_tokens=False)!r}); it cannot keep "
                       "environment text apart from control tokens.")
    return ids

  def _plain(self, controls: frozenset[str]):
    """(a tokenizer that matches no special added token and none of `controls`, the ids of those tokens)."""
    cache = self.__dict__.setdefault("_plain_cache", {})  # frozen dataclass: the cache lives beside the fields
    if controls not in cache:
      import tokenizers
      config = json.loads(self._tok.to_str())
      added = config.get("added_tokens") or []
      dropped = [t for t in added if t.get("special") or t["content"] in controls]
      config["added_tokens"] = [t for t in added if t not in dropped]
      cache[controls] = (tokenizers.Tokenizer.from_str(json.dumps(config)),
                         np.asarray(sorted({int(t["id"]) for t in dropped}), np.int32))
    return cache[controls]

  def decode(self, ids, skip_special_tokens: bool = True) -> str:
    return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=skip_special_tokens)

  def token_id(self, token: str) -> int | None:
    """The id of the token whose text is `token` (e.g. a chat format's end-of-turn token), None if absent."""
    i = self._tok.token_to_id(token)
    return None if i is None else int(i)


def _declared_specials(path: str) -> dict[str, str]:
  """{"bos" | "eos" | "pad": token text} as an HF tokenizer_config.json at `path` names them ({} without one); a
  token is a string or an AddedToken mapping with its "content"."""
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8") as f:
    config = json.load(f)
  out = {}
  for what in ("bos", "eos", "pad"):
    token = config.get(f"{what}_token")
    token = token.get("content") if isinstance(token, dict) else token
    if isinstance(token, str) and token:
      out[what] = token
  return out


def make_tokenizer(spec: str) -> Tokenizer:
  """"byte" -> ByteTokenizer(); anything else is the path of a tokenizer.json, or of an HF model directory holding
  one -> HFTokenizer(path)."""
  if spec == "byte":
    return ByteTokenizer()
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"Tokenizer spec {spec!r}: use 'byte' or the path of a tokenizer.json file (or its directory).")
  return HFTokenizer(spec)
