"""The rollout buffer's schema: what one committed group holds, and how it is laid out on disk (report sections 4
and 6: actors commit groups of G rewarded rollouts of one task; the trainer consumes them asynchronously).

A *group* is a dict of numpy arrays with R >= 1 rows: the G samples of one task, or more rows when self-summary
chains have several segments (each generation of a chain is a row; its rows share a `chain_id`).

  field               shape            dtype in memory   stored as   meaning
  tokens              [R, T]           int32             int32       prompt + generation, right-padded to T
  loss_mask           [R, T]           float32 (0/1)     uint8       1 where the policy sampled the token
  behaviour_logprobs  [R, T]           float32           float32     log mu(token t | tokens < t), 0 off the mask
  policy_version      [R, T]           int32             int32       weights version that sampled token t
  expert_ids          [Lm, R, T, K]    int32             int16       routed experts of input token t per MoE layer
                                                                     (routing replay); only when Lm > 0, ids in
                                                                     [0, MAX_EXPERT_ID]
  reward_terms        {name: [R]}      float32           JSON        raw reward signals, exactly spec.reward_terms
  truncated           [R]              float32           JSON        1 if the chain hit its length budget
  chain_id            [R]              int32             JSON        chain within the group (segments share it)
  segment             [R]              int32             JSON        segment index within its chain
  prompt_length       [R]              int32             JSON        prompt tokens at the start of the row
  length              [R]              int32             JSON        tokens after the prompt (generated, and in a
                                                                     multi-turn row the observations between turns)
  source              [R, T]           int32             uint8       with spec.ledger only: the token's
                                                                     `c2jax.actors.ledger.Source` (prompt 0, model 1,
                                                                     observation 2, notice 3)
  turn                [R, T]           int32             int16       with spec.ledger only: the token's turn index

The group id, task id, the actor's metadata and the [R] fields (reward terms and ROW_FIELDS, a few numbers per row;
as JSON numbers, which hold float32 and int32 values exactly) live in the commit record, not in arrays: an array
costs a stored object (and an fsync) per commit, which for a few bytes per row is most of its cost.

On-disk layout of a buffer at URL (a local directory, s3:// or gs://), schema version SCHEMA_VERSION:

  URL/trainer.json                           {"version", "groups_consumed", "groups_per_step", "time"} (trainer)
  URL/writers/<id>.json                      one marker per shard, so shards are listed without walking arrays
  URL/shards/<id>/schema.json                BufferSpec.to_json() (includes schema_version)
  URL/shards/<id>/head.json                  {"committed", "pending", "rows", "time"}, rewritten on begin/commit
  URL/shards/<id>/owner.json                 {"token", "pid", "host", "time"} of the writer that opened it last
  URL/shards/<id>/writer.lock                local filesystems: held (flock) by the live writer's process
  URL/shards/<id>/pending/<ticket>.json      intent records of groups being generated
  URL/shards/<id>/commits/<seq:012d>.json    one commit record per commit call, named by the seq of its first
                                             group: {"schema_version", "seq", "time", "groups": [{"row0", "rows",
                                             "task_id", "meta", "ticket_id", "row_fields": {field: [R values],
                                             "reward_terms": {name: [R values]}}}, ...], "checksum"}, the call's
                                             groups in seq order on consecutive rows; written after their rows.
                                             Seqs inside a call have no object of their own. Checksummed and
                                             checked on read: c2jax/rollouts/records.py.
  URL/shards/<id>/arrays/<field>/            zarr3 arrays of the [R, T] fields and expert_ids, rows along axis 0
                                             (axis 1 for expert_ids)

Value ranges (`check_group`, on write and on read): every reward term and behaviour log-prob finite, truncated 0 or
1, chain_id and segment in [0, R), prompt_length and length in [0, T] with prompt_length + length <= T.

Arrays are blosc-compressed (lz4 after a byte shuffle; padding costs almost nothing) with a crc32c checksum per
chunk, so a corrupt chunk is detected on read. Their row extent only grows and may exceed the committed rows: the
commit records, not the array shapes, say which rows hold data.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np

# 3: commit records carry a checksum of their content (2: without one; 1: a record per group, [R] fields in
# arrays). Readers read one version only: another version's shard is skipped and counted, never guessed at.
SCHEMA_VERSION = 3

# Expert ids are stored as int16: models with more than MAX_EXPERT_ID + 1 experts need a new schema version.
MAX_EXPERT_ID = 32767

TOKEN_FIELDS = ("tokens", "loss_mask", "behaviour_logprobs", "policy_version")  # [R, T]
ROW_FIELDS = ("truncated", "chain_id", "segment", "prompt_length", "length")  # [R]
LEDGER_FIELDS = ("source", "turn")  # [R, T], in buffers whose spec has ledger=True (multi-turn trajectories)
MAX_SOURCE = 255
MAX_TURN = 32767
# In-memory dtype of every field (reward terms are float32 too).
DTYPES = {"tokens": np.int32, "loss_mask": np.float32, "behaviour_logprobs": np.float32,
          "policy_version": np.int32, "expert_ids": np.int32, "truncated": np.float32, "chain_id": np.int32,
          "segment": np.int32, "prompt_length": np.int32, "length": np.int32, "source": np.int32, "turn": np.int32}
# Stored dtype where it differs from the in-memory one.
STORED_DTYPES = {"loss_mask": np.uint8, "expert_ids": np.int16, "source": np.uint8, "turn": np.int16}

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def check_name(kind: str, name: str) -> str:
  """`name` if it is safe as one path component ([A-Za-z0-9_.-]+, not '.' or '..'), else ValueError."""
  if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
    raise ValueError(f"{kind} {name!r} is not a safe name; use letters, digits, '_', '.' and '-' only.")
  return name


@dataclasses.dataclass(frozen=True)
class BufferSpec:
  """The shapes every group of a buffer shares.

  Attributes:
    seq_len: T, the padded row length (prompt + generation).
    n_moe_layers: Lm, MoE layers whose routed experts are recorded for routing replay; 0 stores no expert ids.
    experts_per_tok: K, the router's top-k.
    reward_terms: names of the raw reward signals (c2jax.rl.rewards.REWARD_TERMS), one [R] array each.
    ledger: groups also carry each token's source and turn (`LEDGER_FIELDS`): multi-turn trajectories of the agent
      loop (`c2jax.actors.agent_loop`).
  """

  seq_len: int
  n_moe_layers: int = 0
  experts_per_tok: int = 1
  reward_terms: tuple[str, ...] = ("outcome",)
  ledger: bool = False

  @property
  def token_fields(self) -> tuple[str, ...]:
    """The [R, T] fields of this spec's groups."""
    return TOKEN_FIELDS + (LEDGER_FIELDS if self.ledger else ())

  def __post_init__(self):
    for name in ("seq_len", "experts_per_tok"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"BufferSpec.{name} must be a positive int, got {getattr(self, name)!r}.")
    if not isinstance(self.n_moe_layers, int) or self.n_moe_layers < 0:
      raise ValueError(f"BufferSpec.n_moe_layers must be an int >= 0, got {self.n_moe_layers!r}.")
    object.__setattr__(self, "reward_terms", tuple(self.reward_terms))
    if not self.reward_terms:
      raise ValueError("BufferSpec.reward_terms is empty; give at least ('outcome',).")
    for name in self.reward_terms:
      check_name("Reward term", name)
    if len(set(self.reward_terms)) != len(self.reward_terms):
      raise ValueError(f"BufferSpec.reward_terms {self.reward_terms} has duplicates.")
    if not isinstance(self.ledger, bool):
      raise ValueError(f"BufferSpec.ledger must be a bool, got {self.ledger!r}.")

  def to_json(self) -> dict:
    out = {"schema_version": SCHEMA_VERSION, "seq_len": self.seq_len, "n_moe_layers": self.n_moe_layers,
           "experts_per_tok": self.experts_per_tok, "reward_terms": list(self.reward_terms)}
    if self.ledger:  # written only when set, so single-turn buffers keep the layout older readers know
      out["ledger"] = True
    return out

  @classmethod
  def from_json(cls, d: Mapping[str, Any]) -> BufferSpec:
    """The spec of `to_json()`'s output; ValueError naming the first missing, unknown or mistyped field."""
    if not isinstance(d, Mapping):
      raise ValueError(f"Buffer schema must be a JSON object, got {type(d).__name__}.")
    if d.get("schema_version") != SCHEMA_VERSION:
      raise ValueError(f"Buffer schema field schema_version is {d.get('schema_version')!r}; this code reads "
                       f"version {SCHEMA_VERSION} (a buffer written by other code: write to a new buffer URL, or read "
                       f"it with the code that wrote it).")
    known = {"schema_version", "seq_len", "n_moe_layers", "experts_per_tok", "reward_terms", "ledger"}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"Buffer schema has unknown field {unknown[0]!r}.")
    if "seq_len" not in d:
      raise ValueError("Buffer schema lacks field seq_len.")
    for name in ("seq_len", "n_moe_layers", "experts_per_tok"):
      if name in d and (not isinstance(d[name], int) or isinstance(d[name], bool)):
        raise ValueError(f"Buffer schema field {name} must be an int, got {d[name]!r}.")
    terms = d.get("reward_terms", ["outcome"])
    if not isinstance(terms, (list, tuple)) or not all(isinstance(t, str) for t in terms):
      raise ValueError(f"Buffer schema field reward_terms must be a list of names, got {terms!r}.")
    if not isinstance(d.get("ledger", False), bool):
      raise ValueError(f"Buffer schema field ledger must be true or false, got {d['ledger']!r}.")
    return cls(seq_len=d["seq_len"], n_moe_layers=d.get("n_moe_layers", 0),
               experts_per_tok=d.get("experts_per_tok", 1), reward_terms=tuple(terms), ledger=d.get("ledger", False))


