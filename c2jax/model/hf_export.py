"""Writes a c2jax model as an HF DeepSeek-V3 safetensors checkpoint: the inverse of `c2jax.model.hf_convert`.

  summary = export_checkpoint("/ckpt/c2jax", "/ckpt/hf")                 # a c2jax checkpoint, streamed from disk
  summary = export_params(params, cfg, "/tmp/hf", dtype="float32")       # in-memory params (tests, benchmarks)

The output is what transformers' `save_pretrained` writes for `DeepseekV3ForCausalLM`, plus the MTP modules in
the DeepSeek-V3 release layout:

  config.json                     `ModelConfig.to_hf_dict()` (architectures, model_type, topk_method "noaux_tc",
                                  scoring_func "sigmoid", rope_parameters) + `dtype` / `torch_dtype`, and the v4
                                  keys `rope_theta` / `rope_scaling` that older readers (transformers 4.x, vLLM
                                  versions before rope_parameters, DeepSeek's remote code) look for.
  model-0000i-of-0000n.safetensors   shards of at most `max_shard_size` bytes (a larger tensor gets a shard of its
                                  own), or one `model.safetensors` when everything fits in one, as transformers does.
  model.safetensors.index.json    {"metadata": {"total_parameters", "total_size"}, "weight_map": {name: file}}.
  tokenizer files                 copied from `tokenizer_dir` when given (`TOKENIZER_FILES`).

Names and layouts are `hf_convert.conversion_plan(cfg)` read backwards: the piece of leaf `path` at `index` is HF
tensor `name`; a Linear piece [in dims..., out dims...] becomes the HF weight [prod(out), prod(in)] (the inverse of
`hf_convert._to_layout`). MTP module m is HF layer n_layers + m with its own copies of the embedding
(`embed_tokens`) and the head (`shared_head.head`), as DeepSeek released them and as vLLM's DeepSeek MTP drafter
(MTP speculative decoding) loads them; config.json's `num_nextn_predict_layers` counts them. transformers'
DeepseekV3ForCausalLM has no MTP module: it reports those tensors as unexpected keys and ignores them. With
`n_shared_experts == 0` the shared experts are written empty ([0, D] / [D, 0]), as `save_pretrained` writes them,
so that transformers finds every tensor it builds.

Dtypes: `ExportDtype.BFLOAT16` (the default) is what a server wants: DeepSeek-V3 and Kimi K2 are served in bf16 (or
quantized from it), vLLM's and transformers' `dtype="auto"` take the dtype from config.json, and a float32 export
would double the disk, the download and the serving memory for no gain. `FLOAT32` is exact (a round trip through
`hf_convert` gives back the same params bit for bit). Whatever the dtype, the router (`mlp.gate.weight`) and its
correction bias (`e_score_correction_bias`) are written in float32: c2jax keeps them in float32, transformers keeps
them in float32 when it loads in bf16 (`_keep_in_fp32_modules_strict`), and vLLM builds the bias in float32; a
bf16 bias would move the top-k choice of near-tied experts.

Streaming: tensors are written one at a time, each shard's header first (every shape and dtype is known from the
config before any data is read), so host memory never holds the model. From a checkpoint, leaves are read with
tensorstore (the orbax layout of `c2jax.model.checkpoint`, OCDBT or not, zarr v2 or v3) in slabs: the pieces of
a leaf that one stored chunk covers along its layer / expert axes, up to `read_budget_bytes`. A checkpoint written
by `StreamingCheckpointWriter` (every converted model) has a chunk per piece, so a slab is one HF tensor. One
written by `save_checkpoint` has a chunk per device shard of each leaf (the whole stacked leaf when it was saved
from one device): a chunk is the unit of decompression, so reading any part of it costs its whole size in memory,
and a slab larger than the budget is read in parts that decompress the same chunk again (slower, never more memory
than a chunk). Peak host memory: the largest of (a slab, a stored chunk) plus two copies of one HF tensor (the
piece read and its transposed, cast copy). The tensors are therefore ordered leaf by leaf (all layers' q_a, then
all layers' q_b, ...), which loaders do not mind (they follow the index).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import json
import math
import os
import re
import shutil
import sys
import time
from typing import Any, Iterator, Sequence

import jax
import ml_dtypes
import numpy as np
import tensorstore as ts
import tqdm

from c2jax.input_errors import MissingInput
from c2jax.model import checkpoint as ckpt_lib
from c2jax.model.config import ModelConfig, RopeType
from c2jax.model.hf_convert import conversion_plan, mtp_copies
from c2jax.model.params import Params, ParamSpec, param_specs
from c2jax.model.safetensors_io import INDEX_FILE, SINGLE_FILE

CONFIG_FILE = "config.json"
DEFAULT_MAX_SHARD_SIZE = "5GB"  # the Hub's customary shard size (DeepSeek-V3's release: 163 files of ~4.3 GB)
DEFAULT_READ_BUDGET_BYTES = 2 << 30
# What `tokenizer_dir` may hold for a serving engine (HF fast / sentencepiece / tiktoken tokenizers, chat template,
# generation defaults); tokenizer code of remote-code tokenizers (`tokenization_*.py`, Kimi K2's) is copied too.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json", "added_tokens.json", "tokenizer.model",
                   "tiktoken.model", "vocab.json", "merges.txt")
_VOCAB_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")
_TOKENIZER_CODE_RE = re.compile(r"^tokenization_\w+\.py$")
_SIZE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
               "GIB": 2**30, "TIB": 2**40}
_SAFETENSORS_NAMES = {np.dtype("<f4"): "F32", np.dtype(ml_dtypes.bfloat16): "BF16"}


class ExportDtype(enum.Enum):
  """The stored dtype of the exported weights (the router and its bias stay float32 in both)."""

  BFLOAT16 = "bfloat16"
  FLOAT32 = "float32"

  @property
  def numpy(self) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if self is ExportDtype.BFLOAT16 else np.dtype("<f4")


@dataclasses.dataclass
class ExportSummary:
  """What an export wrote."""

  out_dir: str
  dtype: ExportDtype
  num_tensors: int = 0
  num_parameters: int = 0  # elements written, MTP modules and their embedding / head copies included
  num_bytes: int = 0  # tensor data bytes (the index's total_size)
  num_shards: int = 0
  num_mtp_layers: int = 0
  seconds: float = 0.0
  files: list[str] = dataclasses.field(default_factory=list)  # every file written, relative to out_dir

  def __str__(self) -> str:
    mtp = (f", including {self.num_mtp_layers} MTP layer(s) in the DeepSeek-V3 layout" if self.num_mtp_layers
           else "")
    return (f"wrote {self.out_dir}: {self.num_tensors} tensors, {self.num_parameters:,} parameters "
            f"({self.dtype.value}; router float32){mtp}, in {self.num_shards} safetensors shard(s) of "
            f"{_human(self.num_bytes)} in all, {len(self.files)} files, in {self.seconds:.1f} s.")


def _human(n: int) -> str:
  for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
    if n >= size:
      return f"{n / size:.2f} {unit}"
  return f"{n} B"


def parse_size(size: int | str) -> int:
  """Bytes of a size given as an int or as transformers' strings: "5GB" (10^9), "500MB", "2GiB" (2^30), "64KB"."""
  if isinstance(size, int):
    value = size
  else:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", size)
    unit = (m.group(2) or "B").upper() if m else ""
    if not m or unit not in _SIZE_UNITS:
      raise ValueError(f"max_shard_size={size!r} is not a size; write e.g. 5GB, 500MB, 2GiB or a number of bytes.")
    value = int(float(m.group(1)) * _SIZE_UNITS[unit])
  if value <= 0:
    raise ValueError(f"max_shard_size={size!r} must be positive; write e.g. 5GB.")
  return value


