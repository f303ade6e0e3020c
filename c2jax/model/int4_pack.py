"""INT4 weights in compressed-tensors' `pack-quantized` format (Kimi K2 Thinking / K2.5 routed experts).

The releases (Composer 2 report section 2: the base model is Kimi K2.5) store their routed experts as symmetric
INT4 with one scale per group of 32 input columns, in the format of the `compressed-tensors` library, described
by `config.json`'s `quantization_config` (at the top level and/or in `text_config`):

  {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
   "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
                                 "weights": {"num_bits": 4, "type": "int", "symmetric": true,
                                             "strategy": "group", "group_size": 32, ...}}},
   "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"]}

Tensors of one quantized Linear `X` whose weight is [out, in] (`in` a multiple of group_size):

  X.weight_packed  int32 [out, ceil(in / 8)]
  X.weight_scale   float (BF16 in the releases) [out, in / group_size]
  X.weight_shape   int [2] = (out, in)

Bit layout. The integer q[i, j] in [-8, 7] is stored as the unsigned nibble u = q + 8 in [0, 15] at bits
4 * (j % 8) ... 4 * (j % 8) + 3 of the int32 word weight_packed[i, j // 8]: column 8k sits in the least
significant nibble, column 8k + 7 in the most significant one. Words are little-endian like every safetensors
tensor, so byte b of a row's bytes holds column 2b in its low nibble and column 2b + 1 in its high nibble. When
`in` is not a multiple of 8 the last word of a row is padded with zero nibbles, which are not part of the weight.

Value. w[i, j] = q[i, j] * weight_scale[i, j // group_size]. A 4-bit integer times a BF16 (8 significant bits)
or FP16 (11) scale has at most 15 significant bits, so `dequantize` computes it exactly in float32.
compressed-tensors computes the product in the scale's dtype: for a BF16 scale it rounds the exact product to
the nearest BF16 (ties to even), i.e. its result is `dequantize(...)` cast to BF16, bit for bit; for a float32
scale both round the same float32 product.

Which Linears are quantized follows compressed-tensors' own matching (`compressed_tensors.utils.match` and
`quantization.lifecycle.apply`): a module is quantized when it is a Linear or an Embedding, some config group's
target matches it and no `ignore` entry matches it. An entry matches a module when it equals the module's name, or
is "re:<pattern>" with `re.match(pattern, name)` (anchored at the start only), or is the name of one of the
module's classes ("Linear" matches every torch.nn.Linear). Names are the checkpoint's module names (a tensor name
without its last component).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, NoReturn, Sequence

import numpy as np

from c2jax.model.checkpoint_files import CheckpointFormatError

QUANT_METHOD = "compressed-tensors"
FORMAT = "pack-quantized"
NUM_BITS = 4
VALUES_PER_WORD = 32 // NUM_BITS  # eight nibbles per int32
OFFSET = 1 << (NUM_BITS - 1)  # stored nibble = q + 8

PACKED_SUFFIX = "_packed"  # `X.weight_packed` holds the nibbles of `X.weight`
SCALE_SUFFIX = "_scale"  # `X.weight_scale`
SHAPE_SUFFIX = "_shape"  # `X.weight_shape`

# Module classes compressed-tensors attaches a weight scheme to (`apply_quantization_config`).
QUANTIZABLE_CLASSES = ("Linear", "Embedding")


def packed_shape(shape: Sequence[int]) -> tuple[int, int]:
  """[out, ceil(in / 8)]: the int32 words of a weight [out, in]."""
  out, inp = shape
  return (int(out), -(-int(inp) // VALUES_PER_WORD))


def scale_shape(shape: Sequence[int], group_size: int) -> tuple[int, int]:
  """[out, in / group_size]: the scales of a weight [out, in]."""
  out, inp = shape
  return (int(out), int(inp) // group_size)


def unpack(packed: np.ndarray, shape: Sequence[int]) -> np.ndarray:
  """The signed integers q [out, in] (int8, in [-8, 7]) of `packed` [out, ceil(in / 8)] int32 (module docstring).

  Memory: ~3 bytes per weight element (the int8 result and its unsigned nibbles).
  """
  out, inp = (int(s) for s in shape)
  if tuple(packed.shape) != packed_shape(shape):
    raise ValueError(f"packed INT4 weight has shape {list(packed.shape)}, but weight_shape {[out, inp]} needs "
                     f"{list(packed_shape(shape))} (eight 4-bit values per int32).")
  # Little-endian bytes whatever the host's byte order: byte b of a row holds columns 2b (low) and 2b + 1 (high).
  raw = np.ascontiguousarray(packed, dtype="<i4").view(np.uint8).reshape(out, -1)
  nibbles = np.empty((out, raw.shape[1], 2), np.uint8)
  np.bitwise_and(raw, 0x0F, out=nibbles[..., 0])
  np.right_shift(raw, 4, out=nibbles[..., 1])
  q = nibbles.reshape(out, -1)[:, :inp].view(np.int8)
  return q - np.int8(OFFSET)


def dequantize(packed: np.ndarray, scale: np.ndarray, shape: Sequence[int], group_size: int,
               name: str = "weight") -> np.ndarray:
  """The float32 weight [out, in] = q * scale, exact (module docstring).

  Args:
    packed: [out, ceil(in / 8)] int32, `X.weight_packed`.
    scale: [out, in / group_size] float (BF16, FP16 or float32), `X.weight_scale`.
    shape: (out, in), `X.weight_shape`.
    group_size: input columns per scale.
    name: the weight's name, for error messages.
  Returns:
    [out, in] float32. Memory: this array plus ~3 bytes per element while unpacking.
  """
  out, inp = (int(s) for s in shape)
  if group_size <= 0 or inp % group_size:
    raise ValueError(f"{name}: weight_shape {[out, inp]} has {inp} input columns, not a multiple of group_size "
                     f"{group_size}; compressed-tensors groups whole columns, so fix quantization_config's "
                     "group_size or the checkpoint.")
  if tuple(scale.shape) != scale_shape(shape, group_size):
    raise ValueError(f"{name}{SCALE_SUFFIX} has shape {list(scale.shape)}, but weight_shape {[out, inp]} with "
                     f"group_size {group_size} needs {list(scale_shape(shape, group_size))}; fix "
                     "quantization_config's group_size or the scales.")
  q = unpack(packed, shape).reshape(out, inp // group_size, group_size)
  w = q.astype(np.float32)
  w *= np.asarray(scale, np.float32)[:, :, None]
  return w.reshape(out, inp)


def match_name(name: str, entry: str) -> bool:
  """compressed-tensors' `match_name`: "re:<pattern>" is `re.match` (anchored at the start), else equality."""
  if entry.startswith("re:"):
    return re.match(entry[len("re:"):], name) is not None
  return entry == name


