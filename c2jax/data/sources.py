"""Document sources for the training pipelines, described by plain dicts (from ml_collections configs):

  {"kind": "stdlib", "split": "train", "weight": 1.0, "max_files": 400, "min_bytes": 0}
  {"kind": "files", "glob": "data/**/*.md"}
  {"kind": "code_dir", "root": "~/src/project", "extensions": [".py", ".rs"]}
  {"kind": "jsonl", "path": "corpus.jsonl", "field": "text"}
  {"kind": "array_record", "paths": ["shard-00000.array_record"], "field": "text"}   # field None: utf-8 records
  {"kind": "sft", "suite": "tiny_functions", "split": "train"}     # registered by c2jax.envs.teachers.demonstrations
  {"kind": "copy", "documents": 10000, "doc_chars": 4096, "seed": 0}   # random strings each written twice

`open_source(spec)` returns a grain `MapDataset` of documents (random access, so the pipeline can shard and
shuffle by index). A document is a `str`, or a tuple of (text, loss weight) parts for chat data (SFT: the prompt
weighs 0, the assistant turn 1). "weight" (the mixing weight) is the pipeline's; every other key is an argument of
the kind's function, so a misspelt key fails with one sentence instead of being ignored. `min_bytes` (every
built-in kind) drops documents shorter than that many UTF-8 bytes: a long-context phase wants long documents.

Kinds live in the `SOURCES` registry; a new kind is one decorated function returning a MapDataset:

  @SOURCES.register("parquet")
  def parquet(path: str, column: str = "text", min_bytes: int = 0) -> grain.MapDataset: ...
"""

from __future__ import annotations

import dataclasses
import glob as glob_lib
import inspect
import json
import os
from typing import Any, Callable, Mapping, Sequence

import functools

import grain
import numpy as np

from c2jax.data import copy_stream
from c2jax.data import stdlib_corpus
from c2jax.input_errors import MissingInput
from c2jax.registry import Registry

Parts = tuple[tuple[str, float], ...]


@dataclasses.dataclass(frozen=True)
class TokenDocument:
  """A document already in token ids, with the loss weight of each (a recorded agent episode's segment: its ledger
  as it was fed to the model, EOS tokens between turns included, which text could not carry). The pipeline adds no
  BOS or EOS.

  Attributes:
    tokens: [N] int token ids.
    weights: [N] float loss weight of predicting each token from those before it.
  """

  tokens: tuple[int, ...]
  weights: tuple[float, ...]

  def __post_init__(self):
    if len(self.tokens) != len(self.weights) or not self.tokens:
      raise ValueError(f"A token document needs as many weights as tokens (>= 1); got {len(self.tokens)} tokens and "
                       f"{len(self.weights)} weights.")


Document = str | Parts | TokenDocument

SOURCES: Registry[Callable[..., grain.MapDataset]] = Registry("data source kind")

# Keys of a source dict that belong to the pipeline, not to the kind's function.
PIPELINE_KEYS = ("kind", "weight")


def document_bytes(doc: Document) -> int:
  """UTF-8 size of a document (all parts of a chat document together; a token document's token count)."""
  if isinstance(doc, TokenDocument):
    return len(doc.tokens)
  if isinstance(doc, str):
    return len(doc.encode("utf-8", errors="replace"))
  return sum(len(text.encode("utf-8", errors="replace")) for text, _ in doc)


def as_dict(spec: Any) -> dict:
  """A plain dict of a source spec (a dict, a Mapping or an ml_collections ConfigDict)."""
  if hasattr(spec, "to_dict"):
    spec = spec.to_dict()
  if not isinstance(spec, Mapping):
    raise ValueError(f"A data source must be a dict such as {{'kind': 'stdlib', 'split': 'train'}}, got {spec!r}.")
  return dict(spec)


def describe(spec: Mapping) -> str:
  """A short name of a source for messages: kind and its location."""
  spec = as_dict(spec)
  where = next((spec[k] for k in ("path", "paths", "glob", "root", "suite", "split") if k in spec), "")
  return f"{spec.get('kind')!r}{f' ({where})' if where != '' else ''}"


