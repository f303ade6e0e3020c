"""c2jax model checkpoints: an orbax checkpoint of the param pytree plus the architecture as JSON.

A checkpoint directory holds

  model_config.json   `config_to_json_dict(cfg)`: everything needed to rebuild the param layout and run the model.
  params/             an orbax PyTree checkpoint of the params (layout of `c2jax.model.params`), restorable by
                      plain orbax: `ocp.StandardCheckpointer().restore(dir + "/params", abstract_params(cfg))`.

`save_checkpoint` / `load_checkpoint` handle in-memory params (any sharding; `load_checkpoint` restores straight
into the requested shardings, so a large model is never assembled on one host).

`StreamingCheckpointWriter` builds the same kind of checkpoint from pieces far smaller than a leaf, for converters
of models that do not fit in host memory (the 1T-parameter Kimi K2.5: one stacked expert leaf is ~0.7 TB in bf16):

  1. orbax saves a skeleton: the full pytree with one-element placeholder arrays, without OCDBT, so that orbax
     writes its own metadata (`_METADATA`, `_CHECKPOINT_METADATA`, commit marker) and one zarr array per leaf
     at `params/<key.key...>`.
  2. each placeholder array is re-created in place with tensorstore at its real shape and dtype, keeping orbax's
     zarr metadata (codec, fill value) and choosing chunks = the pieces the converter writes ([1, ...] per layer,
     [1, 1, ...] per layer and expert; larger pieces such as the embedding split to <= 64 MiB chunks), so no
     write ever reads back or merges a chunk.
  3. the converter writes pieces with `write(path, index, value)`; tensorstore encodes them into chunk files in
     the background, with at most `_MAX_PENDING_BYTES` (128 MiB) of data in flight.
  4. `close` checks that every piece of every leaf was written, then renames the directory into place and
     writes `model_config.json` last: a crashed conversion leaves no loadable, partially filled checkpoint.

Orbax reads array shapes from the zarr metadata at restore time (the skeleton's placeholders are recorded as
`np.ndarray` leaves, whose tree metadata stores no shape), so the result restores with plain orbax, both as host
arrays and, with a target, straight into device shardings; `load_checkpoint` also checks every leaf's shape.
Why not the alternatives: orbax's own save needs each leaf whole in memory (a stacked expert leaf of Kimi K2.5 is
~0.7 TB), and saving each stacked leaf separately (orbax partial save) still needs one whole leaf at a time.

Peak host memory of a conversion: the HF tensor being converted (file-backed pages of its memory map, evictable)
plus its converted copy when a transpose or cast is needed, plus <= 128 MiB in flight: about two of the largest
HF tensor. Measured on a 0.95 GB float32 checkpoint whose largest tensor is 125 MiB: peak RSS 0.59 GB, of which
0.19 GB is the process after imports.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import shutil
from typing import Any, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from c2jax.input_errors import ExistingOutput, MismatchedInput, MissingInput
from c2jax.model.config import ModelConfig, config_from_json_dict, config_to_json_dict
from c2jax.model.params import Params, ParamSpec, abstract_params, param_specs

CONFIG_FILE = "model_config.json"
PARAMS_DIR = "params"
_INCOMPLETE_SUFFIX = ".incomplete"

# Leading axes that a streaming writer fills one index at a time (one HF tensor per layer / per expert).
_PIECE_AXES = ("layers", "mtp_layers", "expert")
_MAX_CHUNK_BYTES = 64 * 1024 * 1024
_MAX_PENDING_BYTES = 128 * 1024 * 1024  # data handed to tensorstore and not yet committed


def _flat(tree: Any, is_leaf=None) -> dict[tuple[str, ...], Any]:
  """{('moe_layers', 'attn', 'q_b'): leaf, ...} of a nested dict."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
  return {tuple(k.key for k in path): leaf for path, leaf in flat}


def _name(path: tuple[str, ...]) -> str:
  return "/".join(path)