def group_rows(group: Mapping) -> int:
  """R, the rows of a group (from its tokens)."""
  return int(np.shape(group["tokens"])[0])


def check_group(group: Mapping, spec: BufferSpec) -> None:
  """Raises ValueError with one sentence naming the first field of `group` with a wrong shape, dtype or value."""
  if not isinstance(group, Mapping):
    raise ValueError(f"A rollout group must be a dict of arrays, got {type(group).__name__}.")
  fields = set(spec.token_fields + ROW_FIELDS + ("reward_terms",)) | ({"expert_ids"} if spec.n_moe_layers else set())
  missing = sorted(fields - set(group))
  if missing:
    raise ValueError(f"Rollout group lacks field {missing[0]}; see c2jax/rollouts/schema.py for the schema.")
  extra = sorted(set(group) - fields)
  if extra:
    hint = {"expert_ids": " (the spec has n_moe_layers=0)", "source": " (the spec has ledger=False)",
            "turn": " (the spec has ledger=False)"}.get(extra[0], "")
    raise ValueError(f"Rollout group has unknown field {extra[0]}{hint}; see c2jax/rollouts/schema.py.")
  tokens = np.asarray(group["tokens"])
  if tokens.ndim != 2 or tokens.shape[0] < 1 or tokens.shape[1] != spec.seq_len:
    raise ValueError(f"Rollout group field tokens has shape {tokens.shape}; expected [R >= 1, T={spec.seq_len}].")
  r, t = tokens.shape
  want = {f: (r, t) for f in spec.token_fields} | {f: (r,) for f in ROW_FIELDS}
  if spec.n_moe_layers:
    want["expert_ids"] = (spec.n_moe_layers, r, t, spec.experts_per_tok)
  for f, shape in want.items():
    _check_array(f, group[f], shape, DTYPES[f])
  _check_token_values(group, spec)
  terms = group["reward_terms"]
  if not isinstance(terms, Mapping) or set(terms) != set(spec.reward_terms):
    got = sorted(terms) if isinstance(terms, Mapping) else type(terms).__name__
    raise ValueError(f"Rollout group field reward_terms has {got}; expected exactly {sorted(spec.reward_terms)}.")
  for name in spec.reward_terms:
    _check_array(f"reward_terms[{name!r}]", terms[name], (r,), np.float32)
  check_row_fields(group, r, spec)