def open_source(spec: Mapping) -> grain.MapDataset:
  """The documents of one source spec, in a fixed order (the pipeline shards and shuffles them).

  Raises:
    ValueError: unknown kind, unknown or missing arguments, missing files, or no documents at all; one sentence
      naming the fix.
  """
  spec = as_dict(spec)
  if "kind" not in spec:
    raise ValueError(f"Data source {spec!r} has no 'kind'; known kinds: {', '.join(SOURCES.names())}.")
  fn = SOURCES.get(spec["kind"])
  kwargs = {k: v for k, v in spec.items() if k not in PIPELINE_KEYS}
  params = inspect.signature(fn).parameters
  keys = ", ".join(("kind", "weight", *params))
  if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
    unknown = sorted(k for k in kwargs if k not in params)
    if unknown:
      raise ValueError(f"Data source {describe(spec)} has unknown key {unknown[0]!r}; its keys are {keys}.")
  try:
    inspect.signature(fn).bind(**kwargs)
  except TypeError as e:
    raise ValueError(f"Data source {describe(spec)}: {e}; its keys are {keys}.") from None
  ds = fn(**kwargs)
  if len(ds) == 0:
    filtered = f" of at least min_bytes={spec['min_bytes']}" if spec.get("min_bytes") else ""
    raise ValueError(f"Data source {describe(spec)} has no documents{filtered}; point it at data or drop it.")
  return ds


# ------------------------------------------------------------------------------------------------ files on disk


def _read_text(path: str) -> str:
  with open(path, "rb") as f:
    return f.read().decode("utf-8", errors="replace")


def _file_documents(paths: Sequence[str], min_bytes: int, max_files: int | None) -> grain.MapDataset:
  """Files as documents (read when visited), those under min_bytes dropped (by size on disk), then the first
  max_files."""
  if min_bytes:
    paths = [p for p in paths if os.path.getsize(p) >= min_bytes]
  if max_files is not None:
    paths = paths[:max_files]
  return grain.MapDataset.source(list(paths)).map(_read_text)


@SOURCES.register("stdlib")
def stdlib(split: str = "train", max_files: int | None = None, min_bytes: int = 0) -> grain.MapDataset:
  """The running Python's standard-library sources, split train / heldout by a hash of the path
  (c2jax/data/stdlib_corpus.py): a real code corpus on every machine."""
  return _file_documents([str(p) for p in stdlib_corpus.stdlib_files(split)], min_bytes, max_files)


@SOURCES.register("files")
def files(glob: str, min_bytes: int = 0, max_files: int | None = None) -> grain.MapDataset:
  """Regular files matching a glob pattern (`**` recursive), sorted by path."""
  paths = sorted(p for p in glob_lib.glob(os.path.expanduser(glob), recursive=True) if os.path.isfile(p))
  if not paths:
    raise ValueError(f"No files match glob {glob!r}; check the pattern (use ** for subdirectories).")
  return _file_documents(paths, min_bytes, max_files)


# Directories never worth reading as code.
_SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox",
                        ".mypy_cache", ".pytest_cache"})


@SOURCES.register("code_dir")
def code_dir(root: str, extensions: Sequence[str] = (".py",), min_bytes: int = 0,
             max_files: int | None = None) -> grain.MapDataset:
  """Source files under `root` whose names end with one of `extensions` (VCS, cache and virtualenv directories
  skipped, symlinks not followed), sorted by path."""
  root = os.path.expanduser(root)
  if not os.path.isdir(root):
    raise MissingInput(f"Code directory {root!r} does not exist; set 'root' to a directory of sources.")
  if isinstance(extensions, str):
    extensions = (extensions,)
  ends = tuple(extensions)
  paths = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
    paths += [os.path.join(dirpath, n) for n in filenames
              if n.endswith(ends) and os.path.isfile(os.path.join(dirpath, n))
              and not os.path.islink(os.path.join(dirpath, n))]
  return _file_documents(sorted(paths), min_bytes, max_files)


def _copy_document(i: int, *, seed: int, doc_chars: int, min_len: int, max_len: int) -> str:
  return copy_stream.copy_text(np.random.default_rng([seed, i]), doc_chars, min_len, max_len)


@SOURCES.register("copy")
def copy(documents: int = 10_000, doc_chars: int = 4096, min_len: int = 24, max_len: int = 48, seed: int = 0,
         min_bytes: int = 0) -> grain.MapDataset:
  """Synthetic copying documents (`c2jax.data.copy_stream.copy_text`: random strings each written twice), made when
  visited; document i is a function of (seed, i). Long documents (`doc_chars`, several rows' worth) make the
  pipeline's mixing weight a share of tokens. The copying probe's held-out strings come from another generator
  (`CopyStream(seed=12345)`)."""
  if documents < 1 or doc_chars < 1:
    raise ValueError(f"copy source: documents={documents} and doc_chars={doc_chars} must both be positive.")
  if doc_chars < min_bytes:
    documents = 0  # every document is doc_chars long (open_source refuses the empty source)
  make = functools.partial(_copy_document, seed=seed, doc_chars=doc_chars, min_len=min_len, max_len=max_len)
  return grain.MapDataset.range(documents).map(make)


