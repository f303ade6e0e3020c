"""A small lazy reader of HF safetensors checkpoints, with DeepSeek-V3 FP8 block dequantization.

Format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length n, a JSON header of n
bytes mapping each tensor name to {dtype, shape, data_offsets: [begin, end]} (offsets relative to the end of the
header), then the raw little-endian data. A sharded checkpoint adds `model.safetensors.index.json` whose
`weight_map` names the file of every tensor.

Nothing is read eagerly: `SafetensorsReader.get` returns a read-only `np.memmap` view of one tensor, so a caller
that handles one tensor at a time holds one tensor (its pages are file-backed and evictable) whatever the size of
the checkpoint.

`HfWeights` presents the logical weights of a quantized checkpoint, dequantized to float32 one tensor at a time,
and hides the tensors that only serve the quantization. `quantization_config` (at the top level of config.json
and/or in its `text_config`) says which scheme, by `quant_method` (`QUANT_METHODS`):

- "fp8" (DeepSeek-V3 release, `{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [b0, b1]}`): a
  quantized `X.weight` [out, in] in float8_e4m3fn comes with `X.weight_scale_inv` float32
  [ceil(out / b0), ceil(in / b1)], and the real weight is w[i, j] = float(w_fp8[i, j]) * scale_inv[i // b0, j // b1].
- "compressed-tensors" (Kimi K2 Thinking / K2.5 releases): INT4 pack-quantized Linears, stored as
  `X.weight_packed`, `X.weight_scale` and `X.weight_shape` in place of `X.weight` (`c2jax.model.int4_pack` gives
  the bit layout and which Linears the config quantizes).
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np

from c2jax.input_errors import MissingInput
from c2jax.model import checkpoint_files
from c2jax.model import int4_pack
from c2jax.model.checkpoint_files import CheckpointFormatError
from c2jax.registry import Registry

# safetensors dtype names -> numpy dtypes (little-endian, as the format prescribes).
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}

_FP8_DTYPES = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
# Dtypes a float weight or scale may be stored in as it is (FP8 needs its scales: `HfWeights.check_float`).
_FLOAT_DTYPES = tuple(SAFETENSORS_DTYPES[n] for n in ("F64", "F32", "F16", "BF16"))

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SCALE_SUFFIX = "_scale_inv"  # `X.weight_scale_inv` holds the block scales of `X.weight`.

# The reference implementation's limits: a header of at most 100 MB, sizes and offsets that fit a u64 (`usize`).
_MAX_HEADER_BYTES = 100_000_000
_MAX_U64 = 2**64 - 1
_MAX_NDIM = 64  # numpy's limit on array dimensions (the reference has none; no checkpoint comes near it)
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """Where one tensor lives: its file, dtype, shape and absolute byte offset of its data."""

  name: str
  file: str
  dtype: np.dtype
  shape: tuple[int, ...]
  offset: int
  nbytes: int


def _is_u64(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_U64


def _tensor_entry(path: str, name: str, entry: Any) -> tuple[np.dtype, tuple[int, ...], int, int]:
  """(dtype, shape, begin, end) of one header entry, each field checked as the reference implementation does."""
  where = f"{path}: tensor {name!r}"
  if not isinstance(entry, dict):
    raise CheckpointFormatError(f"{where} is described by a JSON {type(entry).__name__}, not an object with "
                                f"{', '.join(_TENSOR_FIELDS)}; the file is corrupt.")
  missing = [k for k in _TENSOR_FIELDS if k not in entry]
  if missing:
    raise CheckpointFormatError(f"{where} has no {' and no '.join(missing)}; the file is corrupt.")
  dtype_name, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
  if not isinstance(dtype_name, str) or dtype_name not in SAFETENSORS_DTYPES:
    raise CheckpointFormatError(f"{where} has dtype {dtype_name!r}, which this reader does not know; known: "
                                f"{sorted(SAFETENSORS_DTYPES)}.")
  if not isinstance(shape, list) or not all(_is_u64(s) for s in shape) or len(shape) > _MAX_NDIM:
    raise CheckpointFormatError(f"{where} has shape {str(shape)[:200]}, not a list of at most {_MAX_NDIM} "
                                "non-negative ints; the file is corrupt.")
  if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_u64(o) for o in offsets):
    raise CheckpointFormatError(f"{where} has data_offsets {str(offsets)[:200]}, not two non-negative ints "
                                "[begin, end]; the file is corrupt.")
  dtype = SAFETENSORS_DTYPES[dtype_name]
  begin, end = offsets
  nbytes = math.prod(shape) * dtype.itemsize
  if end < begin or nbytes > _MAX_U64 or end - begin != nbytes:
    raise CheckpointFormatError(f"{where} ({dtype_name} {shape}) has data_offsets {offsets}, which do not span "
                                f"its {nbytes} bytes; the file is corrupt.")
  return dtype, tuple(shape), begin, end


def validate_header(header: Any, path: str, data_start: int, data_len: int
                    ) -> tuple[dict[str, TensorInfo], dict[str, str]]:
  """The tensors and metadata of a parsed safetensors header, checked by the reference implementation's rules.

  The header is a JSON object; `__metadata__`, when present and not null, maps strings to strings; every other
  entry has a known dtype, a shape of non-negative ints, data_offsets of exactly two non-negative ints with
  end - begin = numel * itemsize, and the tensors' ranges, sorted, tile [0, data_len) with no gap or overlap.

  Args:
    header: the parsed JSON header.
    path: the file, for messages.
    data_start: the absolute offset of the data (8 + header length).
    data_len: the bytes after the header.
  Returns:
    (tensors by name, the `__metadata__` string map, empty if absent).
  Raises:
    CheckpointFormatError naming the file, the tensor and the field.
  """
  if not isinstance(header, dict):
    raise CheckpointFormatError(f"{path}'s header is a JSON {type(header).__name__}, not an object of tensors; it "
                                "is not a safetensors file.")
  metadata = header.get("__metadata__")
  if metadata is None:
    metadata = {}
  if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
    raise CheckpointFormatError(f"{path}'s __metadata__ is {str(metadata)[:200]}, not a map of strings to strings; "
                                "the file is corrupt.")
  ranges = []
  tensors = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    dtype, shape, begin, end = _tensor_entry(path, name, entry)
    ranges.append((begin, end, name))
    tensors[name] = TensorInfo(name=name, file=path, dtype=dtype, shape=shape, offset=data_start + begin,
                               nbytes=end - begin)
  covered = 0
  for begin, end, name in sorted(ranges):  # the reference's order: by data_offsets
    if begin != covered:
      raise CheckpointFormatError(
          f"{path}: tensor {name!r} has data_offsets {[begin, end]}, but the tensors before it end at byte "
          f"{covered}; the tensors' data must tile the data section in order, without gap or overlap.")
    covered = end
  if covered != data_len:
    raise CheckpointFormatError(f"{path}: the tensors' data_offsets cover {covered} bytes but the file holds "
                                f"{data_len} bytes of data after its header; the file is truncated or corrupt.")
  return tensors, metadata


def read_header(path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
  """Parses and checks one safetensors file's header (`validate_header`) without touching its data.

  Args:
    path: a `.safetensors` file (a regular file: anything else is refused before it is read).
  Returns:
    (tensors by name, the `__metadata__` string map, empty if absent).
  """
  with checkpoint_files.open_regular(path, "safetensors file") as f:
    file_size = os.fstat(f.fileno()).st_size
    raw = f.read(8)
    if len(raw) != 8:
      raise CheckpointFormatError(f"{path} is shorter than a safetensors header; re-download or re-save the file.")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER_BYTES or 8 + n > file_size:
      raise CheckpointFormatError(f"{path} has a header length {n} beyond the file's {file_size} bytes or the "
                                  f"format's {_MAX_HEADER_BYTES}; it is not a (complete) safetensors file.")
    blob = f.read(n)
  try:
    header = checkpoint_files.strict_json_loads(blob)
  except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, NaN / Infinity, over-long ints, deep nesting
    raise CheckpointFormatError(f"{path} has a corrupt JSON header ({str(e)[:200]}); re-download or re-save the "
                                "file.") from None
  return validate_header(header, path, 8 + n, file_size - 8 - n)


def _read_weight_map(path: str) -> dict[str, str]:
  """The index's weight_map (tensor name -> shard file name), each shard name checked (`checkpoint_files`)."""
  index = os.path.join(path, INDEX_FILE)
  weight_map = checkpoint_files.read_json_object(index, "the shard index").get("weight_map")
  if not isinstance(weight_map, dict):
    raise CheckpointFormatError(f"{index}'s weight_map is {str(weight_map)[:100]}, not an object mapping tensor "
                                "names to shard files; re-download the index.")
  where = f"{index}'s weight_map"
  for shard in weight_map.values():
    if not isinstance(shard, str):
      checkpoint_files.shard_path(path, shard, where)  # refuses it
  for shard in set(weight_map.values()):  # a few shards, named by up to ~10^5 tensors
    checkpoint_files.shard_path(path, shard, where)
  return weight_map