def _check_token_values(group: Mapping, spec: BufferSpec) -> None:
  """The value checks of the [R, T] fields and expert ids (shapes already checked)."""
  mask = np.asarray(group["loss_mask"])
  if not np.all((mask == 0) | (mask == 1)):
    raise ValueError("Rollout group field loss_mask has values other than 0 and 1.")
  if spec.n_moe_layers:
    ids = np.asarray(group["expert_ids"])
    if ids.size and (ids.min() < 0 or ids.max() > MAX_EXPERT_ID):
      raise ValueError(f"Rollout group field expert_ids has ids in [{ids.min()}, {ids.max()}]; the buffer stores "
                       f"[0, {MAX_EXPERT_ID}].")
  if spec.ledger:
    for f, top in (("source", MAX_SOURCE), ("turn", MAX_TURN)):
      a = np.asarray(group[f])
      if a.size and (a.min() < 0 or a.max() > top):
        raise ValueError(f"Rollout group field {f} has values in [{a.min()}, {a.max()}]; the buffer stores [0, {top}].")
  if not np.all(np.isfinite(np.asarray(group["behaviour_logprobs"]))):
    raise ValueError("Rollout group field behaviour_logprobs has NaN or infinite values.")


def check_row_fields(fields: Mapping, rows: int, spec: BufferSpec) -> None:
  """Raises ValueError with one sentence naming the first [R] field of `fields` (ROW_FIELDS and reward_terms, arrays
  of `rows` values, shapes already checked) outside the schema's ranges (module docstring): what the trainer reads
  as rewards, lengths and chain structure must be finite numbers that fit the group."""
  for name in spec.reward_terms:
    with np.errstate(over="ignore"):  # stored as float32: a float64 1e39 overflows to inf, refused below
      values = np.asarray(fields["reward_terms"][name], np.float32)
    if not np.all(np.isfinite(values)):
      raise ValueError(f"Rollout group field reward_terms[{name!r}] has NaN or infinite values.")
  t = spec.seq_len
  ranges = {"truncated": (0, 1), "chain_id": (0, rows - 1), "segment": (0, rows - 1), "prompt_length": (0, t),
            "length": (0, t)}
  for name, (lo, hi) in ranges.items():
    a = np.asarray(fields[name])
    if not np.all((a >= lo) & (a <= hi)):  # NaN fails both comparisons
      bad = a[~((a >= lo) & (a <= hi))][0]
      raise ValueError(f"Rollout group field {name} has the value {bad}; it must be in [{lo}, {hi}] (R = {rows} "
                       f"rows, T = {t}).")
  if not np.all(np.isin(np.asarray(fields["truncated"]), (0, 1))):
    raise ValueError("Rollout group field truncated has values other than 0 and 1.")
  total = np.asarray(fields["prompt_length"], np.int64) + np.asarray(fields["length"], np.int64)
  if np.any(total > t):
    raise ValueError(f"Rollout group fields prompt_length + length reach {total.max()}, past the row length T = {t}.")