def _write_config(directory: str, cfg: ModelConfig):
  tmp = os.path.join(directory, CONFIG_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(config_to_json_dict(cfg), f, indent=2, sort_keys=True)
  os.replace(tmp, os.path.join(directory, CONFIG_FILE))


# Where c2jax model checkpoints come from, for the error that a path is not one.
_WHERE_FROM = ("a pretraining run's <workdir>/models/<phase>, an RL run's <workdir>/model, or tools/convert_hf.py's "
               "--out_dir")


def read_config(directory: str) -> ModelConfig:
  """The `ModelConfig` of checkpoint `directory` (from its `model_config.json`).

  Raises:
    MissingInput (a FileNotFoundError): `directory` does not exist, or holds no model_config.json.
  """
  if not os.path.isdir(directory):
    raise MissingInput(f"{directory} does not exist; a c2jax model checkpoint is a directory: {_WHERE_FROM}.")
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.exists(path):
    raise MissingInput(f"{directory} is not a c2jax checkpoint: {CONFIG_FILE} is missing (an unfinished "
                       "conversion writes it last); convert with tools/convert_hf.py or save_checkpoint.")
  with open(path) as f:
    return config_from_json_dict(json.load(f))


def _check_params_match(params: Params, cfg: ModelConfig):
  want = {k: v.shape for k, v in _flat(abstract_params(cfg)).items()}
  got = {k: tuple(np.shape(v)) for k, v in _flat(params).items()}
  problems = [f"missing {_name(k)}" for k in sorted(set(want) - set(got))]
  problems += [f"unexpected {_name(k)}" for k in sorted(set(got) - set(want))]
  problems += [f"{_name(k)} has shape {got[k]}, config needs {want[k]}" for k in sorted(set(want) & set(got))
               if got[k] != want[k]]
  if problems:
    raise ValueError(f"params do not match the config: {'; '.join(problems[:20])}. Pass the config the params "
                     "were built for.")


def check_new_checkpoint(directory: str, what: str = "") -> None:
  """Raises ExistingOutput (a FileExistsError) when `directory` already holds a checkpoint, finished or not: a new
  one is never written over it. `what` names the flag or field that named it, for the error."""
  if os.path.exists(os.path.join(directory, PARAMS_DIR)) or os.path.exists(os.path.join(directory, CONFIG_FILE)):
    raise ExistingOutput(f"{what + '=' if what else ''}{directory} already holds a checkpoint; choose a new directory "
                         "or delete it first.")


def save_checkpoint(directory: str, params: Params, cfg: ModelConfig) -> None:
  """Saves params (jax or numpy arrays, any sharding) and cfg as a c2jax checkpoint in a new `directory`.

  Args:
    directory: where to write; must not hold a checkpoint already (nothing is overwritten).
    params: the param pytree, in the layout `param_specs(cfg)` describes.
    cfg: the architecture.
  """
  _check_params_match(params, cfg)
  directory = os.path.abspath(directory)
  check_new_checkpoint(directory)
  os.makedirs(directory, exist_ok=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.join(directory, PARAMS_DIR), params)
    ckptr.wait_until_finished()
  _write_config(directory, cfg)


def load_checkpoint(directory: str, *, shardings: Any = None,
                    dtype: str | None = None) -> tuple[Params, ModelConfig]:
  """Restores a c2jax checkpoint.

  Args:
    directory: a checkpoint directory (from `save_checkpoint` or a converter).
    shardings: where to put the params: a pytree of `jax.sharding.Sharding` shaped like the params, or one
      `Sharding` for every leaf; default: the first local device. Each host reads only its shards.
    dtype: "float32" or "bfloat16" to cast the params on restore (the float32 router keeps float32); None keeps
      the stored dtype. The returned config's `param_dtype` says which.
  Returns:
    (params, cfg).
  """
  cfg = read_config(directory)
  if dtype is not None:
    cfg = cfg.replace(param_dtype=jnp.dtype(dtype).name)
  path = os.path.join(os.path.abspath(directory), PARAMS_DIR)
  if not os.path.isdir(path):
    raise MissingInput(f"{path} is missing: {directory} holds no finished params checkpoint.")
  abstract = abstract_params(cfg)
  if shardings is None:
    shardings = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, abstract)
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
  with ocp.StandardCheckpointer() as ckptr:
    stored = _flat(ckptr.metadata(path).item_metadata.tree)
    want = _flat(target)
    problems = [f"missing {_name(k)}" for k in sorted(set(want) - set(stored))]
    problems += [f"unexpected {_name(k)}" for k in sorted(set(stored) - set(want))]
    problems += [f"{_name(k)} is stored as {tuple(stored[k].shape)}, {CONFIG_FILE} implies {want[k].shape}"
                 for k in sorted(set(want) & set(stored)) if tuple(stored[k].shape) != want[k].shape]
    if problems:
      raise ValueError(f"{directory}: params and {CONFIG_FILE} disagree: {'; '.join(problems[:20])}. The "
                       "checkpoint is damaged or its config was edited; re-convert it.")
    params = ckptr.restore(path, target)
  return params, cfg


