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
import json
import math
import os
import struct
from typing import Any, Callable, Iterator, Mapping

import ml_dtypes
import numpy as np

from c2jax.model import int4_pack
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

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
SCALE_SUFFIX = "_scale_inv"  # `X.weight_scale_inv` holds the block scales of `X.weight`.

# A header larger than this is not a safetensors file (the reference implementation caps it at 100 MB).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """Where one tensor lives: its file, dtype, shape and absolute byte offset of its data."""

  name: str
  file: str
  dtype: np.dtype
  shape: tuple[int, ...]
  offset: int
  nbytes: int


def read_header(path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
  """Parses one safetensors file's header without touching its data.

  Args:
    path: a `.safetensors` file.
  Returns:
    (tensors by name, the `__metadata__` string map, empty if absent).
  """
  file_size = os.path.getsize(path)
  with open(path, "rb") as f:
    raw = f.read(8)
    if len(raw) != 8:
      raise ValueError(f"{path} is shorter than a safetensors header; re-download or re-save the file.")
    (n,) = struct.unpack("<Q", raw)
    if n > _MAX_HEADER_BYTES or 8 + n > file_size:
      raise ValueError(f"{path} has an implausible header length {n}; it is not a (complete) safetensors file.")
    try:
      header = json.loads(f.read(n))
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} has a corrupt JSON header ({e}); re-download or re-save the file.") from e
  metadata = header.pop("__metadata__", None) or {}
  data_start = 8 + n
  tensors = {}
  for name, h in header.items():
    if h["dtype"] not in SAFETENSORS_DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has dtype {h['dtype']!r}, which this reader does not know; "
                       f"known: {sorted(SAFETENSORS_DTYPES)}.")
    dtype = SAFETENSORS_DTYPES[h["dtype"]]
    shape = tuple(int(s) for s in h["shape"])
    begin, end = (int(o) for o in h["data_offsets"])
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes or data_start + end > file_size:
      raise ValueError(f"{path}: tensor {name!r} ({h['dtype']} {list(shape)}) has data_offsets {[begin, end]} that "
                       f"do not match its size {nbytes} or the file size {file_size}; the file is corrupt.")
    tensors[name] = TensorInfo(name=name, file=path, dtype=dtype, shape=shape, offset=data_start + begin,
                               nbytes=nbytes)
  return tensors, metadata


class SafetensorsReader:
  """Lazy access to the tensors of a safetensors file or checkpoint directory (single file or sharded).

  A directory is read through `model.safetensors.index.json` when present, else `model.safetensors`, else its
  only `*.safetensors` file. Headers are parsed once; data is never read until `get`.
  """

  def __init__(self, path: str):
    if os.path.isdir(path):
      files = self._files_of_dir(path)
    elif os.path.isfile(path):
      files = [path]
    else:
      raise FileNotFoundError(f"{path} does not exist; pass a safetensors file or an HF checkpoint directory.")
    self._infos: dict[str, TensorInfo] = {}
    self.metadata: dict[str, str] = {}
    for f in files:
      infos, meta = read_header(f)
      for name in infos:
        if name in self._infos:
          raise ValueError(f"tensor {name!r} appears in both {self._infos[name].file} and {f}; remove the "
                           "duplicate shard.")
      self._infos.update(infos)
      self.metadata.update(meta)
    self._check_index(path)

  @staticmethod
  def _files_of_dir(path: str) -> list[str]:
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = sorted(set(weight_map.values()))
      missing = [n for n in files if not os.path.exists(os.path.join(path, n))]
      if missing:
        raise FileNotFoundError(f"{INDEX_FILE} in {path} names shards that are missing: {missing}; download them.")
      return [os.path.join(path, n) for n in files]
    if os.path.exists(os.path.join(path, SINGLE_FILE)):
      return [os.path.join(path, SINGLE_FILE)]
    found = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if len(found) == 1:
      return [os.path.join(path, found[0])]
    if not found:
      raise FileNotFoundError(f"no *.safetensors file in {path}; point at an HF checkpoint directory.")
    raise FileNotFoundError(f"{path} holds {len(found)} safetensors files but no {INDEX_FILE}; add the index "
                            "that lists which file holds which tensor.")

  def _check_index(self, path: str):
    """The index and the shards' headers must agree, or some tensor would silently come from the wrong file."""
    index = os.path.join(path, INDEX_FILE) if os.path.isdir(path) else None
    if not index or not os.path.exists(index):
      return
    with open(index) as f:
      weight_map: Mapping[str, str] = json.load(f)["weight_map"]
    wrong = [k for k, v in weight_map.items()
             if k not in self._infos or os.path.basename(self._infos[k].file) != v]
    extra = sorted(set(self._infos) - set(weight_map))
    if wrong or extra:
      raise ValueError(f"{INDEX_FILE} in {path} disagrees with the shards: listed but not found there "
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
    return np.memmap(info.file, dtype=info.dtype, mode="r", offset=info.offset, shape=info.shape)


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
      raise ValueError(f"quantization_config.quant_method={method!r} is not FP8; read it with "
                       f"safetensors_io.quantization_from_hf_config, which knows {QUANT_METHODS.names()}.")
    return cls.from_quantization_config(q)

  @classmethod
  def from_quantization_config(cls, q: Mapping[str, Any]) -> Fp8BlockQuant:
    """Parses a `quantization_config` with quant_method 'fp8'."""
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
      raise ValueError(f"quantization_config.fmt={fmt!r} is not supported; only 'e4m3' FP8 weights are.")
    block = q.get("weight_block_size") or (128, 128)
    if len(block) != 2 or min(block) <= 0:
      raise ValueError(f"quantization_config.weight_block_size={block} must be two positive ints [b_out, b_in].")
    return cls(block_size=(int(block[0]), int(block[1])))

  def describe(self) -> str:
    return f"FP8 e4m3, blocks {list(self.block_size)}"


QUANT_METHODS.register("fp8")(Fp8BlockQuant.from_quantization_config)
QUANT_METHODS.register(int4_pack.QUANT_METHOD)(int4_pack.PackQuantizedInt4.from_quantization_config)

Quantization = Fp8BlockQuant | int4_pack.PackQuantizedInt4


def find_quantization_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any] | None:
  """`quantization_config` of config.json: at the top level or in `text_config` (Kimi K2.5 may write both)."""
  top = hf_config.get("quantization_config")
  text = (hf_config.get("text_config") or {}).get("quantization_config")
  if top and text and top != text:
    parse = [QUANT_METHODS.get(q.get("quant_method")) for q in (top, text)]
    if parse[0] != parse[1] or parse[0](top) != parse[1](text):
      raise ValueError("config.json has one quantization_config at the top level and a different one in "
                       "text_config; keep the one that describes the stored weights.")
  return top or text or None