# ------------------------------------------------------------------------------------------------------------------
# The tensors to write
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """One HF tensor: where its data comes from and how it is stored.

  path / index / n_in: the `hf_convert.Target` it inverts (path None: an empty shared expert, no data).
  shape: the HF shape; dtype: the stored dtype.
  """

  name: str
  path: tuple[str, ...] | None
  index: tuple[int, ...]
  n_in: int | None
  shape: tuple[int, ...]
  dtype: np.dtype

  @property
  def nbytes(self) -> int:
    return math.prod(self.shape) * self.dtype.itemsize


def _flat_specs(cfg: ModelConfig) -> dict[tuple[str, ...], ParamSpec]:
  flat, _ = jax.tree_util.tree_flatten_with_path(param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))
  return {tuple(k.key for k in path): spec for path, spec in flat}


def _hf_shape(piece: tuple[int, ...], n_in: int | None) -> tuple[int, ...]:
  if n_in is None:
    return piece
  return (math.prod(piece[n_in:]), math.prod(piece[:n_in]))


def _to_hf(piece: np.ndarray, n_in: int | None, dtype: np.dtype) -> np.ndarray:
  """A layout piece as its HF tensor: Linear [in..., out...] -> [out, in]; cast; C-contiguous."""
  if n_in is not None:
    piece = piece.reshape(math.prod(piece.shape[:n_in]), -1).T
  return np.ascontiguousarray(piece, dtype=dtype)