class SafetensorsReader:
  """Lazy access to the tensors of a safetensors file or checkpoint directory (single file or sharded).

  A directory is read through `model.safetensors.index.json` when present, else `model.safetensors`, else its
  only `*.safetensors` file; every file of a directory must resolve inside it (`checkpoint_files`). Headers are
  parsed and checked once (`validate_header`); data is never read until `get`.
  """

  def __init__(self, path: str):
    weight_map = None
    if os.path.isdir(path):
      if os.path.lexists(os.path.join(path, INDEX_FILE)):
        weight_map = _read_weight_map(path)
        files = [os.path.join(path, n) for n in sorted(set(weight_map.values()))]
      else:
        files = [checkpoint_files.check_inside(path, f, "checkpoint file") for f in self._files_of_dir(path)]
    elif os.path.lexists(path):
      files = [path]
    else:
      raise MissingInput(f"{path} does not exist; pass a safetensors file or an HF checkpoint directory.")
    self._infos: dict[str, TensorInfo] = {}
    self.metadata: dict[str, str] = {}
    for f in files:
      infos, meta = read_header(f)
      for name in infos:
        if name in self._infos:
          raise CheckpointFormatError(f"tensor {name!r} appears in both {self._infos[name].file} and {f}; remove "
                                      "the duplicate shard.")
      self._infos.update(infos)
      self.metadata.update(meta)
    if weight_map is not None:
      self._check_index(path, weight_map)

  @staticmethod
  def _files_of_dir(path: str) -> list[str]:
    if os.path.lexists(os.path.join(path, SINGLE_FILE)):
      return [os.path.join(path, SINGLE_FILE)]
    found = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if len(found) == 1:
      return [os.path.join(path, found[0])]
    if not found:
      raise FileNotFoundError(f"no *.safetensors file in {path}; point at an HF checkpoint directory.")
    raise FileNotFoundError(f"{path} holds {len(found)} safetensors files but no {INDEX_FILE}; add the index "
                            "that lists which file holds which tensor.")

  def _check_index(self, path: str, weight_map: Mapping[str, str]):
    """The index and the shards' headers must agree, or some tensor would silently come from the wrong file."""
    wrong = [k for k, v in weight_map.items()
             if k not in self._infos or os.path.basename(self._infos[k].file) != v]
    extra = sorted(set(self._infos) - set(weight_map))
    if wrong or extra:
      raise CheckpointFormatError(f"{INDEX_FILE} in {path} disagrees with the shards: listed but not found there "
                                  f"{wrong[:10]}, in shards but not listed {extra[:10]}; re-download the index.")

  def keys(self) -> list[str]:
    return list(self._infos)

  def __contains__(self, name: str) -> bool:
    return name in self._infos

  def __len__(self) -> int:
    return len(self._infos)

  def info(self, name: str) -> TensorInfo:
    if name not in self._infos:
      raise KeyError(f"tensor {name!r} is not in this checkpoint.")
    return self._infos[name]

  def get(self, name: str) -> np.ndarray:
    """A read-only view of tensor `name` backed by its file (no copy, nothing read until touched)."""
    info = self.info(name)
    if info.nbytes == 0:  # mmap cannot map zero bytes.
      return np.zeros(info.shape, info.dtype)
    # Opened again as a regular file: the name may have been swapped for a FIFO since the header was read.
    with checkpoint_files.open_regular(info.file, "safetensors file") as f:
      if os.fstat(f.fileno()).st_size < info.offset + info.nbytes:
        raise CheckpointFormatError(f"{info.file} has shrunk below tensor {name!r}'s data since its header was "
                                    "read; the file is being rewritten, so read it once it is complete.")
      return np.memmap(f, dtype=info.dtype, mode="r", offset=info.offset, shape=info.shape)