def _check_array(name: str, x: Any, shape: tuple[int, ...], dtype: type) -> None:
  """Shape must match exactly; the dtype must be of the same kind (ints for ints, floats for floats; a bool or int
  loss mask is accepted) and the values must fit the in-memory dtype."""
  a = np.asarray(x)
  if a.shape != shape:
    raise ValueError(f"Rollout group field {name} has shape {a.shape}; expected {shape}.")
  if np.issubdtype(dtype, np.integer):
    ok = np.issubdtype(a.dtype, np.integer)
    if ok and a.size and a.dtype.itemsize > 4:
      ok = np.iinfo(np.int32).min <= a.min() and a.max() <= np.iinfo(np.int32).max
  else:
    ok = np.issubdtype(a.dtype, np.floating) or (name == "loss_mask" and a.dtype.kind in "biu")
  if not ok:
    raise ValueError(f"Rollout group field {name} has dtype {a.dtype}; expected {np.dtype(dtype).name}.")


def normalize_group(group: Mapping, spec: BufferSpec) -> dict:
  """The group checked (`check_group`) and cast to the in-memory dtypes of the schema."""
  check_group(group, spec)
  out = {f: np.asarray(group[f], DTYPES[f]) for f in spec.token_fields + ROW_FIELDS}
  if spec.n_moe_layers:
    out["expert_ids"] = np.asarray(group["expert_ids"], np.int32)
  out["reward_terms"] = {n: np.asarray(group["reward_terms"][n], np.float32) for n in spec.reward_terms}
  return out


def array_fields(spec: BufferSpec) -> list[tuple[str, str, int, tuple[int, ...]]]:
  """Every stored array as (key in the group, path under arrays/, rows axis, shape of the non-row axes): the [R, T]
  fields and expert_ids (the [R] fields are in the commit records: `row_fields_to_json`)."""
  t = spec.seq_len
  out: list[tuple[str, str, int, tuple[int, ...]]] = [(f, f, 0, (t,)) for f in spec.token_fields]
  if spec.n_moe_layers:
    out.append(("expert_ids", "expert_ids", 1, (spec.n_moe_layers, t, spec.experts_per_tok)))
  return out