def _slabs(lead: tuple[int, ...], extent: Sequence[int]) -> Iterator[tuple[slice, ...]]:
  """The blocks of `extent` that tile the index grid `lead`, in row-major order."""
  starts = itertools.product(*[range(0, n, e) for n, e in zip(lead, extent)])
  for s in starts:
    yield tuple(slice(a, min(a + e, n)) for a, e, n in zip(s, extent, lead))


def _empty_shared_experts(cfg: ModelConfig, dtype: np.dtype) -> list[_Tensor]:
  if cfg.n_shared_experts or not cfg.n_moe_layers:
    return []
  d = cfg.d_model
  out = []
  for i in range(cfg.first_k_dense_replace, cfg.n_layers):
    prefix = f"model.layers.{i}.mlp.shared_experts"
    out += [_Tensor(f"{prefix}.gate_proj.weight", None, (), None, (0, d), dtype),
            _Tensor(f"{prefix}.up_proj.weight", None, (), None, (0, d), dtype),
            _Tensor(f"{prefix}.down_proj.weight", None, (), None, (d, 0), dtype)]
  return out


# ------------------------------------------------------------------------------------------------------------------
# Where the params come from
# ------------------------------------------------------------------------------------------------------------------


class _ParamsSource:
  """In-memory params (numpy or jax arrays, any sharding): one leaf at a time on the host."""

  def __init__(self, params: Params, cfg: ModelConfig):
    want = {p: s.shape for p, s in _flat_specs(cfg).items()}
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    got = {tuple(k.key for k in p): tuple(np.shape(v)) for p, v in flat}
    problems = [f"missing {'/'.join(p)}" for p in sorted(set(want) - set(got))]
    problems += [f"unexpected {'/'.join(p)}" for p in sorted(set(got) - set(want))]
    problems += [f"{'/'.join(p)} has shape {got[p]}, the config needs {want[p]}" for p in sorted(set(want) & set(got))
                 if got[p] != want[p]]
    if problems:
      raise ValueError(f"params do not match the config: {'; '.join(problems[:20])}. Pass the config the params "
                       "were built for (drop params['mtp'] together with num_mtp_layers=0).")
    self._params = params

  def slab_extent(self, path: tuple[str, ...], lead: tuple[int, ...], piece_bytes: int) -> tuple[int, ...]:
    del path, piece_bytes
    return lead  # the leaf is in memory already

  def read(self, path: tuple[str, ...], slab: tuple[slice, ...]) -> np.ndarray:
    leaf = self._params
    for k in path:
      leaf = leaf[k]
    return np.asarray(jax.device_get(leaf))[slab]