def load_checkpoint_for(directory: str, model: ModelConfig, *, what: str, free: tuple[str, ...] = ("param_dtype",),
                        shardings: Any = None) -> Params:
  """`load_checkpoint`'s params for a run of `model` (casting to its param dtype), refusing another architecture.

  Args:
    directory: the checkpoint.
    model: the run's architecture.
    what: the run-config field that named `directory` (for the error), e.g. "init_checkpoint".
    free: ModelConfig fields that may differ (e.g. "rope", which each pretraining phase sets).
    shardings: as `load_checkpoint`'s.
  Raises:
    MissingInput: `directory` is not a finished checkpoint (`check_checkpoint`).
    MismatchedInput (a ValueError) naming the fields that differ.
  """
  check_checkpoint(directory, what, model, free)
  params, _ = load_checkpoint(directory, shardings=shardings, dtype=model.param_dtype)
  return params


def check_checkpoint(directory: str, what: str, model: ModelConfig | None = None,
                     free: tuple[str, ...] = ("param_dtype",)) -> ModelConfig:
  """The architecture of the finished checkpoint `directory`, read without its params: what a run checks of the
  checkpoints its config names before it starts anything expensive.

  Args:
    directory: the checkpoint.
    what: the run-config field (or flag) that named `directory`, for the error, e.g. "init_checkpoint".
    model: the run's architecture, when the checkpoint must hold it; None: any.
    free: ModelConfig fields that may differ from `model`'s.
  Raises:
    MissingInput: `directory` does not exist, or is not a finished checkpoint (no model_config.json, no params/).
    MismatchedInput (a ValueError): it holds another architecture than `model`, naming the fields that differ.
  """
  try:
    stored = read_config(directory)
  except MissingInput as e:
    raise MissingInput(f"{what}: {e}") from None
  if not os.path.isdir(os.path.join(directory, PARAMS_DIR)):
    raise MissingInput(f"{what}: {directory} holds no finished params checkpoint ({PARAMS_DIR}/ is missing).")
  if model is None:
    return stored
  same = {f: getattr(model, f) for f in free}
  differ = [f.name for f in dataclasses.fields(model)
            if getattr(stored.replace(**same), f.name) != getattr(model, f.name)]
  if differ:
    raise MismatchedInput(f"{what}={directory!r} holds another architecture than the run's model: "
                          f"{', '.join(f'{f}={getattr(stored, f)!r} (the run: {getattr(model, f)!r})' for f in differ)}"
                          "; compare its model_config.json with model / model_overrides.")
  return stored


def _piece_dims(spec: ParamSpec) -> int:
  """How many leading axes a streaming writer indexes (layer, then expert), from the logical axis names."""
  k = 0
  while k < len(spec.axes) and spec.axes[k] in _PIECE_AXES:
    k += 1
  return k