def _matches(name: str, classes: Sequence[str], entry: str) -> bool:
  return match_name(name, entry) or entry in classes


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _refuse(what: str) -> NoReturn:
  raise CheckpointFormatError(
      f"quantization_config: {what}; c2jax reads compressed-tensors checkpoints whose quantized weights are all "
      "weight-only symmetric INT4 pack-quantized with strategy 'group' (the Kimi K2 Thinking / K2.5 releases), so "
      "dequantize this checkpoint first.")


def _malformed(field: str, value: Any, want: str) -> NoReturn:
  raise CheckpointFormatError(f"config.json's quantization_config.{field}={str(value)[:100]} is not {want}; the "
                              "config is malformed.")


def _names(value: Any, field: str) -> list[str]:
  """A targets / ignore list: null or a list of strings whose "re:" patterns compile (a bare string would be read
  as its characters)."""
  if value is None:
    return []
  if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
    _malformed(field, value, "a list of module names, class names or 're:' patterns")
  for v in value:
    if v.startswith("re:"):
      try:
        re.compile(v[len("re:"):])
      except (re.error, RecursionError, OverflowError):
        _malformed(field, v, "a valid 're:' pattern")
  return list(value)


def _group_size(gname: str, g: Any, top_format: Any) -> int:
  """The group size of config group `gname`, after checking it is weight-only symmetric INT4 pack-quantized."""
  field = f"config_groups[{gname!r}]"
  if not isinstance(g, dict):
    _malformed(field, g, "an object")
  fmt = g.get("format") or top_format
  if fmt != FORMAT:
    _refuse(f"config group {gname!r} has format {str(fmt)[:100]!r}, not {FORMAT!r}")
  if g.get("input_activations") or g.get("output_activations"):
    _refuse(f"config group {gname!r} quantizes activations, which c2jax does not emulate")
  w = g.get("weights")
  if not isinstance(w, dict):
    _malformed(f"{field}.weights", w, "an object")
  bits, kind = w.get("num_bits"), w.get("type", "int")
  if not _is_int(bits) or not isinstance(kind, str):
    _malformed(f"{field}.weights", {"num_bits": bits, "type": kind}, "an int num_bits and a string type")
  if kind != "int" or bits != NUM_BITS:
    _refuse(f"config group {gname!r} stores {kind} {bits}-bit weights, not int 4-bit")
  symmetric, dynamic = w.get("symmetric", True), w.get("dynamic", False)
  if not isinstance(symmetric, bool) or not isinstance(dynamic, (bool, str)):
    _malformed(f"{field}.weights", {"symmetric": symmetric, "dynamic": dynamic}, "a bool symmetric and dynamic")
  if not symmetric or dynamic is not False:
    _refuse(f"config group {gname!r} is asymmetric or dynamic")
  strategy, group_size = w.get("strategy"), w.get("group_size")
  if strategy != "group" or not isinstance(group_size, int) or isinstance(group_size, bool) or group_size <= 0:
    _refuse(f"config group {gname!r} has strategy {str(strategy)[:100]!r} with group_size {str(group_size)[:100]}, "
            "not 'group' with a positive int group_size")
  actorder = w.get("actorder")
  if actorder is not None and not isinstance(actorder, (bool, str)):
    _malformed(f"{field}.weights.actorder", actorder, "null, a bool or a string")
  if actorder is True or actorder == "group":  # compressed-tensors reads True as "group"
    _refuse(f"config group {gname!r} has actorder 'group' (a permuted group index per column)")
  return group_size