class _CheckpointSource:
  """A c2jax checkpoint's leaves, read in slabs with tensorstore (see the module docstring)."""

  def __init__(self, directory: str, cfg: ModelConfig, read_budget_bytes: int):
    self._dir = os.path.join(os.path.abspath(directory), ckpt_lib.PARAMS_DIR)
    if not os.path.isdir(self._dir):
      raise FileNotFoundError(f"{self._dir} is missing: {directory} holds no finished params checkpoint.")
    self._ocdbt = os.path.exists(os.path.join(self._dir, "manifest.ocdbt"))
    self._specs = _flat_specs(cfg)
    self._cfg = cfg
    self._budget = read_budget_bytes
    self._context = ts.Context()
    self._stores: dict[tuple[str, ...], ts.TensorStore] = {}

  def _store(self, path: tuple[str, ...]) -> ts.TensorStore:
    if path in self._stores:
      return self._stores[path]
    name = ".".join(path)  # orbax names a leaf's array by its key path joined with dots
    if self._ocdbt:
      kvstore = {"driver": "ocdbt", "base": {"driver": "file", "path": self._dir + "/"}, "path": name}
    else:
      kvstore = {"driver": "file", "path": os.path.join(self._dir, name)}
    errors = []
    for driver in ("zarr", "zarr3"):  # orbax writes zarr v2 by default, v3 with use_zarr3
      try:
        store = ts.open({"driver": driver, "kvstore": kvstore, "recheck_cached_data": False,
                         "recheck_cached_metadata": False}, open=True, read=True, context=self._context).result()
        break
      except ValueError as e:
        errors.append(str(e).splitlines()[0])
    else:
      raise ValueError(f"{os.path.dirname(self._dir)}: cannot read param {'/'.join(path)} ({'; '.join(errors)}); "
                       "the checkpoint is damaged or was not written by c2jax.model.checkpoint.")
    spec = self._specs[path]
    want = np.dtype(spec.dtype or self._cfg.param_dtype)
    if tuple(store.shape) != spec.shape or store.dtype.numpy_dtype != want:
      raise ValueError(f"{os.path.dirname(self._dir)}: param {'/'.join(path)} is stored as {want.name} "
                       f"{tuple(store.shape)} but model_config.json implies {store.dtype.numpy_dtype.name} "
                       f"{spec.shape}; the checkpoint is damaged or its config was edited; re-convert it.")
    self._stores[path] = store
    return store

  def slab_extent(self, path: tuple[str, ...], lead: tuple[int, ...], piece_bytes: int) -> tuple[int, ...]:
    extent = [max(1, min(c, n)) for c, n in zip(self._read_chunk(path), lead)]
    while math.prod(extent) * piece_bytes > self._budget and max(extent, default=1) > 1:
      i = int(np.argmax(extent))
      extent[i] = -(-extent[i] // 2)
    return tuple(extent)

  def read(self, path: tuple[str, ...], slab: tuple[slice, ...]) -> np.ndarray:
    return self._store(path)[slab].read().result()

  def _read_chunk(self, path: tuple[str, ...]) -> list[int]:
    """The stored array's read chunk shape (zarr arrays always have one; tensorstore types it as optional)."""
    layout = self._store(path).chunk_layout
    shape = layout.read_chunk.shape
    chunk = [] if shape is None else [c for c in shape if c is not None]
    if shape is None or len(chunk) != len(shape):
      raise ValueError(f"{os.path.dirname(self._dir)}: param {'/'.join(path)} has no regular chunk grid ({layout}); "
                       "the checkpoint was not written by c2jax.model.checkpoint.")
    return chunk


def _plan(cfg: ModelConfig, dtype: ExportDtype, source) -> list[tuple[tuple[str, ...] | None, tuple[slice, ...],
                                                                       list[_Tensor]]]:
  """[(leaf path, slab, the tensors read from that slab in order)], leaf by leaf, covering every param piece.

  Raises:
    RuntimeError: when `conversion_plan` leaves a piece without an HF name or names one twice (the two modules
      disagree; nothing has been written).
  """
  specs = _flat_specs(cfg)
  by_piece: dict[tuple[tuple[str, ...], tuple[int, ...]], list[tuple[str, int | None]]] = {}
  plan = conversion_plan(cfg)
  for name, t in plan.items():
    by_piece.setdefault((tuple(t.path), tuple(t.index)), []).append((name, t.n_in))
  for copy, main in mtp_copies(cfg).items():  # the MTP modules' embedding / head, right after the main tensor
    t = plan[main]
    by_piece[(tuple(t.path), tuple(t.index))].append((copy, t.n_in))
  twice = [f"{'/'.join(p)}{list(i)}" for (p, i), names in by_piece.items() if len({n for n, _ in names}) < len(names)
           or len({n_in for _, n_in in names}) > 1]
  if twice:
    raise RuntimeError(f"hf_convert.conversion_plan maps several tensors of different layouts to {twice[:5]}; "
                       "fix the plan before exporting.")
  index_dims = {p: len(i) for p, i in by_piece}
  out: list[tuple[tuple[str, ...] | None, tuple[slice, ...], list[_Tensor]]] = []
  missing = []
  for path, spec in specs.items():
    k = index_dims.get(path, 0)
    lead, piece = spec.shape[:k], spec.shape[k:]
    stored = dtype.numpy if spec.dtype is None else np.dtype("<f4")  # router / router_bias: float32 (see above)
    read_bytes = math.prod(piece) * np.dtype(spec.dtype or cfg.param_dtype).itemsize
    for slab in _slabs(lead, source.slab_extent(path, lead, read_bytes)):
      tensors = []
      for index in itertools.product(*[range(s.start, s.stop) for s in slab]):
        names = by_piece.get((path, index))
        if not names:
          missing.append(f"{'/'.join(path)}{list(index)}")
          continue
        tensors += [_Tensor(n, path, index, n_in, _hf_shape(piece, n_in), stored) for n, n_in in names]
      out.append((path, slab, tensors))
  if missing:
    raise RuntimeError(f"hf_convert.conversion_plan names no HF tensor for {len(missing)} param pieces, e.g. "
                       f"{missing[:5]}; the export would lose them: fix the plan before exporting.")
  empty = _empty_shared_experts(cfg, dtype.numpy)
  if empty:
    out.append((None, (), empty))
  return out


# ------------------------------------------------------------------------------------------------------------------
# Writing
# ------------------------------------------------------------------------------------------------------------------


def _shards(tensors: list[_Tensor], max_bytes: int) -> list[list[_Tensor]]:
  """huggingface_hub's split: in order, a new shard when the next tensor would overflow the current one; a tensor
  larger than `max_bytes` gets a shard of its own."""
  shards: list[list[_Tensor]] = []
  current: list[_Tensor] = []
  size = 0
  for t in tensors:
    if t.nbytes > max_bytes:
      shards.append([t])
      continue
    if size + t.nbytes > max_bytes and current:
      shards.append(current)
      current, size = [], 0
    current.append(t)
    size += t.nbytes
  if current:
    shards.append(current)
  return shards


def _header(tensors: list[_Tensor]) -> bytes:
  """The safetensors header of `tensors`, data in that order: 8-byte length, JSON padded to 8 bytes."""
  h: dict[str, Any] = {"__metadata__": {"format": "pt"}}
  offset = 0
  for t in tensors:
    h[t.name] = {"dtype": _SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape),
                 "data_offsets": [offset, offset + t.nbytes]}
    offset += t.nbytes
  raw = json.dumps(h, separators=(",", ":")).encode()
  raw += b" " * (-len(raw) % 8)
  return len(raw).to_bytes(8, "little") + raw


