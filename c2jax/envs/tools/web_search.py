"""The `web_search` tool's backends: the interface a backend implements, the registry that names them, and the
default, an offline index of the installed Python standard library's documentation (report section 4 lists web
search among the agent's tools). Nothing here reaches the network: an environment worker has none, and the
sandboxed episodes must be reproducible.

  backend = WEB_SEARCH_BACKENDS.get(env_config.web_search_backend)()   # "stdlib_docs" by default
  print(render(backend.search("serialize an object to a JSON string", k=5)))   # json.dumps first

A backend is any object with `search(query, k) -> Sequence[SearchResult]` (`SearchBackend`), registered under a name
by a zero-argument factory; `EnvConfig.web_search_backend` picks one, so a real search service (behind a proxy the
workers may reach) or a frozen snapshot of one is a registration and a config override, not an edit of the env:

  @WEB_SEARCH_BACKENDS.register("my_snapshot")
  def my_snapshot() -> SearchBackend:
    return MySnapshotBackend("/data/search_snapshot")

The default, "stdlib_docs": the docstrings of `STDLIB_MODULES` (a fixed subset of 129 commonly used modules, not
the whole standard library: no GUI, test, platform-only or deprecated modules) and of their public functions,
classes, methods and properties, with their signatures (`inspect.getdoc`, `inspect.signature`: what `pydoc` shows,
less the docstrings a method only inherits), one entry per object titled by its dotted name (`json.dumps`), ~4200
entries on Python 3.11. They are read in a fresh isolated
interpreter (`python -I`, its own process): the modules' import side effects stay out of the caller, and a module
on the caller's path cannot stand in for the standard library's. `code_search.TextIndex` ranks them (fields: the
name, the docstring's first sentence, the signature and whole docstring; at this size the latent term joins).
Entries are sorted and signatures cleaned of object addresses, so the index is a deterministic function of the
Python build and this code.

It is built once (~3 s on a 2-core CPU) and cached on disk under `c2jax.data.bpe.default_cache_dir()`, in
"web_search/", keyed by the Python version, the scikit-learn version, the module list and a hash of this module's
and code_search's source (a change to either rebuilds it). The cache is a joblib pickle of the fitted index
(scikit-learn's own persistence), so a process's first query loads it in ~0.2 s (after scikit-learn's own ~1.5 s
import) instead of rebuilding it. Only this code writes that directory, and the sandbox mounts neither the host's
home nor its /tmp, so nothing an episode runs can plant a pickle there. Within a process the loaded index is shared
by every environment (`stdlib_docs`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Protocol, Sequence

from c2jax.data.bpe import default_cache_dir
from c2jax.envs.tools import code_search
from c2jax.registry import Registry

SNIPPET_CHARS = 400  # of a result's signature and summary
BUILD_TIMEOUT_S = 120.0  # for reading the documentation (~0.5 s on a 2-core CPU)

# The documented modules: the commonly used, platform-independent part of the standard library in Python 3.11 and
# 3.12 (a module missing from an interpreter is skipped).
STDLIB_MODULES = tuple("""
abc argparse array ast asyncio base64 bisect builtins bz2 calendar cmath codecs collections collections.abc colorsys
concurrent.futures configparser contextlib contextvars copy csv dataclasses datetime decimal difflib dis doctest
email email.message email.utils enum errno filecmp fileinput fnmatch fractions functools gc getopt getpass gettext
glob graphlib gzip hashlib heapq hmac html html.parser http http.client http.cookies http.server importlib
importlib.metadata importlib.resources inspect io ipaddress itertools json keyword linecache locale logging
logging.handlers lzma math mimetypes multiprocessing numbers operator os os.path pathlib pdb pickle pkgutil platform
plistlib pprint queue random re reprlib sched secrets select selectors shelve shlex shutil signal socket
socketserver sqlite3 ssl stat statistics string struct subprocess sys sysconfig tarfile tempfile textwrap threading
time timeit token tokenize tomllib traceback types typing unicodedata unittest unittest.mock urllib.parse
urllib.request uuid warnings weakref xml.dom.minidom xml.etree.ElementTree zipfile zlib zoneinfo
""".split())


@dataclasses.dataclass(frozen=True)
class SearchResult:
  """One result of a web search.

  Attributes:
    title: what the result is, e.g. "json.dumps" or a page's title.
    source: one line saying where it comes from, e.g. "Python 3.11.9 standard library docs: function in json".
    snippet: a bounded excerpt (render cuts it to SNIPPET_CHARS).
  """

  title: str
  source: str
  snippet: str


class SearchBackend(Protocol):
  """What the web_search tool calls.

  `search(query, k)` returns at most `k` results for a non-empty one-line query, best first, and an empty sequence
  when nothing matches. A query the backend refuses raises ValueError with one sentence the model can act on; any
  other exception is reported to the model as a failed call. It must not block past the episode's tool time.
  """

  def search(self, query: str, k: int) -> Sequence[SearchResult]:
    ...


WEB_SEARCH_BACKENDS: Registry[Callable[[], SearchBackend]] = Registry("web search backend")


def render(results: Sequence[SearchResult]) -> str:
  """The observation of web search results: per result its title, its source line and its snippet (clipped), or
  "no matches." for none."""
  if not results:
    return "no matches."
  parts = []
  for r in results:
    snippet = r.snippet.strip()
    if len(snippet) > SNIPPET_CHARS:
      snippet = snippet[:SNIPPET_CHARS].rstrip() + " [...]"
    source = " ".join(r.source.split())[:200]
    parts.append(f"{' '.join(r.title.split())[:200]}\n  {source}\n{snippet}")
  return "\n\n".join(parts)


def _read_docs(modules: list[str]) -> list[list[str]]:  # noqa: C901
  """[dotted name, kind, module, signature, docstring] of each documented public object of `modules`, sorted.

  Runs alone in a fresh `python -I` (its source is the program; see `_extract`), so it imports what it uses itself.
  """
  import importlib
  import inspect
  import re
  import warnings

  warnings.simplefilter("ignore")  # deprecation notices of the modules read
  address = re.compile(r" at 0x[0-9a-fA-F]+")  # a default's repr names an object's address: not deterministic
  out = {}

  def signature(obj) -> str:
    try:
      return address.sub("", str(inspect.signature(obj)))
    except (TypeError, ValueError):
      return ""

  def add(title: str, obj, kind: str, module: str) -> None:
    doc = obj.__doc__ if kind in ("method", "property") else inspect.getdoc(obj)  # no docs inherited from object
    if not isinstance(doc, str) or not doc.strip():
      return
    sig = signature(obj) if kind in ("function", "class", "method") else ""
    out[title] = [title, kind, module, sig, inspect.cleandoc(doc)[:4000]]

  for name in modules:
    try:
      module = importlib.import_module(name)
    except Exception:  # noqa: BLE001  (not in this build: skipped)
      continue
    add(name, module, "module", name)
    public = getattr(module, "__all__", None)
    names = sorted(public) if isinstance(public, (list, tuple)) else sorted(
        n for n in vars(module) if not n.startswith("_"))
    for member in names:
      obj = getattr(module, member, None)
      if not (inspect.isclass(obj) or inspect.isroutine(obj)):
        continue
      # Without __all__, only what the module defines (or its C accelerator, _json for json) is its API.
      home = getattr(obj, "__module__", None) or ""
      if public is None and home not in (name, "_" + name.rsplit(".", 1)[-1]):
        continue
      title = f"{name}.{member}"
      add(title, obj, "class" if inspect.isclass(obj) else "function", name)
      if inspect.isclass(obj):
        for attr, value in sorted(vars(obj).items()):
          if attr.startswith("_"):
            continue
          if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
          if isinstance(value, property):
            add(f"{title}.{attr}", value, "property", name)
          elif inspect.isroutine(value):
            add(f"{title}.{attr}", value, "method", name)
  return [out[k] for k in sorted(out)]


def _extract(modules: Sequence[str], timeout_s: float = BUILD_TIMEOUT_S) -> list[list[str]]:
  """The documentation entries of `modules`, read in a fresh isolated interpreter of this Python."""
  program = (inspect.getsource(_read_docs)
             + "\nimport json, sys\njson.dump(_read_docs(json.load(sys.stdin)), sys.stdout)\n")
  try:
    proc = subprocess.run([sys.executable, "-I", "-c", program], input=json.dumps(list(modules)),
                          capture_output=True, text=True, timeout=timeout_s, check=False, cwd=tempfile.gettempdir())
  except subprocess.TimeoutExpired:
    raise RuntimeError(f"Reading the standard library's documentation took over {timeout_s:g} s.") from None
  if proc.returncode != 0:
    raise RuntimeError(f"Reading the standard library's documentation failed: {proc.stderr.strip()[-300:]}")
  return json.loads(proc.stdout)


def _source_hash() -> str:
  h = hashlib.blake2b(digest_size=8)
  for module in (sys.modules[__name__], code_search):
    with open(module.__file__, "rb") as f:
      h.update(f.read())
  return h.hexdigest()


def _summary(doc: str) -> str:
  paragraph = doc.strip().split("\n\n", 1)[0]
  return " ".join(paragraph.split())


def _read_cache(path: str) -> tuple[list[list[str]], code_search.TextIndex] | None:
  """The cached (entries, index) at `path`; None when the file is missing, partial or not one."""
  import joblib  # scikit-learn's dependency; deferred as scikit-learn is
  try:
    loaded = joblib.load(path)
  except Exception:  # noqa: BLE001  (missing, truncated or foreign: rebuilt)
    return None
  if isinstance(loaded, tuple) and len(loaded) == 2 and isinstance(loaded[1], code_search.TextIndex):
    return loaded
  return None


def _write_cache(path: str, loaded: tuple[list[list[str]], code_search.TextIndex]) -> None:
  """Writes the cache whole, then renames it into place: a concurrent reader sees the old file or the new one."""
  import joblib
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    os.close(fd)
    try:
      joblib.dump(loaded, tmp)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.unlink(tmp)
  except OSError:
    pass  # an unwritable cache only costs the next process a rebuild


class StdlibDocs:
  """The offline documentation backend: the standard library's docstrings, indexed once, cached on disk.

  Args:
    cache_dir: where the index is cached ("web_search/" under it); `default_cache_dir()` when None.
    modules: the modules documented.
  """

  def __init__(self, cache_dir: str | None = None, modules: Sequence[str] = STDLIB_MODULES):
    self.cache_dir = cache_dir
    self.modules = tuple(modules)
    self._lock = threading.Lock()
    self._loaded: tuple[list[list[str]], code_search.TextIndex] | None = None
    self.build_s: float | None = None  # seconds the last build took (None: loaded from the cache, or not yet)

  def cache_path(self) -> str:
    """The cache file of this Python, scikit-learn, code and module list."""
    import sklearn
    key = hashlib.blake2b(json.dumps([sys.version, sklearn.__version__, _source_hash(), self.modules]).encode(),
                          digest_size=8).hexdigest()
    root = self.cache_dir or default_cache_dir()
    return os.path.join(root, "web_search", f"stdlib_docs-py{sys.version_info[0]}.{sys.version_info[1]}-{key}.joblib")

  def _load(self) -> tuple[list[list[str]], code_search.TextIndex]:
    """(entries, index): from the cache file when it holds them, else built (and then written there)."""
    with self._lock:
      if self._loaded is None:
        path = self.cache_path()
        loaded = _read_cache(path)
        if loaded is None:
          start = time.monotonic()
          entries = _extract(self.modules)
          index = code_search.TextIndex([
              code_search.Document(title=title, summary=code_search.first_sentence(doc), body=f"{sig}\n{doc}")
              for title, _, _, sig, doc in entries])
          loaded = (entries, index)
          self.build_s = time.monotonic() - start
          _write_cache(path, loaded)
        self._loaded = loaded
      return self._loaded

  def search(self, query: str, k: int) -> list[SearchResult]:
    """The best `k` entries for `query` (see `SearchBackend`); the first call loads or builds the index."""
    if not query.strip():
      raise ValueError("the query is empty; say what to look up, e.g. 'serialize an object to a JSON string'.")
    entries, index = self._load()
    version = ".".join(map(str, sys.version_info[:3]))
    results = []
    for i, _ in index.search(query, k):
      title, kind, module, sig, doc = entries[i]
      head = f"{title}{sig}" if sig else ""
      snippet = "\n".join(x for x in (head, _summary(doc)) if x)
      results.append(SearchResult(title=title, source=f"Python {version} standard library docs (offline): "
                                  f"{kind} in {module}", snippet=snippet))
    return results


_SHARED: dict[str | None, StdlibDocs] = {}
_SHARED_LOCK = threading.Lock()


@WEB_SEARCH_BACKENDS.register("stdlib_docs")
def stdlib_docs() -> SearchBackend:
  """The process's one `StdlibDocs` over the default cache dir (loaded once, shared by every environment)."""
  root = default_cache_dir()
  with _SHARED_LOCK:
    if root not in _SHARED:
      _SHARED[root] = StdlibDocs(root)
    return _SHARED[root]