# Quantization schemes ------------------------------------------------------------------------------------------

# quant_method -> parser of that `quantization_config` into a scheme object (`quantization_from_hf_config`).
QUANT_METHODS: Registry[Callable[[Mapping[str, Any]], Any]] = Registry("quantization_config.quant_method")


@dataclasses.dataclass(frozen=True)
class Fp8BlockQuant:
  """DeepSeek-V3 block-wise FP8 weights: one float32 `weight_scale_inv` per [b0, b1] block of [out, in]."""

  block_size: tuple[int, int] = (128, 128)

  @classmethod
  def from_hf_config(cls, hf_config: Mapping[str, Any]) -> Fp8BlockQuant | None:
    """Reads an FP8 `quantization_config` of an HF `config.json` dict (or its `text_config`); None when absent."""
    q = find_quantization_config(hf_config)
    if q is None:
      return None
    method = q.get("quant_method")
    if method != "fp8":
      raise CheckpointFormatError(f"config.json's quantization_config.quant_method={method!r} is not FP8; read it "
                                  "with safetensors_io.quantization_from_hf_config, which knows "
                                  f"{QUANT_METHODS.names()}.")
    return cls.from_quantization_config(q)

  @classmethod
  def from_quantization_config(cls, q: Mapping[str, Any]) -> Fp8BlockQuant:
    """Parses a `quantization_config` with quant_method 'fp8', field by field (as transformers' FP8 config).

    Fields: fmt "e4m3" (default), weight_block_size two positive ints (default [128, 128]), activation_scheme a
    string when present (activations are not quantized here, whatever it says).
    """
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
      raise CheckpointFormatError(f"config.json's quantization_config.fmt={str(fmt)[:100]!r} is not supported; only "
                                  "'e4m3' FP8 weights are.")
    if not isinstance(q.get("activation_scheme", ""), str):
      raise CheckpointFormatError(f"config.json's quantization_config.activation_scheme="
                                  f"{str(q['activation_scheme'])[:100]} is not a string such as 'dynamic'.")
    block = q.get("weight_block_size")
    if block is None:
      block = [128, 128]
    if (not isinstance(block, (list, tuple)) or len(block) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
      raise CheckpointFormatError(f"config.json's quantization_config.weight_block_size={str(block)[:100]} is not "
                                  "two positive ints [b_out, b_in].")
    return cls(block_size=(block[0], block[1]))

  def describe(self) -> str:
    return f"FP8 e4m3, blocks {list(self.block_size)}"


QUANT_METHODS.register("fp8")(Fp8BlockQuant.from_quantization_config)
QUANT_METHODS.register(int4_pack.QUANT_METHOD)(int4_pack.PackQuantizedInt4.from_quantization_config)

Quantization = Fp8BlockQuant | int4_pack.PackQuantizedInt4


def _quantization_config_at(hf_config: Mapping[str, Any], where: str) -> Mapping[str, Any] | None:
  """The `quantization_config` object of one config level (None when absent, null or empty), type-checked."""
  q = hf_config.get("quantization_config")
  if q is None or q == {}:
    return None
  if not isinstance(q, dict):
    raise CheckpointFormatError(f"config.json's {where}quantization_config is a JSON {type(q).__name__}, not an "
                                "object.")
  method = q.get("quant_method")
  if not isinstance(method, str) or method not in QUANT_METHODS:
    raise CheckpointFormatError(f"config.json's {where}quantization_config.quant_method={str(method)[:100]!r} is not "
                                f"supported; c2jax reads unquantized checkpoints and "
                                f"{', '.join(QUANT_METHODS.names())}, so dequantize the checkpoint first.")
  return q


def find_quantization_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any] | None:
  """`quantization_config` of config.json: at the top level or in `text_config` (Kimi K2.5 may write both)."""
  text_config = hf_config.get("text_config")
  if text_config is not None and not isinstance(text_config, dict):
    raise CheckpointFormatError(f"config.json's text_config is a JSON {type(text_config).__name__}, not an object.")
  top = _quantization_config_at(hf_config, "")
  text = _quantization_config_at(text_config or {}, "text_config.")
  if top and text and top != text:
    parse = [QUANT_METHODS.get(q["quant_method"]) for q in (top, text)]
    if parse[0] != parse[1] or parse[0](top) != parse[1](text):
      raise CheckpointFormatError("config.json has one quantization_config at the top level and a different one in "
                                  "text_config; keep the one that describes the stored weights.")
  return top or text or None