def _hf_config(cfg: ModelConfig, dtype: ExportDtype, specials: dict[str, Any]) -> dict[str, Any]:
  hf = cfg.to_hf_dict()
  r = cfg.rope
  if r.type is RopeType.YARN:  # DeepSeek's release spells it {"type": "yarn", ...} beside rope_theta
    legacy = {k: v for k, v in hf["rope_parameters"].items() if k != "rope_theta"}
    rope_scaling = {"type": r.type.value, **legacy}
  else:
    rope_scaling = None
  hf.update(dtype=dtype.value, torch_dtype=dtype.value, rope_theta=r.theta, rope_scaling=rope_scaling,
            use_cache=True)
  # No made-up special tokens: DeepseekV3Config's defaults (bos 0, eos 1) would name arbitrary tokens.
  hf.update(bos_token_id=specials.get("bos_token_id"), eos_token_id=specials.get("eos_token_id"))
  return hf


def _token_ids(tokenizer_dir: str) -> dict[str, Any]:
  """bos_token_id / eos_token_id from generation_config.json, else tokenizer_config.json's tokens in tokenizer.json."""
  gen = os.path.join(tokenizer_dir, "generation_config.json")
  if os.path.exists(gen):
    with open(gen) as f:
      g = json.load(f)
    return {k: g[k] for k in ("bos_token_id", "eos_token_id") if g.get(k) is not None}
  tc, tj = os.path.join(tokenizer_dir, "tokenizer_config.json"), os.path.join(tokenizer_dir, "tokenizer.json")
  if not (os.path.exists(tc) and os.path.exists(tj)):
    return {}
  import tokenizers

  with open(tc) as f:
    declared = json.load(f)
  tok = tokenizers.Tokenizer.from_file(tj)
  out = {}
  for key in ("bos", "eos"):
    token = declared.get(f"{key}_token")
    if isinstance(token, dict):  # {"content": "<s>", ...} in older files
      token = token.get("content")
    if isinstance(token, str) and tok.token_to_id(token) is not None:
      out[f"{key}_token_id"] = tok.token_to_id(token)
  return out