@dataclasses.dataclass(frozen=True)
class PackQuantizedInt4:
  """A `quant_method: compressed-tensors` config with weight-only, symmetric, group-wise INT4 pack-quantized weights.

  Attributes:
    group_size: input columns per scale (32 in the Kimi releases).
    targets: every config group's targets (module names, "re:" patterns or class names such as "Linear").
    ignore: entries (same forms) whose modules stay unquantized.
  """

  group_size: int = 32
  targets: tuple[str, ...] = ("Linear",)
  ignore: tuple[str, ...] = ()

  @classmethod
  def from_quantization_config(cls, q: Mapping[str, Any]) -> PackQuantizedInt4:
    """Parses an HF `quantization_config` with quant_method 'compressed-tensors', field by field.

    A field of the wrong type (a string where a list of names goes, a bool or float group size, an invalid "re:"
    pattern) is refused as malformed, a well-formed scheme that c2jax cannot read as unsupported; each in one
    sentence naming the field (`CheckpointFormatError`).
    """
    status = q.get("quantization_status", "compressed")
    if not isinstance(status, str):
      _malformed("quantization_status", status, "a string")
    if status != "compressed":
      _refuse(f"quantization_status={status!r} means the weights are not stored packed")
    if q.get("kv_cache_scheme"):
      _refuse("kv_cache_scheme quantizes the KV cache, which c2jax does not emulate")
    for key in ("sparsity_config", "transform_config"):
      extra = q.get(key)
      if extra and not isinstance(extra, dict):
        _malformed(key, extra, "an object")
      if extra and (key == "transform_config" or extra.get("format") not in (None, "dense")):
        _refuse(f"{key} changes the stored weights")
    groups = q.get("config_groups")
    if groups is not None and not isinstance(groups, dict):
      _malformed("config_groups", groups, "an object of config groups")
    if not groups:
      _refuse("config_groups is empty")
    targets: list[str] = []
    group_sizes = set()
    for gname, g in groups.items():
      group_sizes.add(_group_size(gname, g, q.get("format")))
      targets += _names(g.get("targets"), f"config_groups[{gname!r}].targets")
    if len(group_sizes) > 1:
      _refuse(f"config groups use different group sizes {sorted(group_sizes)}")
    return cls(group_size=group_sizes.pop(), targets=tuple(targets), ignore=tuple(_names(q.get("ignore"), "ignore")))

  def quantizes(self, module: str, classes: Sequence[str]) -> bool:
    """Whether compressed-tensors quantizes module `module` whose class and base classes are named `classes`."""
    if not any(c in QUANTIZABLE_CLASSES for c in classes):
      return False
    return (any(_matches(module, classes, t) for t in self.targets)
            and not any(_matches(module, classes, i) for i in self.ignore))

  def describe(self) -> str:
    return f"INT4 pack-quantized, group {self.group_size}"