def row_fields_to_json(group: Mapping, spec: BufferSpec) -> dict:
  """The [R] fields of a normalized group as the commit record stores them: {field: [R numbers], "reward_terms":
  {name: [R numbers]}} (Python floats hold every float32 exactly, and JSON writes them exactly)."""
  out = {f: np.asarray(group[f]).tolist() for f in ROW_FIELDS}
  out["reward_terms"] = {n: np.asarray(group["reward_terms"][n]).tolist() for n in spec.reward_terms}
  return out


def row_fields_from_json(d: Any, rows: int, spec: BufferSpec) -> dict:
  """Inverse of `row_fields_to_json` for a group of `rows` rows: the [R] fields as arrays of their in-memory dtypes
  (values unchecked: `check_row_fields`). ValueError naming the field unless `d` holds exactly ROW_FIELDS and the
  spec's reward terms, each a list of `rows` JSON numbers of the field's kind (ints for the int fields; never bools
  or strings, which numpy would convert)."""
  if not isinstance(d, Mapping) or set(d) != set(ROW_FIELDS) | {"reward_terms"}:
    raise ValueError(f"row_fields is not an object of exactly {sorted(ROW_FIELDS + ('reward_terms',))}")
  terms = d["reward_terms"]
  if not isinstance(terms, Mapping) or set(terms) != set(spec.reward_terms):
    raise ValueError(f"row_fields.reward_terms is not an object of exactly {sorted(spec.reward_terms)}")
  out: dict[str, Any] = {f: _json_column(f, d[f], rows, DTYPES[f]) for f in ROW_FIELDS}
  out["reward_terms"] = {n: _json_column(f"reward_terms[{n!r}]", terms[n], rows, np.float32)
                         for n in spec.reward_terms}
  return out


def _json_column(name: str, values: Any, rows: int, dtype: type) -> np.ndarray:
  """One [R] field from its JSON list, strictly typed."""
  integer = np.issubdtype(dtype, np.integer)
  kinds = (int,) if integer else (int, float)
  if (not isinstance(values, list) or len(values) != rows
      or not all(isinstance(v, kinds) and not isinstance(v, bool) for v in values)):
    raise ValueError(f"row_fields.{name} is not a list of {rows} JSON {'ints' if integer else 'numbers'}")
  if integer and not all(np.iinfo(np.int32).min <= v <= np.iinfo(np.int32).max for v in values):
    raise ValueError(f"row_fields.{name} has a value outside int32")
  with np.errstate(over="ignore"):  # a float past float32's range becomes inf, which check_row_fields refuses
    return np.asarray(values, dtype)


def example_group(spec: BufferSpec, rows: int = 2, seed: int = 0, version: int = 0, prompt: int = 2) -> dict:
  """A well-formed random group (numpy) for docs, tests and benchmarks: every row a single-segment chain with a
  `prompt`-token prompt and a generation filling half the rest of the row (padding after)."""
  rng = np.random.default_rng(seed)
  t = spec.seq_len
  gen = max(0, (t - prompt) // 2) if t > prompt else 0
  loss_mask = np.zeros((rows, t), np.float32)
  loss_mask[:, prompt:prompt + gen] = 1.0
  tokens = rng.integers(0, 256, (rows, t)).astype(np.int32) * (np.arange(t) < prompt + gen)
  group = {
      "tokens": tokens.astype(np.int32),
      "loss_mask": loss_mask,
      "behaviour_logprobs": (-rng.random((rows, t)) * loss_mask).astype(np.float32),
      "policy_version": np.full((rows, t), version, np.int32),
      "reward_terms": {n: rng.random(rows).astype(np.float32) for n in spec.reward_terms},
      "truncated": np.zeros(rows, np.float32),
      "chain_id": np.arange(rows, dtype=np.int32),
      "segment": np.zeros(rows, np.int32),
      "prompt_length": np.full(rows, prompt, np.int32),
      "length": np.full(rows, gen, np.int32),
  }
  if spec.n_moe_layers:
    group["expert_ids"] = rng.integers(0, 64, (spec.n_moe_layers, rows, t, spec.experts_per_tok)).astype(np.int32)
  if spec.ledger:  # the prompt (source 0), then the generation as one model turn (source 1)
    group["source"] = ((np.arange(t) >= prompt) & (np.arange(t) < prompt + gen)).astype(np.int32)[None].repeat(rows, 0)
    group["turn"] = np.zeros((rows, t), np.int32)
  return group