# ------------------------------------------------------------------------------------------------ records


def _as_paths(path: str | Sequence[str], key: str) -> list[str]:
  paths = [path] if isinstance(path, (str, os.PathLike)) else list(path)
  if not paths:
    raise ValueError(f"Give at least one file in '{key}'.")
  for p in paths:
    if not os.path.isfile(p):
      raise MissingInput(f"Data file {str(p)!r} does not exist; fix '{key}'.")
  return [str(p) for p in paths]


def _field(record: Any, field: str, where: str) -> str:
  if not isinstance(record, Mapping) or field not in record:
    raise ValueError(f"{where} has no field {field!r}; set 'field' to the key that holds the text.")
  value = record[field]
  if not isinstance(value, str):
    raise ValueError(f"{where}: field {field!r} holds {type(value).__name__}, not text; set 'field' to a text key.")
  return value


def _json_lines(path: str | Sequence[str]):
  """(where, record) of each non-blank line of JSON lines files, where = "<file>:<line>"."""
  for p in _as_paths(path, "path"):
    with open(p, encoding="utf-8") as f:
      for i, line in enumerate(f, 1):
        if not line.strip():
          continue
        try:
          yield f"{p}:{i}", json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{p}:{i} is not valid JSON ({e.msg}); each line must hold one JSON object.") from None


@SOURCES.register("jsonl")
def jsonl(path: str | Sequence[str], field: str = "text", min_bytes: int = 0) -> grain.MapDataset:
  """JSON lines files (one object per line, blank lines skipped), the text in `field`; read into memory."""
  texts = []
  for where, record in _json_lines(path):
    text = _field(record, field, where)
    if len(text.encode("utf-8", errors="replace")) >= min_bytes:
      texts.append(text)
  return grain.MapDataset.source(texts)


@SOURCES.register("token_docs")
def token_docs(path: str | Sequence[str], min_bytes: int = 0) -> grain.MapDataset:
  """JSON lines of token documents, {"tokens": [ids], "weights": [loss weights]} per line (e.g. recorded agent
  episodes, `c2jax.services.teacher_traces`); `min_bytes` counts tokens here."""
  docs = []
  for where, record in _json_lines(path):
    try:
      doc = TokenDocument(tuple(int(t) for t in record["tokens"]), tuple(float(w) for w in record["weights"]))
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"{where} is not a token document ({e}); each line holds {{\"tokens\": [...], "
                       f"\"weights\": [...]}} of equal length.") from None
    if len(doc.tokens) >= min_bytes:
      docs.append(doc)
  return grain.MapDataset.source(docs)


class _ArrayRecordText:
  """Record bytes -> text: UTF-8 as is, or the `field` of a JSON object."""

  def __init__(self, field: str | None, where: str):
    self.field, self.where = field, where

  def __call__(self, record: bytes) -> str:
    text = record.decode("utf-8", errors="replace")
    if self.field is None:
      return text
    try:
      obj = json.loads(text)
    except json.JSONDecodeError:
      raise ValueError(f"A record of {self.where} is not JSON; set 'field' to None for plain-text records.") from None
    return _field(obj, self.field, f"A record of {self.where}")


_PROBE_RECORDS = 10_000


@SOURCES.register("array_record")
def array_record(paths: str | Sequence[str], field: str | None = None, min_bytes: int = 0) -> grain.MapDataset:
  """ArrayRecord files (grain's ArrayRecordDataSource, read by index): each record is UTF-8 text, or a JSON object
  whose `field` holds the text. `min_bytes` filters lazily (records are read up to the first that passes, at
  most 10,000, to refuse a source it would empty), so shards of a filtered source can differ in size."""
  paths = _as_paths(paths, "paths")
  ds = grain.MapDataset.source(grain.sources.ArrayRecordDataSource(paths)).map(
      _ArrayRecordText(field, ", ".join(paths)))
  if min_bytes:
    long_enough = lambda text: len(text.encode("utf-8", errors="replace")) >= min_bytes
    # A source that filters away everything would make the pipeline spin forever: look for one document first.
    probe = min(len(ds), _PROBE_RECORDS)
    if not any(long_enough(ds[i]) for i in range(probe)):
      where = "" if probe == len(ds) else f" among its first {probe} records"
      raise ValueError(f"No record of {', '.join(paths)}{where} reaches min_bytes={min_bytes}; lower min_bytes.")
    ds = ds.filter(long_enough)
  return ds