def _chunk_shape(shape: tuple[int, ...], piece_dims: int, itemsize: int) -> list[int]:
  """One chunk per piece, halving the largest remaining axis until a chunk fits `_MAX_CHUNK_BYTES`."""
  chunk = [1] * piece_dims + list(shape[piece_dims:])
  while math.prod(chunk) * itemsize > _MAX_CHUNK_BYTES and max(chunk[piece_dims:], default=1) > 1:
    i = piece_dims + int(np.argmax(chunk[piece_dims:]))
    chunk[i] = -(-chunk[i] // 2)
  return [max(c, 1) for c in chunk]


class StreamingCheckpointWriter:
  """Writes a c2jax checkpoint piece by piece (one layer's or one expert's slice of a leaf at a time).

  See the module docstring for how the result stays a plain orbax checkpoint, and for the peak memory.

  Usage:
    with StreamingCheckpointWriter(out_dir, cfg) as w:
      w.write(("moe_layers", "moe", "experts", "up"), (layer, expert), up_matrix_d_by_f)
      ...
    # on leaving without an exception, every piece must have been written; then the checkpoint appears.
  """

  def __init__(self, directory: str, cfg: ModelConfig):
    self.directory = os.path.abspath(directory)
    self.cfg = cfg
    check_new_checkpoint(self.directory)
    os.makedirs(self.directory, exist_ok=True)
    self._tmp = os.path.join(self.directory, PARAMS_DIR + _INCOMPLETE_SUFFIX)
    if os.path.exists(self._tmp):  # left by a crashed conversion into this directory: it was never loadable.
      shutil.rmtree(self._tmp)
    self._specs = _flat(param_specs(cfg), is_leaf=lambda x: isinstance(x, ParamSpec))
    self._abstract = _flat(abstract_params(cfg))
    self._pending: collections.deque = collections.deque()  # (commit future, bytes) of writes in flight
    self._pending_bytes = 0
    self._save_skeleton()
    self._stores: dict[tuple[str, ...], ts.TensorStore] = {}
    self._chunks: dict[tuple[str, ...], list[int]] = {}
    self._written: dict[tuple[str, ...], np.ndarray] = {}
    for path, a in self._abstract.items():
      k = _piece_dims(self._specs[path])
      self._chunks[path] = _chunk_shape(a.shape, k, np.dtype(a.dtype).itemsize)
      self._stores[path] = self._recreate(path, a.shape, self._chunks[path])
      self._written[path] = np.zeros(a.shape[:k], bool)
    self._closed = False

  def _save_skeleton(self):
    placeholders = jax.tree.map(lambda a: np.zeros((1,) * len(a.shape), a.dtype), abstract_params(self.cfg))
    # Without OCDBT every leaf is its own zarr array in its own directory, which step 2 can re-create.
    verbosity = logging.get_verbosity()
    logging.set_verbosity(logging.ERROR)  # orbax warns that there is no OCDBT data to merge: true and intended.
    try:
      with ocp.StandardCheckpointer(use_ocdbt=False) as ckptr:
        ckptr.save(self._tmp, placeholders)
        ckptr.wait_until_finished()
    finally:
      logging.set_verbosity(verbosity)

  def _recreate(self, path: tuple[str, ...], shape: tuple[int, ...], chunks: list[int]):
    array_dir = os.path.join(self._tmp, ".".join(path))
    meta_file = os.path.join(array_dir, ".zarray")
    if not os.path.exists(meta_file):
      raise RuntimeError(f"orbax did not write leaf {_name(path)} at {array_dir}: this orbax version lays out "
                         "non-OCDBT checkpoints differently; update StreamingCheckpointWriter._recreate.")
    with open(meta_file) as f:
      meta = json.load(f)
    if meta.get("shape") != [1] * len(shape):
      raise RuntimeError(f"{meta_file} is not the placeholder this writer saved (shape {meta.get('shape')}).")
    meta.update(shape=list(shape), chunks=chunks)
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": array_dir}, "metadata": meta}
    return ts.open(spec, create=True, delete_existing=True).result()

  def leaf_shape(self, path: Sequence[str]) -> tuple[int, ...]:
    """The full (stacked) shape of leaf `path`."""
    return tuple(self._abstract[tuple(path)].shape)

  def write(self, path: Sequence[str], index: Sequence[int], value: np.ndarray) -> None:
    """Writes value into leaf `path` at the leading `index` (one int per layer / expert axis of the leaf).

    Args:
      path: key path of the leaf, e.g. ("moe_layers", "moe", "experts", "up").
      index: e.g. (layer, expert) for a stacked expert leaf, (layer,) for a stacked leaf, () for `embed`.
      value: the piece, shaped like the leaf without its indexed axes; cast to the leaf's dtype.
    """
    path, index = tuple(path), tuple(int(i) for i in index)
    if path not in self._stores:
      raise KeyError(f"{_name(path)} is not a param of this config; known: {sorted(map(_name, self._stores))}.")
    written = self._written[path]
    full = self._abstract[path]
    if len(index) != written.ndim or any(not 0 <= i < n for i, n in zip(index, written.shape)):
      raise IndexError(f"{_name(path)} is written in pieces indexed by {written.ndim} ints in "
                       f"{list(written.shape)}; got index {list(index)}.")
    if tuple(value.shape) != tuple(full.shape[len(index):]):
      raise ValueError(f"{_name(path)}{list(index)}: piece has shape {tuple(value.shape)}, the layout needs "
                       f"{tuple(full.shape[len(index):])}.")
    if written[index]:
      raise ValueError(f"{_name(path)}{list(index)} was written twice; the source has duplicate tensors.")
    data = np.ascontiguousarray(value, dtype=full.dtype)
    target = self._stores[path][index]
    # A piece larger than a chunk (e.g. a 2 GB embedding) goes in chunk-aligned slabs, so that tensorstore's copy
    # of the data in flight stays bounded by _MAX_PENDING_BYTES rather than by the piece size.
    chunk = self._chunks[path][len(index):]
    axis = next((a for a, (c, n) in enumerate(zip(chunk, data.shape)) if c < n), None)
    if axis is None:
      self._submit(target, data)
    else:
      for start in range(0, data.shape[axis], chunk[axis]):
        sl = (slice(None),) * axis + (slice(start, start + chunk[axis]),)
        self._submit(target[sl], data[sl])
    written[index] = True

  def _submit(self, target: ts.TensorStore, data: np.ndarray):
    while self._pending and self._pending_bytes + data.nbytes > _MAX_PENDING_BYTES:
      self._wait_oldest()
    self._pending.append((target.write(data).commit, data.nbytes))
    self._pending_bytes += data.nbytes

  def _wait_oldest(self):
    future, nbytes = self._pending.popleft()
    self._pending_bytes -= nbytes
    future.result()

  def missing(self) -> list[str]:
    """Pieces not written yet, as 'leaf[index]' strings."""
    out = []
    for path, w in self._written.items():
      out += [_name(path) + (str([int(x) for x in i]) if w.ndim else "") for i in np.argwhere(~w)]
    return out

  def close(self) -> None:
    """Waits for all writes, checks completeness, and moves the checkpoint into place (config last)."""
    if self._closed:
      return
    while self._pending:
      self._wait_oldest()
    missing = self.missing()
    if missing:
      raise ValueError(f"{len(missing)} param pieces were never written, e.g. {missing[:10]}; the checkpoint is "
                       f"left unfinished at {self._tmp}.")
    os.rename(self._tmp, os.path.join(self.directory, PARAMS_DIR))
    _write_config(self.directory, self.cfg)
    self._closed = True

  def __enter__(self) -> StreamingCheckpointWriter:
    return self

  def __exit__(self, exc_type, exc, tb):
    if exc_type is None:
      self.close()
    else:  # let the in-flight writes finish so the error is the one the caller sees.
      for f, _ in self._pending:
        try:
          f.result()
        except Exception:  # noqa: BLE001
          pass
      self._pending.clear()
      self._pending_bytes = 0