def _tokenizer_files(tokenizer_dir: str, cfg: ModelConfig) -> list[str]:
  if not os.path.isdir(tokenizer_dir):
    raise FileNotFoundError(f"tokenizer_dir={tokenizer_dir} is not a directory; point it at a model directory with "
                            "tokenizer.json and tokenizer_config.json.")
  names = sorted(n for n in os.listdir(tokenizer_dir) if os.path.isfile(os.path.join(tokenizer_dir, n))
                 and (n in TOKENIZER_FILES or _TOKENIZER_CODE_RE.match(n)))
  if not any(n in _VOCAB_FILES for n in names):
    raise FileNotFoundError(f"tokenizer_dir={tokenizer_dir} holds none of {', '.join(_VOCAB_FILES)}; point it at a "
                            "model directory with a tokenizer.")
  if "tokenizer.json" in names:
    import tokenizers

    n = tokenizers.Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).get_vocab_size(True)
    if n > cfg.vocab_size:
      raise ValueError(f"the tokenizer in {tokenizer_dir} has {n} tokens but the model's vocab_size is "
                       f"{cfg.vocab_size}; pass the tokenizer the model was trained with.")
  return names


def _prepare_out_dir(out_dir: str) -> str:
  out_dir = os.path.abspath(out_dir)
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise FileExistsError(f"out_dir {out_dir} is not empty; choose a new directory or empty it first.")
  if os.path.exists(out_dir) and not os.path.isdir(out_dir):
    raise FileExistsError(f"out_dir {out_dir} is a file; choose a new directory.")
  os.makedirs(out_dir, exist_ok=True)
  return out_dir


def _export(source, cfg: ModelConfig, out_dir: str, dtype: ExportDtype | str, max_shard_size: int | str,
            tokenizer_dir: str | None, progress: bool) -> ExportSummary:
  start = time.monotonic()
  if sys.byteorder != "little":
    raise RuntimeError("safetensors stores little-endian data; export on a little-endian host.")
  try:
    dtype = ExportDtype(dtype)
  except ValueError as e:
    raise ValueError(f"dtype={dtype!r}: export as bfloat16 (for serving) or float32 (exact).") from e
  max_bytes = parse_size(max_shard_size)
  tok_files = _tokenizer_files(tokenizer_dir, cfg) if tokenizer_dir else []
  groups = _plan(cfg, dtype, source)
  tensors = [t for _, _, ts_ in groups for t in ts_]
  shards = _shards(tensors, max_bytes)
  total = sum(t.nbytes for t in tensors)
  out_dir = _prepare_out_dir(out_dir)
  free = shutil.disk_usage(out_dir).free
  if free < total:
    raise OSError(f"{out_dir} has {free / 1e9:.1f} GB free; the export needs {total / 1e9:.1f} GB. Free space or "
                  "choose another out_dir.")
  n = len(shards)
  files = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
  summary = ExportSummary(out_dir=out_dir, dtype=dtype, num_mtp_layers=cfg.num_mtp_layers, num_shards=n)

  # Each shard's data in dtype-itemsize order (float32 first), as safetensors orders it, so that every tensor's
  # data is aligned to its itemsize. Reading follows the plan's slab order, which this keeps within each dtype.
  shards = [sorted(s, key=lambda t: -t.dtype.itemsize) for s in shards]
  file_of = {t.name: f for s, f in zip(shards, files) for t in s}
  slab_of = {t.name: (path, slab) for path, slab, ts_ in groups for t in ts_}
  cached: tuple[Any, np.ndarray] | None = None  # (slab key, slab) of the latest read
  with tqdm.tqdm(total=len(tensors), unit="tensor", desc="export", disable=not progress) as bar:
    for shard, fname in zip(shards, files):
      with open(os.path.join(out_dir, fname), "wb") as f:
        f.write(_header(shard))
        for t in shard:
          if t.path is None:
            data = np.zeros(t.shape, t.dtype)
          else:
            key = slab_of[t.name]
            if cached is None or cached[0] != key:
              cached = None  # drop the previous slab before reading the next one
              cached = (key, source.read(*key))
            slab = key[1]
            piece = cached[1][tuple(i - s.start for i, s in zip(t.index, slab))]
            data = _to_hf(piece, t.n_in, t.dtype)
          if data.shape != t.shape:
            raise RuntimeError(f"{t.name}: computed shape {data.shape} differs from the planned {t.shape}.")
          f.write(data.reshape(-1).view(np.uint8).data)
          summary.num_tensors += 1
          summary.num_parameters += data.size
          summary.num_bytes += data.nbytes
          del data
          bar.update(1)
  cached = None

  if n > 1:  # transformers writes an index only for a sharded checkpoint
    index = {"metadata": {"total_parameters": summary.num_parameters, "total_size": summary.num_bytes},
             "weight_map": file_of}
    with open(os.path.join(out_dir, INDEX_FILE), "w") as index_file:
      index_file.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    files.append(INDEX_FILE)
  specials: dict[str, Any] = {}
  if tokenizer_dir:  # tok_files is empty without one
    for name in tok_files:
      shutil.copy2(os.path.join(tokenizer_dir, name), os.path.join(out_dir, name))
    specials = _token_ids(tokenizer_dir)
  files += tok_files
  # config.json last: a crashed export leaves a directory that no loader takes for a model.
  with open(os.path.join(out_dir, CONFIG_FILE), "w") as config_file:
    json.dump(_hf_config(cfg, dtype, specials), config_file, indent=2, sort_keys=True)
    config_file.write("\n")
  files.append(CONFIG_FILE)
  summary.files = files
  summary.seconds = time.monotonic() - start
  return summary


