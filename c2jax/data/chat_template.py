"""Models' own chat templates, rendered exactly as Hugging Face transformers renders them (report section 4: the
agent sessions of RL are conversations in the served model's own format; a model meets the text it was trained on).

  template = ChatTemplate.vendored("kimi_k2_thinking")          # c2jax/data/chat_templates/*.jinja
  template = ChatTemplate.from_tokenizer_config(path)           # a checkpoint's tokenizer_config.json
  template = ChatTemplate.from_file(path, special_tokens={"bos_token": "<s>"})   # a chat_template.jinja
  text = template.render(messages, tools=[schema, ...], add_generation_prompt=True)

`render` equals `PreTrainedTokenizerFast.apply_chat_template(messages, tools=..., tokenize=False, ...)` byte for byte
(tests/data/chat_template_test.py compares them over many conversations). What transformers does, and this module
does the same, without importing transformers (utils/chat_template_utils.py and tokenization_utils_base.py):

  * the environment: jinja2's `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)` with the
    `loopcontrols` extension (`{% break %}`, which Kimi's template uses) and a `{% generation %}` block tag (its
    body is rendered as is; transformers only records where it falls, for assistant masks);
  * globals `raise_exception(message)` (raises `jinja2.TemplateError`), `strftime_now(format)`, a `dict` callable
    and a `namespace` that refuses underscore-prefixed attributes;
  * the `tojson` filter replaced by `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
    sort_keys=False)` with those keyword arguments open to the template (jinja's own escapes HTML characters);
  * the messages normalized: keys whose value is None dropped (so a template's `message['content'] is none` sees
    an undefined value instead), every value rebuilt from plain JSON types, and a message's reasoning copied under
    `reasoning_content` and `thinking` when given under any of reasoning_content / thinking / reasoning;
  * the variables: `messages`, `tools` (JSON-schema dicts, or None), `documents` (None), `add_generation_prompt`,
    then the tokenizer's named special tokens (`bos_token`, `eos_token`, ...) and the caller's extra keyword
    arguments (`thinking=True`, ...), the latter winning a clash.

A tokenizer_config.json's `chat_template` is either one string or a list of {"name", "template"}; the list form
chooses like transformers: the named one when asked, else "tool_use" when tools are given and it exists, else
"default".
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import pathlib
import types
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox
import jinja2.utils
import numpy as np

TEMPLATES_DIR = pathlib.Path(__file__).resolve().parent / "chat_templates"

# Names a message's reasoning comes under; the first is the one templates read (transformers' _REASONING_FIELDS).
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}`: the body as is (transformers records its span for assistant masks)."""

  tags = {"generation"}

  def parse(self, parser: Any) -> jinja2.nodes.CallBlock:
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

  def _render(self, caller: Any) -> str:
    return caller()


class _TemplateDict:
  """The `dict` global: builds plain dicts, and exposes nothing else."""

  def __call__(self, *args: Any, **kwargs: Any) -> dict:
    return dict(*args, **kwargs)

  def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
    return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
  """The `namespace` global, refusing underscore-prefixed attributes (CPython internals stay out of reach)."""

  def __init__(*args: Any, **kwargs: Any):  # jinja's own signature trick
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _TemplateNamespace._check(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name: str, value: Any) -> None:
    _TemplateNamespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
          f"A chat template cannot store the underscore-prefixed attribute {name!r} on a namespace; rename it.")


def _raise_exception(message: str) -> None:
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # the name templates call it with
  return datetime.datetime.now().strftime(format)


@functools.lru_cache(maxsize=32)
def _compile(source: str) -> jinja2.Template:
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                     extensions=[_Generation, jinja2.ext.loopcontrols])
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise_exception
  env.globals["strftime_now"] = _strftime_now
  env.globals["dict"] = _TemplateDict()
  env.globals["namespace"] = _TemplateNamespace
  return env.from_string(source)


