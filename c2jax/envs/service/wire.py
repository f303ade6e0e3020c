"""What crosses between an environment server and its clients: gRPC methods named by `method_path`, the shared
secret and the caller's token in metadata, and JSON payloads (no generated code: grpc's generic handlers carry bytes).

  Open    {"suite": {"suite": name, field: value, ...}, "split": str, "index": int}  -> {"episode": id}
  Reset   {"episode": id}                                                            -> {}
  Step    {"episode": id, "ids": [int, ...], "text": str}                 -> a TurnResult (`turn_result_plain`)
  Reward  {"episode": id}                                                            -> {"terms": {name: float}}
  Close   {"episode": id}                                                            -> {}

Both sides check what they read before using it (a payload is data from another process): `decode` refuses
malformed JSON, a field that is missing or of the wrong type, and anything past the limits below, with `WireError`
(one sentence naming the method and the field).
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

from c2jax.envs.chat import markup
from c2jax.envs.chat.chat_format import Continuation, ToolResult
from c2jax.envs.core.agent_env import TurnResult

SERVICE = "c2jax.envs.EnvService"
METHODS = ("Open", "Reset", "Step", "Reward", "Close")
SECRET_KEY = "c2jax-env-secret"  # gRPC metadata keys are lowercase ASCII
CLIENT_KEY = "c2jax-env-client"
CLIENT_TOKEN_HEX = 32  # a caller's token: 128 random bits in hex
EPISODE_ID_HEX = 32
# Both ends' message limit: a turn's text and an observation are bounded by the agent's and the environment's own
# budgets, far below this; gRPC's default of 4 MiB would cut a long tool output from a real repository.
MAX_MESSAGE_BYTES = 32 * 1024 * 1024
MAX_IDS = 1 << 20


class WireError(ValueError):
  """A payload that is not what its method carries."""


def method_path(name: str) -> str:
  return f"/{SERVICE}/{name}"


def encode(obj: Any) -> bytes:
  return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode(data: bytes, method: str) -> dict:
  """The JSON object of a payload of `method`."""
  try:
    obj = json.loads(data.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise WireError(f"{method}: the payload is not UTF-8 JSON ({e}).") from None
  if not isinstance(obj, dict):
    raise WireError(f"{method}: the payload is a JSON {type(obj).__name__}, not an object.")
  return obj


def field(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...], method: str) -> Any:
  """obj[name], which must be of `kind` (a bool is never taken for an int)."""
  if name not in obj:
    raise WireError(f"{method}: field {name!r} is missing.")
  value = obj[name]
  kinds = kind if isinstance(kind, tuple) else (kind,)
  if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
    allowed = " or ".join(k.__name__ for k in kinds)
    raise WireError(f"{method}: field {name!r} is a {type(value).__name__}, not {allowed}.")
  return value


def episode_id(obj: Mapping[str, Any], method: str) -> str:
  value = field(obj, "episode", str, method)
  if len(value) != EPISODE_ID_HEX or any(c not in "0123456789abcdef" for c in value):
    raise WireError(f"{method}: field 'episode' is not an episode id ({EPISODE_ID_HEX} lowercase hex digits).")
  return value


def valid_client_token(token: str) -> bool:
  return len(token) == CLIENT_TOKEN_HEX and all(c in "0123456789abcdef" for c in token)


def step_ids(obj: Mapping[str, Any], method: str = "Step") -> list[int]:
  ids = field(obj, "ids", list, method)
  if len(ids) > MAX_IDS or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31 for i in ids):
    raise WireError(f"{method}: field 'ids' must be at most {MAX_IDS} token ids, each an int in [0, 2**31).")
  return ids


def _markup_plain(pieces: markup.Markup) -> list[list[str]]:
  return [[p.text, p.kind.value] for p in pieces]


def _markup(value: Any, where: str) -> markup.Markup:
  if not isinstance(value, list) or not all(
      isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in value):
    raise WireError(f"Step: {where} is not a list of [text, kind] pairs.")
  try:
    return tuple(markup.Piece(text, markup.Kind(kind)) for text, kind in value)
  except ValueError:
    raise WireError(f"Step: {where} names a piece kind other than "
                    f"{', '.join(k.value for k in markup.Kind)}.") from None


def turn_result_plain(result: TurnResult) -> dict:
  """A TurnResult as JSON data, every field (its tool results and continuation included)."""
  cont = result.continuation
  return {"observation": result.observation, "notice": result.notice, "done": bool(result.done),
          "reason": result.reason, "budget": result.budget,
          "results": [{"text": r.text, "call": r.call, "ok": bool(r.ok), "tool": r.tool} for r in result.results],
          "continuation": None if cont is None else {"observation": _markup_plain(cont.observation_markup),
                                                      "notice": _markup_plain(cont.notice_markup)}}


def turn_result(obj: Mapping[str, Any]) -> TurnResult:
  """The TurnResult of `turn_result_plain`'s data, checked field by field."""
  m = "Step"
  results = []
  for i, r in enumerate(field(obj, "results", list, m)):
    if not isinstance(r, dict):
      raise WireError(f"Step: results[{i}] is not an object.")
    call = r.get("call")
    if call is not None and (not isinstance(call, int) or isinstance(call, bool) or call < 0):
      raise WireError(f"Step: results[{i}].call is not a call index (an int >= 0) or null.")
    results.append(ToolResult(text=field(r, "text", str, f"Step results[{i}]"), call=call,
                              ok=field(r, "ok", bool, f"Step results[{i}]"),
                              tool=field(r, "tool", str, f"Step results[{i}]")))
  cont = obj.get("continuation")
  if cont is not None:
    if not isinstance(cont, dict):
      raise WireError("Step: field 'continuation' is not an object or null.")
    cont = Continuation(_markup(cont.get("observation"), "continuation.observation"),
                        _markup(cont.get("notice"), "continuation.notice"))
  try:
    return TurnResult(observation=field(obj, "observation", str, m), notice=field(obj, "notice", str, m),
                      done=field(obj, "done", bool, m), reason=field(obj, "reason", str, m),
                      results=tuple(results), budget=field(obj, "budget", str, m), continuation=cont)
  except WireError:
    raise
  except ValueError as e:  # TurnResult's own check: the continuation spells the observation and the notice
    raise WireError(f"Step: {e}") from None


def reward_plain(terms: Mapping[str, float]) -> dict:
  return {"terms": {str(k): float(v) for k, v in terms.items()}}


def reward_terms(obj: Mapping[str, Any]) -> dict[str, float]:
  terms = field(obj, "terms", dict, "Reward")
  for name, value in terms.items():
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      raise WireError(f"Reward: term {name!r} is not a finite number.")
  return {name: float(value) for name, value in terms.items()}