def quantization_from_hf_config(hf_config: Mapping[str, Any]) -> Quantization | None:
  """The quantization scheme of an HF `config.json` dict (`QUANT_METHODS`), or None when it is unquantized."""
  q = find_quantization_config(hf_config)
  if q is None:
    return None
  method = q.get("quant_method")
  if method not in QUANT_METHODS:
    raise ValueError(f"quantization_config.quant_method={method!r} is not supported; c2jax reads unquantized "
                     f"checkpoints and {', '.join(QUANT_METHODS.names())}, so dequantize the checkpoint first.")
  return QUANT_METHODS.get(method)(q)


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
      raise ValueError(f"{packed} is INT4 pack-quantized but config.json has no compressed-tensors "
                       "quantization_config; add the release's quantization_config (quant_method "
                       "'compressed-tensors', format 'pack-quantized').")
    if name in names:
      raise ValueError(f"{name} and {packed} both exist; the checkpoint is inconsistent, so keep only one of them.")
    missing = [n for n in (scale, shape) if n not in names]
    if missing:
      raise ValueError(f"{packed} has no {' and no '.join(missing)}; the INT4 checkpoint is incomplete, so "
                       "re-download the shard that should hold it.")
    if self.reader.info(packed).dtype != np.dtype("<i4"):
      raise ValueError(f"{packed} is {self.reader.info(packed).dtype}, not int32; it is not pack-quantized INT4.")
    info = self.reader.info(shape)
    value = np.fromfile(info.file, info.dtype, math.prod(info.shape), offset=info.offset)
    if info.dtype.kind not in "iu" or value.shape != (2,) or min(value) <= 0:
      raise ValueError(f"{shape} holds {value.tolist()} ({info.dtype}), not the two positive ints (out, in) of the "
                       "weight; the checkpoint is corrupt.")
    out_in = (int(value[0]), int(value[1]))
    want = int4_pack.packed_shape(out_in)
    if self.reader.info(packed).shape != want:
      raise ValueError(f"{packed} is {list(self.reader.info(packed).shape)} but {shape} says {list(out_in)}, which "
                       f"needs {list(want)} (eight 4-bit values per int32); the checkpoint is inconsistent.")
    gs = self.quant.group_size
    want = int4_pack.scale_shape(out_in, gs)
    if out_in[1] % gs or self.reader.info(scale).shape != want:
      raise ValueError(f"{scale} is {list(self.reader.info(scale).shape)} but {shape} {list(out_in)} with "
                       f"quantization_config's group_size {gs} needs {list(want)} (and in divisible by {gs}); fix "
                       "group_size or the checkpoint.")
    if self.reader.info(scale).dtype.kind != "f" and self.reader.info(scale).dtype != SAFETENSORS_DTYPES["BF16"]:
      raise ValueError(f"{scale} is {self.reader.info(scale).dtype}, not a float; the checkpoint is corrupt.")
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

  def get(self, name: str) -> np.ndarray:
    """Tensor `name`: a read-only file-backed view, or a float32 array when it was quantized (FP8 or INT4)."""
    if name in self._int4:
      return int4_pack.dequantize(self.reader.get(name + int4_pack.PACKED_SUFFIX),
                                  self.reader.get(name + int4_pack.SCALE_SUFFIX), self._int4[name],
                                  self.quant.group_size, name)
    w = self.reader.get(name)
    scale_name = name + SCALE_SUFFIX
    if w.dtype not in _FP8_DTYPES:
      if scale_name in self._scales:
        raise ValueError(f"{scale_name} exists but {name} is {w.dtype}, not FP8; the checkpoint is inconsistent.")
      return w
    if self.quant is None:
      raise ValueError(f"{name} is {w.dtype} but config.json has no quantization_config; add "
                       '{"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]} (or the real '
                       "block size) to config.json.")
    if not isinstance(self.quant, Fp8BlockQuant):
      raise ValueError(f"{name} is {w.dtype} but config.json's quantization_config is {self.quant.describe()}, "
                       "not FP8; the checkpoint mixes schemes that c2jax does not read together.")
    if w.dtype != np.dtype(ml_dtypes.float8_e4m3fn):
      raise ValueError(f"{name} is {w.dtype}; only float8_e4m3fn block-quantized weights are supported.")
    if scale_name not in self._scales:
      raise ValueError(f"{name} is FP8 but its scale {scale_name} is missing; the checkpoint is incomplete.")
    return dequantize_fp8_blocks(w, self.reader.get(scale_name), self.quant.block_size, name)
