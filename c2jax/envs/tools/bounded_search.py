"""search_code under a per-call budget of time and memory: the index (`code_search.CodeSearch`) is built and
queried in a child process, which is killed past the call's time and capped in address space.

  search = BoundedSearch()                                   # one per environment
  hits = search.search(files, "parse a date string", k=5, timeout_s=20.0)   # raises SearchBudgetExceeded
  search.close()                                             # its worker goes back to the process's idle pool

Why a child process. Chunking and indexing run on text the model wrote; their cost grows with the repository
(every unit is tokenized, every signature cut into character n-grams, the TF-IDF and SVD fits are over all units),
and the content picks the constant: a repository of many functions with long signature lines costs seconds per MB
in this process's interpreter, holding the GIL that the agent loop's thread needs to drive the device. In a child
the work is (1) killed at the call's deadline (`timeout_s`, which the environment cuts to the episode's remaining
tool time), (2) capped at `MEMORY_BYTES` of address space past its imports (`code_search.serve`), and (3) off the
host's interpreter. Past either budget the call raises `SearchBudgetExceeded` (the environment reports it as the
tool's error) and the child is discarded; the next call starts a fresh one. The caps in `code_search`
(`MAX_INDEX_BYTES`, `MAX_INDEX_UNITS`, `MAX_SUMMARY_CHARS`) keep an ordinary repository well inside the budget.

The child. `python -I` (no environment variables, no user site, no current directory on its path) running
`code_search.serve` from this package's file, loaded alone: the `c2jax.envs` package (which imports jax) stays
out, so a worker starts in about the time scikit-learn takes to import. Its BLAS runs on one thread. It answers one
JSON line per request; it keeps its last index, so queries on an unchanged repository do not rebuild it.

Workers. A `BoundedSearch` takes a worker at its first call and keeps it (its index) until `close`; closed ones
wait in a process-wide idle pool of at most `MAX_IDLE_WORKERS` for the next environment (its first query rebuilds,
since its repository differs). A worker's wait for its imports (`START_TIMEOUT_S`) is not charged to the call's
work budget. A worker whose parent dies reads the end of its input and exits.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from typing import Mapping

from c2jax.envs.tools import code_search
from c2jax.envs.tools.code_search import Chunk

TIMEOUT_S = 20.0  # of one call's work (transfer, chunking, index build, query); the episode's time left cuts it
MEMORY_BYTES = 1 << 30  # of address space a worker may map past its imports (the index and its build)
START_TIMEOUT_S = 60.0  # for a new worker's imports (~2 s on an idle 2-core CPU)
MAX_IDLE_WORKERS = 4

_BOOT = """import importlib.util, sys
root, path, memory = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, root)
spec = importlib.util.spec_from_file_location("c2jax_code_search_worker", path)
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
module.serve(memory)
"""


class SearchBudgetExceeded(RuntimeError):
  """A search_code call ran past its time or memory budget; the message is one sentence for the model."""


class _Worker:
  """One child process serving `code_search.serve` requests."""

  def __init__(self, memory_bytes: int):
    self.memory_bytes = memory_bytes
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(code_search.__file__)))))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    self.proc = subprocess.Popen(
        [sys.executable, "-I", "-c", _BOOT, root, os.path.abspath(code_search.__file__), str(memory_bytes)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir(),
        env=env)
    self._buffer = b""
    self._ready = False

  def alive(self) -> bool:
    return self.proc.poll() is None

  def _line(self, deadline: float) -> bytes | None:
    """The child's next output line, or None when it ended or the deadline passed first."""
    fd = self.proc.stdout.fileno()
    with selectors.DefaultSelector() as sel:
      sel.register(fd, selectors.EVENT_READ)
      while b"\n" not in self._buffer:
        left = deadline - time.monotonic()
        if left <= 0 or not sel.select(left):
          return None
        data = os.read(fd, 1 << 20)
        if not data:
          return None
        self._buffer += data
    line, self._buffer = self._buffer.split(b"\n", 1)
    return line

  def request(self, payload: dict, timeout_s: float) -> dict | None:
    """The child's answer to `payload`, or None when it ended or ran past `timeout_s` (then it is killed)."""
    if not self._ready:
      self._ready = self._line(time.monotonic() + START_TIMEOUT_S) == b"ready"
      if not self._ready:
        self.kill()
        raise RuntimeError(f"The search_code worker did not start within {START_TIMEOUT_S:g} s.")
    deadline = time.monotonic() + timeout_s
    try:
      self.proc.stdin.write(json.dumps(payload).encode() + b"\n")
      self.proc.stdin.flush()
    except (BrokenPipeError, OSError):
      self.kill()
      return None
    line = self._line(deadline)
    if line is None:
      self.kill()
      return None
    return json.loads(line)

  def kill(self) -> None:
    if self.alive():
      self.proc.kill()
    self.proc.wait()
    for f in (self.proc.stdin, self.proc.stdout):
      try:
        f.close()
      except OSError:
        pass