def quantization_from_hf_config(hf_config: Mapping[str, Any]) -> Quantization | None:
  """The quantization scheme of an HF `config.json` dict (`QUANT_METHODS`), or None when it is unquantized.

  Every field the scheme reads is checked (type, allowed values); a malformed one is refused in one sentence
  naming the field (`CheckpointFormatError`).
  """
  q = find_quantization_config(hf_config)
  if q is None:
    return None
  return QUANT_METHODS.get(q["quant_method"])(q)


def expected_scale_shape(weight_shape: tuple[int, ...], block_size: tuple[int, int]) -> tuple[int, int]:
  """[ceil(out / b0), ceil(in / b1)] for a weight [out, in]."""
  out, inp = weight_shape
  return (-(-out // block_size[0]), -(-inp // block_size[1]))


def dequantize_fp8_blocks(w: np.ndarray, scale_inv: np.ndarray, block_size: tuple[int, int],
                          name: str = "weight") -> np.ndarray:
  """w [out, in] (float8_e4m3fn) times its per-block scales, as float32.

  Args:
    w: [out, in] FP8 weight.
    scale_inv: [ceil(out / b0), ceil(in / b1)] float scales (edge blocks are partial and cropped).
    block_size: (b0, b1).
    name: the weight's name, for error messages.
  Returns:
    [out, in] float32. Memory: this one float32 array (scales are expanded one block row at a time).
  """
  if w.ndim != 2:
    raise ValueError(f"{name}: FP8 block dequantization needs a 2-D [out, in] weight, got shape {w.shape}.")
  want = expected_scale_shape(w.shape, block_size)
  if tuple(scale_inv.shape) != want:
    raise ValueError(f"{name}{SCALE_SUFFIX} has shape {tuple(scale_inv.shape)} but weight {tuple(w.shape)} with "
                     f"weight_block_size {list(block_size)} needs {list(want)}; fix quantization_config."
                     "weight_block_size or the scales.")
  b0, b1 = block_size
  out = np.asarray(w).astype(np.float32)
  scale = np.asarray(scale_inv, np.float32)
  for i in range(want[0]):
    out[i * b0:(i + 1) * b0] *= np.repeat(scale[i], b1)[:w.shape[1]]
  return out


class HfWeights:
  """The logical weights of an HF checkpoint: quantized weights come back dequantized to float32.

  FP8 scales are hidden; an INT4 pack-quantized Linear's `X.weight_packed`, `X.weight_scale` and `X.weight_shape`
  are presented as one weight `X.weight` of shape `X.weight_shape`. Every INT4 triple is checked when the
  checkpoint is opened (a missing scale or shape, a packed or scale shape that contradicts the weight's shape), so
  an incomplete checkpoint fails before anything is converted.

  Attributes:
    reader: the underlying `SafetensorsReader`.
    quant: the quantization scheme (`quantization_from_hf_config`), or None for an unquantized checkpoint.
  """

  def __init__(self, path: str, quant: Quantization | None = None):
    self.reader = SafetensorsReader(path)
    self.quant = quant
    names = set(self.reader.keys())
    self._scales = {n for n in names if n.endswith(SCALE_SUFFIX)}
    # A scale whose weight is absent is unexpected; report it like any other stray key.
    self._orphan_scales = sorted(s for s in self._scales if s[:-len(SCALE_SUFFIX)] not in names)
    hidden = set(self._scales)
    self._int4: dict[str, tuple[int, int]] = {}  # logical `X.weight` -> its (out, in)
    for packed in sorted(n for n in names if n.endswith(int4_pack.PACKED_SUFFIX)):
      name = packed[:-len(int4_pack.PACKED_SUFFIX)]
      self._int4[name] = self._check_int4(name, names)
      hidden |= {packed, name + int4_pack.SCALE_SUFFIX, name + int4_pack.SHAPE_SUFFIX}
    self._names = sorted(names - hidden) + self._orphan_scales + sorted(self._int4)

  def _check_int4(self, name: str, names: set[str]) -> tuple[int, int]:
    """(out, in) of the INT4 weight `name`, after checking that its three tensors are complete and agree."""
    packed, scale, shape = (name + s for s in (int4_pack.PACKED_SUFFIX, int4_pack.SCALE_SUFFIX,
                                                int4_pack.SHAPE_SUFFIX))
    if not isinstance(self.quant, int4_pack.PackQuantizedInt4):
      raise CheckpointFormatError(f"{packed} is INT4 pack-quantized but config.json has no compressed-tensors "
                                  "quantization_config; add the release's quantization_config (quant_method "
                                  "'compressed-tensors', format 'pack-quantized').")
    if name in names:
      raise CheckpointFormatError(f"{name} and {packed} both exist; the checkpoint is inconsistent, so keep only "
                                  "one of them.")
    missing = [n for n in (scale, shape) if n not in names]
    if missing:
      raise CheckpointFormatError(f"{packed} has no {' and no '.join(missing)}; the INT4 checkpoint is incomplete, "
                                  "so re-download the shard that should hold it.")
    packed_info, scale_info, info = (self.reader.info(n) for n in (packed, scale, shape))
    if packed_info.dtype != np.dtype("<i4"):
      raise CheckpointFormatError(f"{packed} is {packed_info.dtype}, not int32; it is not pack-quantized INT4.")
    if info.dtype.kind not in "iu" or info.shape != (2,):  # before reading it: it could be any size
      raise CheckpointFormatError(f"{shape} is {info.dtype} {list(info.shape)}, not the two positive ints (out, in) "
                                  "of the weight; the checkpoint is corrupt.")
    value = np.array(self.reader.get(shape))
    if min(value) <= 0:
      raise CheckpointFormatError(f"{shape} holds {value.tolist()}, not the two positive ints (out, in) of the "
                                  "weight; the checkpoint is corrupt.")
    out_in = (int(value[0]), int(value[1]))
    want = int4_pack.packed_shape(out_in)
    if packed_info.shape != want:
      raise CheckpointFormatError(f"{packed} is {list(packed_info.shape)} but {shape} says {list(out_in)}, which "
                                  f"needs {list(want)} (eight 4-bit values per int32); the checkpoint is "
                                  "inconsistent.")
    gs = self.quant.group_size
    want = int4_pack.scale_shape(out_in, gs)
    if out_in[1] % gs or scale_info.shape != want:
      raise CheckpointFormatError(f"{scale} is {list(scale_info.shape)} but {shape} {list(out_in)} with "
                                  f"quantization_config's group_size {gs} needs {list(want)} (and in divisible by "
                                  f"{gs}); fix group_size or the checkpoint.")
    if scale_info.dtype not in _FLOAT_DTYPES:
      raise CheckpointFormatError(f"{scale} is {scale_info.dtype}, not a float; the checkpoint is corrupt.")
    return out_in

  def keys(self) -> list[str]:
    """Weight names (scales excluded, except scales that have no weight: callers should reject those)."""
    return list(self._names)

  def __iter__(self) -> Iterator[str]:
    return iter(self._names)

  def __contains__(self, name: str) -> bool:
    return name in self._names

  def info(self, name: str) -> TensorInfo:
    """The stored tensor that holds `name`'s values (`X.weight_packed` for an INT4 weight): its file and offset."""
    return self.reader.info(name + int4_pack.PACKED_SUFFIX if name in self._int4 else name)

  def shape(self, name: str) -> tuple[int, ...]:
    """The logical shape (an INT4 weight's `weight_shape`)."""
    return self._int4[name] if name in self._int4 else self.reader.info(name).shape

  def nbytes(self, name: str) -> int:
    """Stored bytes (the packed ones for an INT4 weight)."""
    return self.info(name).nbytes

  def is_fp8(self, name: str) -> bool:
    return name not in self._int4 and self.reader.info(name).dtype in _FP8_DTYPES

  def is_int4(self, name: str) -> bool:
    return name in self._int4

  def check_float(self, name: str) -> None:
    """Refuses `name` unless `get(name)` gives floats, without reading any data.

    A stored float dtype (F64, F32, F16, BF16) passes, as do a checked INT4 weight and an FP8 e4m3 weight with its
    float scale of the right shape under an FP8 quantization_config; an integer or bool tensor does not (a float
    parameter declared I32 would be converted as its bit pattern's values), unless it is a declared quantized
    packing (INT4's `weight_packed`, which the logical weight hides).

    Raises:
      CheckpointFormatError naming the tensor and what is wrong with its dtype or scale.
    """
    if name in self._int4:
      return
    dtype = self.reader.info(name).dtype
    scale_name = name + SCALE_SUFFIX
    if dtype not in _FP8_DTYPES:
      if dtype not in _FLOAT_DTYPES:
        raise CheckpointFormatError(f"{self.reader.info(name).file}: tensor {name!r} is stored as {dtype}, but it is "
                                    "a float weight and no quantization_config declares it packed; re-save it as "
                                    "a float.")
      if scale_name in self._scales:
        raise CheckpointFormatError(f"{scale_name} exists but {name} is {dtype}, not FP8; the checkpoint is "
                                    "inconsistent.")
      return
    self._fp8_block_size(name)

  def _fp8_block_size(self, name: str) -> tuple[int, int]:
    """The block size of the FP8 weight `name`, after checking its scheme, dtype and scale (`check_float`)."""
    dtype, scale_name = self.reader.info(name).dtype, name + SCALE_SUFFIX
    if self.quant is None:
      raise CheckpointFormatError(f"{name} is {dtype} but config.json has no quantization_config; add "
                                  '{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]} (or the '
                                  "real block size) to config.json.")
    if not isinstance(self.quant, Fp8BlockQuant):
      raise CheckpointFormatError(f"{name} is {dtype} but config.json's quantization_config is "
                                  f"{self.quant.describe()}, not FP8; the checkpoint mixes schemes that c2jax does "
                                  "not read together.")
    if dtype != np.dtype(ml_dtypes.float8_e4m3fn):
      raise CheckpointFormatError(f"{name} is {dtype}; only float8_e4m3fn block-quantized weights are supported.")
    if scale_name not in self._scales:
      raise CheckpointFormatError(f"{name} is FP8 but its scale {scale_name} is missing; the checkpoint is "
                                  "incomplete.")
    scale = self.reader.info(scale_name)
    if scale.dtype not in _FLOAT_DTYPES:
      raise CheckpointFormatError(f"{scale_name} is {scale.dtype}, not a float scale; the checkpoint is corrupt.")
    shape = self.reader.info(name).shape
    if len(shape) != 2:
      raise CheckpointFormatError(f"{name}: FP8 block dequantization needs a 2-D [out, in] weight, got shape "
                                  f"{list(shape)}.")
    want = expected_scale_shape(shape, self.quant.block_size)
    if scale.shape != want:
      raise CheckpointFormatError(f"{scale_name} has shape {scale.shape} but weight {shape} with weight_block_size "
                                  f"{list(self.quant.block_size)} needs {list(want)}; fix quantization_config."
                                  "weight_block_size or the scales.")
    return self.quant.block_size

  def get(self, name: str) -> np.ndarray:
    """Tensor `name`: a read-only file-backed view, or a float32 array when it was quantized (FP8 or INT4).

    An FP8 weight is checked as `check_float` says before it is read; other tensors come back in their stored
    dtype (call `check_float` first where only floats may come).
    """
    if name in self._int4:
      return int4_pack.dequantize(self.reader.get(name + int4_pack.PACKED_SUFFIX),
                                  self.reader.get(name + int4_pack.SCALE_SUFFIX), self._int4[name],
                                  self.quant.group_size, name)
    dtype = self.reader.info(name).dtype
    if dtype not in _FP8_DTYPES:
      if name + SCALE_SUFFIX in self._scales:
        self.check_float(name)  # refuses the stray scale
      return self.reader.get(name)
    block_size = self._fp8_block_size(name)  # checked before anything is read
    return dequantize_fp8_blocks(self.reader.get(name), self.reader.get(name + SCALE_SUFFIX), block_size, name)