def plain(value: Any) -> Any:
  """`value` rebuilt from plain JSON types (str, int, float, bool, None, dict, list, tuple); anything else becomes
  a "<TypeName>" placeholder, as transformers does before a template sees its inputs."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, str):
    return str.__str__(value)
  if isinstance(value, int):
    return int.__int__(value)
  if isinstance(value, float):
    return float.__float__(value)
  if isinstance(value, Mapping):
    return {plain(k): plain(v) for k, v in value.items()}
  if isinstance(value, list):
    return [plain(v) for v in value]
  if isinstance(value, tuple):
    return tuple(plain(v) for v in value)
  if isinstance(value, np.generic):  # np.bool_(False) would otherwise be a truthy placeholder
    return plain(value.item())
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
  return f"<{type(value).__name__}>"


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
  """The messages as a template sees them: None-valued keys dropped, plain types, reasoning aliased."""
  out = []
  for message in messages:
    if not isinstance(message, Mapping):
      raise TypeError(f"A chat message must be a mapping with 'role' and 'content', got {type(message).__name__}.")
    message = plain({k: v for k, v in message.items() if v is not None})
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is not None:
      message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    out.append(message)
  return out


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
  """A chat template's source and the special-token variables it is rendered with.

  Attributes:
    source: the Jinja text.
    special_tokens: the tokenizer's named special tokens as template variables ({"bos_token": "<s>", ...}).
    name: where it came from (for messages).
  """

  source: str
  special_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)
  name: str = "chat template"

  def __post_init__(self):
    if not isinstance(self.source, str) or not self.source:
      raise ValueError(f"{self.name}: a chat template must be a non-empty string.")
    object.__setattr__(self, "special_tokens", types.MappingProxyType(dict(self.special_tokens)))
    _compile(self.source)  # a syntax error is reported now, not at the first render

  @classmethod
  def from_file(cls, path: str | pathlib.Path, special_tokens: Mapping[str, str] | None = None) -> ChatTemplate:
    """A chat_template.jinja file, read as UTF-8 exactly (transformers reads it the same way)."""
    path = pathlib.Path(path)
    return cls(path.read_text(encoding="utf-8"), dict(special_tokens or {}), name=str(path))

  @classmethod
  def vendored(cls, name: str, special_tokens: Mapping[str, str] | None = None) -> ChatTemplate:
    """A template shipped in c2jax/data/chat_templates/ by file stem ("deepseek_v3_1", "kimi_k2_thinking")."""
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
      known = ", ".join(sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja")))
      raise ValueError(f"No vendored chat template {name!r}; the vendored ones are {known}.")
    return cls.from_file(path, special_tokens)

  @classmethod
  def from_tokenizer_config(cls, config: str | pathlib.Path | Mapping[str, Any], template_name: str | None = None,
                            tools: bool = False) -> ChatTemplate:
    """The `chat_template` of a tokenizer_config.json (a path or its parsed dict), with its special tokens.

    Args:
      config: the file or its contents.
      template_name: for the list form, the template to take by name.
      tools: for the list form without a name, whether tools will be passed (then "tool_use" is preferred).
    """
    if not isinstance(config, Mapping):
      config = json.loads(pathlib.Path(config).read_text(encoding="utf-8"))
    template = config.get("chat_template")
    if template is None:
      raise ValueError("This tokenizer_config.json has no chat_template; load the model's chat_template.jinja "
                       "with ChatTemplate.from_file instead.")
    if isinstance(template, (list, tuple)):
      named = {t["name"]: t["template"] for t in template}
      if template_name is not None:
        if template_name not in named:
          raise ValueError(f"No chat template named {template_name!r}; the names are {', '.join(sorted(named))}.")
        template = named[template_name]
      elif tools and "tool_use" in named:
        template = named["tool_use"]
      elif "default" in named:
        template = named["default"]
      else:
        raise ValueError(f"This tokenizer_config.json has several chat templates and no default; pass "
                         f"template_name, one of {', '.join(sorted(named))}.")
    special = {}
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
      token = config.get(key)
      if isinstance(token, Mapping):  # the AddedToken form {"content": ..., "lstrip": ...}
        token = token.get("content")
      if token is not None:
        special[key] = str(token)
    return cls(template, special, name="tokenizer_config.json chat_template")

  def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
             add_generation_prompt: bool = False, **kwargs: Any) -> str:
    """The conversation as text, as `apply_chat_template(..., tokenize=False)` writes it.

    Args:
      messages: HF chat messages ({"role", "content", "tool_calls", "tool_call_id", "reasoning_content", ...}).
      tools: JSON-schema function definitions ({"type": "function", "function": {...}}), or None.
      add_generation_prompt: end with the start of an assistant turn.
      **kwargs: extra template variables (e.g. `thinking=True`); they override the special tokens.
    """
    if not messages:
      raise ValueError("Cannot render an empty conversation; give at least one message.")
    if tools is not None and not all(isinstance(t, Mapping) for t in tools):
      raise ValueError("Tools must be JSON-schema dicts ({'type': 'function', 'function': {...}}).")
    variables = {**self.special_tokens, **kwargs}
    return _compile(self.source).render(messages=normalize_messages(messages), tools=plain(tools), documents=None,
                                        add_generation_prompt=add_generation_prompt, **plain(variables))