def export_params(params: Params, cfg: ModelConfig, out_dir: str, *, dtype: ExportDtype | str = ExportDtype.BFLOAT16,
                  max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, tokenizer_dir: str | None = None,
                  progress: bool = False) -> ExportSummary:
  """Writes in-memory params of `cfg` as an HF DeepSeek-V3 checkpoint in `out_dir` (see the module docstring).

  Args:
    params: the param pytree of `cfg` (numpy or jax arrays); one leaf at a time is brought to the host.
    cfg: the architecture; `num_mtp_layers` MTP modules are exported (strip params["mtp"] and set it to 0 to
      leave them out).
    out_dir: a new or empty directory.
    dtype: stored dtype, "bfloat16" (default) or "float32".
    max_shard_size: bytes per shard (int, or "5GB", "500MB", "2GiB").
    tokenizer_dir: a directory whose tokenizer files (`TOKENIZER_FILES`) are copied next to the weights.
    progress: show a tqdm progress bar over tensors.
  Returns:
    an `ExportSummary`.
  Raises:
    ValueError: params that do not match `cfg`, a bad dtype or size, a tokenizer larger than the vocabulary.
    FileExistsError: `out_dir` is not empty.
  """
  return _export(_ParamsSource(params, cfg), cfg, out_dir, dtype, max_shard_size, tokenizer_dir, progress)


def export_checkpoint(checkpoint_dir: str, out_dir: str, *, dtype: ExportDtype | str = ExportDtype.BFLOAT16,
                      max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE, tokenizer_dir: str | None = None,
                      read_budget_bytes: int = DEFAULT_READ_BUDGET_BYTES, progress: bool = False) -> ExportSummary:
  """Streams the c2jax checkpoint `checkpoint_dir` into an HF DeepSeek-V3 checkpoint in `out_dir`.

  Args:
    checkpoint_dir: a c2jax checkpoint (`c2jax.model.checkpoint`: model_config.json + params/).
    out_dir: a new or empty directory.
    dtype: stored dtype, "bfloat16" (default) or "float32".
    max_shard_size: bytes per shard (int, or "5GB", "500MB", "2GiB").
    tokenizer_dir: a directory whose tokenizer files (`TOKENIZER_FILES`) are copied next to the weights.
    read_budget_bytes: the most bytes of one leaf read at once (see the module docstring on memory).
    progress: show a tqdm progress bar over tensors.
  Returns:
    an `ExportSummary`.
  Raises:
    FileNotFoundError: `checkpoint_dir` is missing or is not a finished c2jax checkpoint.
    FileExistsError: `out_dir` is not empty.
    ValueError: a damaged checkpoint, a bad dtype or size, a tokenizer larger than the vocabulary.
  """
  if not os.path.isdir(checkpoint_dir):
    raise MissingInput(f"checkpoint {checkpoint_dir} does not exist; point it at a c2jax checkpoint directory "
                            "(model_config.json + params/).")
  cfg = ckpt_lib.read_config(checkpoint_dir)
  source = _CheckpointSource(checkpoint_dir, cfg, read_budget_bytes)
  return _export(source, cfg, out_dir, dtype, max_shard_size, tokenizer_dir, progress)