_IDLE: list[_Worker] = []
_IDLE_LOCK = threading.Lock()


def _take(memory_bytes: int) -> _Worker:
  """An idle worker with this memory cap, else a new one."""
  with _IDLE_LOCK:
    for worker in [w for w in _IDLE if not w.alive()]:
      _IDLE.remove(worker)
      worker.kill()
    same = [w for w in _IDLE if w.memory_bytes == memory_bytes]
    if same:
      _IDLE.remove(same[-1])
      return same[-1]
  return _Worker(memory_bytes)


def _give_back(holder: list) -> None:
  """Returns the worker in `holder` (if any) to the idle pool, or ends it when the pool is full."""
  worker = holder.pop() if holder else None
  if worker is None:
    return
  with _IDLE_LOCK:
    if worker.alive() and len(_IDLE) < MAX_IDLE_WORKERS:
      _IDLE.append(worker)
      return
  worker.kill()


class BoundedSearch:
  """The search_code tool of one environment: `code_search.CodeSearch` in a worker process, within a budget.

  Args:
    memory_bytes: the worker's address space past its imports; None: `MEMORY_BYTES`.
  """

  def __init__(self, memory_bytes: int | None = None):
    self.memory_bytes = MEMORY_BYTES if memory_bytes is None else memory_bytes
    self._holder: list[_Worker] = []  # the worker in use, held in a list so the finalizer can give it back
    self._finalizer = weakref.finalize(self, _give_back, self._holder)
    self.builds = 0  # indexes the worker built for this environment (tests watch the cache with it)

  def search(self, files: Mapping[str, str], query: str, k: int,
             timeout_s: float = TIMEOUT_S) -> list[tuple[Chunk, float]]:
    """The best `k` units of the repository `files` for `query` (see `code_search.CodeSearch.search`).

    Raises:
      ValueError: the query is empty, too long, or holds no searchable word (one sentence, for the model).
      SearchBudgetExceeded: the call ran past `timeout_s` or its memory budget (the worker is discarded).
    """
    if not query.strip():
      raise ValueError("the query is empty; describe the code to find, e.g. 'parse a date string'.")
    if not self._holder:
      self._holder.append(_take(self.memory_bytes))
    worker = self._holder[0]
    # Only what the index takes travels: at most MAX_INDEX_BYTES of text, whatever the workdir holds.
    answer = worker.request({"files": code_search.indexable(files), "query": query, "k": k}, max(timeout_s, 0.0))
    if answer is None or answer.get("memory"):
      self._holder.clear()
      worker.kill()  # ended, late, or out of memory (a heap that may stay fragmented): never reused
      raise SearchBudgetExceeded(
          f"search_code stopped: indexing this repository took over {timeout_s:.0f} s or "
          f"{self.memory_bytes >> 20} MB of memory; search fewer or smaller files, or use grep.")
    if "error" in answer:
      raise ValueError(answer["error"])
    self.builds += bool(answer["built"])
    return [(Chunk(path, start, end, name, text, doc), float(score))
            for path, start, end, name, text, doc, score in answer["hits"]]

  def close(self) -> None:
    """Gives the worker back to the idle pool (idempotent)."""
    _give_back(self._holder)
