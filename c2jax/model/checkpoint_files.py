"""Opening the files of an HF checkpoint directory, which is untrusted input (a download, someone's upload).

Every file of a checkpoint (config.json, the shard index, the shards) is opened as a regular file only: a FIFO would
block `open` forever and a device such as /dev/zero never ends, so anything else is refused before it is read. The
file is opened non-blocking and checked again on the open descriptor, so swapping the name for a FIFO between the
check and the open is refused too.

A name that comes from inside the checkpoint (a shard named by `model.safetensors.index.json`) must be a plain file
name in the directory (no '/', no '..', not absolute), and the file it resolves to (symlinks followed) must lie inside
the directory, or inside the same repository's `blobs/` of the Hugging Face hub cache, the one layout whose
symlinks leave the directory (`<repo>/snapshots/<revision>/<file>` -> `../../blobs/<hash>`).

JSON files are parsed strictly: NaN and Infinity (which Python's json accepts and JSON does not) are refused, as
is a document that is not an object.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, BinaryIO

from c2jax.input_errors import MissingInput


class CheckpointFormatError(ValueError):
  """A checkpoint file that breaks its format or the checkpoint's layout; the message names the file and the field."""


def open_regular(path: str, what: str) -> BinaryIO:
  """`path` opened for binary reading, refused unless it is a regular file (symlinks followed).

  Args:
    path: the file.
    what: what the file is, for messages ("config.json", "safetensors shard").
  Returns:
    a binary file object, blocking as usual.
  Raises:
    FileNotFoundError when nothing is there; CheckpointFormatError for a FIFO, socket, device or directory.
  """
  try:
    before = os.stat(path)  # before opening: opening some devices has effects
  except FileNotFoundError:
    raise MissingInput(f"{path} ({what}) does not exist; download the complete checkpoint.") from None
  except OSError as e:
    raise CheckpointFormatError(f"{path} ({what}) cannot be read: {e.strerror}.") from None
  if not stat.S_ISREG(before.st_mode):
    raise CheckpointFormatError(f"{path} ({what}) is not a regular file (a FIFO, device, socket or directory), so "
                                "it is not read; replace it with the real file.")
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
  except OSError as e:
    raise CheckpointFormatError(f"{path} ({what}) cannot be opened: {e.strerror}.") from None
  if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since the stat above
    os.close(fd)
    raise CheckpointFormatError(f"{path} ({what}) is not a regular file (a FIFO, device, socket or directory), so "
                                "it is not read; replace it with the real file.")
  os.set_blocking(fd, True)
  return os.fdopen(fd, "rb")


def _refuse_constant(name: str) -> Any:
  raise ValueError(f"{name} is not JSON")


def strict_json_loads(raw: bytes) -> Any:
  """JSON from UTF-8 bytes, NaN and Infinity refused; raises ValueError or RecursionError on anything malformed."""
  return json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)


def read_json_object(path: str, what: str) -> dict[str, Any]:
  """The JSON object in the regular file `path`; refused in one sentence when it is not one.

  Args:
    path: the file.
    what: what the file is, for messages.
  Returns:
    the parsed object (a dict).
  """
  with open_regular(path, what) as f:
    raw = f.read()
  try:
    obj = strict_json_loads(raw)
  except (ValueError, RecursionError) as e:  # JSONDecodeError, bad UTF-8, NaN, over-long ints, deep nesting
    raise CheckpointFormatError(f"{path} ({what}) is not valid JSON ({str(e)[:200]}); re-download it.") from None
  if not isinstance(obj, dict):
    raise CheckpointFormatError(f"{path} ({what}) holds a JSON {type(obj).__name__}, not an object; re-download it.")
  return obj


def _within(path: str, root: str) -> bool:
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_inside(directory: str, path: str, what: str) -> str:
  """`path`, refused unless it resolves (symlinks followed) inside `directory` or its hub-cache repository's blobs.

  Args:
    directory: the checkpoint directory.
    path: a file in it.
    what: where the name came from, for messages.
  Returns:
    `path`.
  """
  real, root = os.path.realpath(path), os.path.realpath(directory)
  if _within(real, root):
    return path
  snapshots = os.path.dirname(root)
  if os.path.basename(snapshots) == "snapshots" and _within(real, os.path.join(os.path.dirname(snapshots), "blobs")):
    return path
  raise CheckpointFormatError(f"{path} ({what}) resolves to {real}, outside the checkpoint directory {directory}; "
                              "a checkpoint reads only its own files, so copy the file into the directory.")


def shard_path(directory: str, name: Any, where: str) -> str:
  """The path of the shard `name` that `where` (e.g. the index's weight_map) names, checked as the module says.

  Args:
    directory: the checkpoint directory.
    name: the shard's name as written in the checkpoint.
    where: the file and field that name it, for messages.
  Returns:
    the shard's path in `directory` (not yet opened: `open_regular` refuses what is not a regular file).
  """
  if (not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
      or os.path.basename(name) != name):
    raise CheckpointFormatError(f"{where} names the shard {name!r}, which is not a plain file name inside "
                                f"{directory}; a shard must sit in the checkpoint directory itself.")
  return check_inside(directory, os.path.join(directory, name), where)
