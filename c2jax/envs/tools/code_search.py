"""Semantic code search over the episode's repository: the `search_code` tool, and the ranked text index under it
(report section 4: the model searches the repository through tools). `web_search`'s offline documentation backend
ranks with the same index.

  search = CodeSearch()                                        # one per environment; rebuilt when files change
  hits = search.search(sandbox.files(max_file_bytes=MAX_FILE_BYTES), "parse a date string", k=5)
  print(render(hits))                                          # "pkg/dates.py:12-30 (parse_iso_timestamp)" + code

Units. A Python file that parses is cut along its syntax (`ast`): each top-level function, each method (named
`Class.method`), each class's head (its line up to its first method: docstring, attributes), and the module-level
code between them in windows. Any other text file, and Python that does not parse (the model's half-written edit),
is cut into overlapping windows of lines. Binary files (a NUL byte, or not UTF-8), files over `MAX_FILE_BYTES`,
and everything past `MAX_INDEX_BYTES` of text or `MAX_INDEX_UNITS` units are not indexed; a title and a signature
line are indexed up to `MAX_SUMMARY_CHARS`, and a query may hold `MAX_QUERY_CHARS`. Python is parsed through
`c2jax.sandbox.host_ast` (one lock for every parse in the process). The environment runs all of this in a child
process under a per-call budget (`bounded_search`).

What it ranks by, and why. The query is a description in words ("parse a date string"), the code a mix of
identifiers and prose, so both are cut into the same code-aware tokens (`tokens`): identifiers split on snake_case
and camelCase (`parseISOTimestamp` -> parse, iso, timestamp, plus the whole identifier), lowercased, common
abbreviations spelled out (str -> string, dir -> directory), English function words dropped, and plural / -ed / -ing /
-e endings folded, so that "parses" meets "parse". A unit is scored against the query field by field, by the cosine
of their TF-IDF vectors (scikit-learn's `TfidfVectorizer`, sublinear term frequency): its name and path (what a
unit is called is the strongest evidence of what it does), its summary (the signature line and the docstring's
first sentence, the author's own paraphrase of it), its whole text (weaker: long bodies mention much), and the
character 3-5-grams of its name and summary (identifiers that glue words, `copytree`, `datetime`). Fields are scored
apart rather than as one text so that a long body neither drowns its name nor wins by sheer length. Once the corpus
holds `LSA_MIN_DOCUMENTS` units, latent semantic analysis adds one more term: the cosine in a rank-`LSA_COMPONENTS`
truncated SVD of the units' TF-IDF matrix, where words that co-occur across the repository (timestamp and date,
serialize and dump) lie close, so a query may reach a unit that shares few of its words; below that size the SVD
of a handful of units is noise. A unit with no query token (word or character n-gram) in common with the corpus
scores 0, and a query no unit shares anything with has no matches. Ties go to the earlier unit (path order):
rankings are deterministic.

The index is cached by a hash of the repository's (path, content) pairs and rebuilt when any file changed since the
last query; only the changed files are cut into units again. scikit-learn is imported on first use, not with the
module: most processes that import the environment never search.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import re
import resource
import sys
from typing import Mapping, Sequence

from c2jax.sandbox import host_ast

MAX_FILE_BYTES = 256 << 10  # a bigger file is data or a vendored bundle, not code anyone reads by searching
MAX_INDEX_BYTES = 8 << 20  # of text over the whole repository; the rest is not indexed (its build is tool time)
MAX_INDEX_UNITS = 20_000  # units over the whole repository (a file of one-line functions is ~50 000 per MB)
MAX_SUMMARY_CHARS = 300  # of a unit's signature line, and of its title, as the fields index them
MAX_QUERY_CHARS = 1000  # of a query: a description, not a file (its tokens and n-grams are tool time too)
WINDOW_LINES = 40  # lines per window of a file without syntax units
WINDOW_STRIDE = 30  # windows overlap by 10 lines, so a passage on a boundary lies whole in one of them
SNIPPET_LINES = 12  # lines of a unit shown in a result
SNIPPET_LINE_CHARS = 160  # characters of each shown line
LSA_MIN_DOCUMENTS = 200  # units before the latent (SVD) term joins the score
LSA_COMPONENTS = 100  # rank of the latent space

# Weights of the per-field cosines in a unit's score (the lexical ones sum to 1; LSA adds at most LSA_WEIGHT).
FIELD_WEIGHTS = (("title", 0.35), ("summary", 0.3), ("body", 0.2), ("chars", 0.15))
LSA_WEIGHT = 0.2

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")
# Abbreviations of code, spelled out so that a query in words meets them (and a query of abbreviations, the words).
_ABBREVIATIONS = {
    "arg": "argument", "args": "arguments", "attr": "attribute", "buf": "buffer", "cfg": "config", "cmd": "command",
    "conf": "config", "ctx": "context", "db": "database", "dest": "destination", "dict": "dictionary",
    "dir": "directory", "dirs": "directories", "dst": "destination", "env": "environment", "err": "error",
    "exc": "exception", "fmt": "format", "fn": "function", "func": "function", "idx": "index", "init": "initialize",
    "int": "integer", "len": "length", "lib": "library", "msg": "message", "num": "number", "obj": "object",
    "param": "parameter", "params": "parameters", "pos": "position", "regexp": "regex", "repr": "representation",
    "sep": "separator", "seq": "sequence", "src": "source", "str": "string", "tmp": "temporary", "temp": "temporary",
    "ts": "timestamp", "val": "value",
}
# English function words: they carry no meaning of their own in a query or a docstring. (Not scikit-learn's list:
# that one drops words that name things in code, such as name, call, find, empty, first, last, next and system.)
_STOP_WORDS = frozenset("""
a about after again also am an and are as at be been before being but by can could did do does doing done for from
had has have having he her here his how i if in into is it its itself me my of on onto or our ours out she should
so some such than that the their them then there these they this those through to too under until upon us very via
was we were what when where which while who whom whose why will with within without would you your
""".split())


def _fold(word: str) -> str:
  """`word` with a plural, then an -ing or -ed, then a final "e" folded away, so that a word's forms meet: parse,
  parses, parsed, parsing -> pars; class, classes -> class; entry, entries -> entry."""
  if word.endswith("ies") and len(word) >= 5:
    word = word[:-3] + "y"
  elif word.endswith("es") and len(word) >= 5 and (word[-3] in "sxz" or word.endswith(("ches", "shes"))):
    word = word[:-2]
  elif word.endswith("s") and len(word) >= 4 and not word.endswith(("ss", "us", "is")):
    word = word[:-1]
  if word.endswith("ing") and len(word) >= 6:
    word = word[:-3]
  elif word.endswith("ed") and len(word) >= 5:
    word = word[:-2]
  if word.endswith("e") and len(word) >= 4:
    word = word[:-1]
  return word


def tokens(text: str) -> list[str]:
  """The code-aware tokens of `text` (see the module docstring): split identifiers, their words spelled out and
  folded, stop words and one-letter words dropped; a compound identifier also stands whole, lowercased."""
  out = []
  for ident in _IDENTIFIER.findall(text):
    parts = [p.lower() for piece in ident.split("_") for p in _CAMEL.findall(piece)]
    for part in parts:
      part = _ABBREVIATIONS.get(part, part)
      if len(part) > 1 and part not in _STOP_WORDS:
        out.append(_fold(part))
    if len(parts) > 1:
      out.append(ident.lower())
  return out


def _given(tokens_: list[str]) -> list[str]:
  """The analyzer of pre-tokenized fields (module-level, so a fitted index pickles)."""
  return tokens_


@dataclasses.dataclass(frozen=True)
class Document:
  """One unit to rank, in the fields scored apart (see the module docstring).

  Attributes:
    title: what it is called: a function's path and qualified name, a documentation entry's dotted name.
    summary: what it says it does: a signature line and a docstring's first sentence ("" if none).
    body: all of its text.
  """

  title: str
  summary: str
  body: str


class TextIndex:
  """Documents ranked against a query by per-field TF-IDF cosines plus, for a large corpus, an LSA cosine.

  Args:
    documents: the units, in the order that breaks ties.
    lsa_min_documents: corpus size from which the latent term joins the score.
    lsa_components: rank of the latent space (cut to what the corpus supports).
  """

  def __init__(self, documents: Sequence[Document], lsa_min_documents: int = LSA_MIN_DOCUMENTS,
               lsa_components: int = LSA_COMPONENTS):
    # Deferred: scikit-learn takes ~1.5 s to import, and most processes never build an index.
    import numpy as np
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.preprocessing import normalize

    self.size = len(documents)
    titles = [tokens(d.title) for d in documents]
    summaries = [tokens(d.summary) for d in documents]
    bodies = [tokens(d.body) for d in documents]
    texts = {"title": titles, "summary": summaries, "body": bodies,
             "chars": [" ".join(t + s) for t, s in zip(titles, summaries)]}
    self._fields = []  # (weight, vectorizer, unit-by-term matrix, whether the query goes in as text)
    for name, weight in FIELD_WEIGHTS:
      if name == "chars":
        vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(3, 5), sublinear_tf=True, dtype=np.float32)
      else:
        vectorizer = TfidfVectorizer(analyzer=_given, sublinear_tf=True, dtype=np.float32)
      try:
        matrix = vectorizer.fit_transform(texts[name])
      except ValueError:  # no document has a term in this field (e.g. no summaries): the field scores nothing
        continue
      self._fields.append((weight, vectorizer, matrix.tocsr(), name == "chars"))
    self._lsa = None
    if self.size >= lsa_min_documents:
      vectorizer = TfidfVectorizer(analyzer=_given, sublinear_tf=True, dtype=np.float32)
      try:
        matrix = vectorizer.fit_transform([t + s + b for t, s, b in zip(titles, summaries, bodies)])
      except ValueError:
        matrix = None
      if matrix is not None and min(matrix.shape) > 2:
        svd = TruncatedSVD(n_components=min(lsa_components, min(matrix.shape) - 1), random_state=0)
        self._lsa = (vectorizer, svd, normalize(svd.fit_transform(matrix)).astype(np.float32))

  def search(self, query: str, k: int) -> list[tuple[int, float]]:
    """The best `k` documents for `query`, as (index, score) with score > 0, best first; [] when nothing matches.

    Raises:
      ValueError: the query holds no searchable word (only punctuation, stop words or single letters).
    """
    import numpy as np
    from sklearn.preprocessing import normalize

    words = tokens(query)
    if not words:
      raise ValueError(f"the query {query.strip()[:80]!r} has no words to search for; describe what to find.")
    lexical = np.zeros(self.size, np.float32)
    for weight, vectorizer, matrix, as_text in self._fields:
      q = vectorizer.transform([" ".join(words) if as_text else words])
      lexical += weight * (matrix @ q.T).toarray().ravel()
    if self.size == 0 or not lexical.any():
      return []
    score = lexical
    if self._lsa is not None:
      vectorizer, svd, latent = self._lsa
      q = normalize(svd.transform(vectorizer.transform([words])))
      score = lexical + LSA_WEIGHT * np.maximum(latent @ q.ravel(), 0.0)
    order = np.argsort(-score, kind="stable")[:max(0, k)]
    return [(int(i), float(score[i])) for i in order if score[i] > 0]


@dataclasses.dataclass(frozen=True)
class Chunk:
  """One searchable unit of a file.

  Attributes:
    path: the file, relative to the repository root.
    start: its first line (1-based).
    end: its last line (inclusive).
    name: the function, `Class.method` or class it is; "" for a window of lines.
    text: its lines.
    doc: the first sentence of its docstring ("" for none, and for a window).
  """

  path: str
  start: int
  end: int
  name: str
  text: str
  doc: str = ""

  def document(self) -> Document:
    """The unit as the index ranks it: title = path and name, summary = first line and docstring sentence."""
    if not self.name:
      return Document(title=self.path, summary="", body=self.text)
    lines = [x.strip() for x in _lines(self.text)]
    signature = next((x for x in lines if x.startswith(("def ", "async def ", "class "))), lines[0] if lines else "")
    # Clipped: a signature line (or a name) can be a whole file long, and these fields are cut into n-grams.
    return Document(title=f"{self.path} {self.name}"[:MAX_SUMMARY_CHARS],
                    summary=f"{signature[:MAX_SUMMARY_CHARS]} {self.doc}", body=self.text)


def first_sentence(text: str) -> str:
  """The first sentence of a docstring's first paragraph (at most 300 characters)."""
  paragraph = text.strip().split("\n\n", 1)[0]
  m = re.search(r"[.!?](\s|$)", paragraph)
  return (paragraph[:m.end()] if m else paragraph)[:300].strip()


_NEWLINE = re.compile(r"\r\n|\r|\n")  # the line ends Python's parser counts (str.splitlines counts more, e.g. \f)


def _lines(text: str) -> list[str]:
  lines = _NEWLINE.split(text)
  return lines[:-1] if lines and lines[-1] == "" else lines


def _windows(path: str, lines: list[str], first: int, last: int) -> list[Chunk]:
  """Overlapping windows over lines first..last (1-based, inclusive) that hold more than blank lines."""
  out = []
  start = first
  while start <= last:
    end = min(start + WINDOW_LINES - 1, last)
    text = "\n".join(lines[start - 1:end])
    if text.strip():
      out.append(Chunk(path, start, end, "", text))
    if end == last:
      break
    start += WINDOW_STRIDE
  return out


def _python_units(tree: ast.Module) -> list[tuple[int, int, str, str]]:
  """(first line, last line, name, docstring) of the top-level functions, the methods and the class heads."""
  units = []

  def first_line(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])

  def unit(node: ast.AST, end: int, name: str) -> tuple[int, int, str, str]:
    return first_line(node), end, name, first_sentence(ast.get_docstring(node) or "")

  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      units.append(unit(node, node.end_lineno, node.name))
    elif isinstance(node, ast.ClassDef):
      methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
      head_end = first_line(methods[0]) - 1 if methods else node.end_lineno
      units.append(unit(node, head_end, node.name))
      units += [unit(m, m.end_lineno, f"{node.name}.{m.name}") for m in methods]
  return units


def chunk_file(path: str, text: str) -> list[Chunk]:
  """The searchable units of one file (see the module docstring), in line order."""
  lines = _lines(text)
  if not lines:
    return []
  tree = None
  if path.endswith(".py"):
    try:
      tree = host_ast.parse(text, filename=path)
    except host_ast.Unparsable:  # a half-written edit, or a file nested past the parser's limits: windows
      tree = None
  if tree is None:
    return _windows(path, lines, 1, len(lines))
  chunks = []
  covered = 0  # the last line of a unit so far; module-level code between units goes in windows
  for start, end, name, doc in sorted(_python_units(tree)):
    if start > covered + 1:
      chunks += _windows(path, lines, covered + 1, start - 1)
    chunks.append(Chunk(path, start, end, name, "\n".join(lines[start - 1:end]), doc))
    covered = max(covered, end)
  if covered < len(lines):
    chunks += _windows(path, lines, covered + 1, len(lines))
  return chunks


def _skipped(path: str) -> bool:
  return any(part in ("__pycache__", ".git") for part in path.split("/"))


def indexable(files: Mapping[str, str]) -> dict[str, str]:
  """The files the index takes, in path order: text files of at most `MAX_FILE_BYTES`, outside cache directories,
  up to `MAX_INDEX_BYTES` in all (what the host sends to a search worker, too)."""
  out, total = {}, 0
  for path in sorted(files):
    text = files[path]
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if _skipped(path) or size > MAX_FILE_BYTES or "\0" in text or total + size > MAX_INDEX_BYTES:
      continue
    total += size
    out[path] = text
  return out


def fingerprint(files: Mapping[str, str]) -> str:
  """A hash of the (path, content) pairs of `files`, in path order: equal exactly when the repository is."""
  h = hashlib.blake2b(digest_size=16)
  for path in sorted(files):
    for part in (path, files[path]):
      data = part.encode("utf-8", errors="surrogatepass")
      h.update(len(data).to_bytes(8, "little"))
      h.update(data)
  return h.hexdigest()


class CodeSearch:
  """The search_code index of one repository, rebuilt when the repository changed since the last query.

  In-process and unbounded in time and memory beyond the caps above: the environment runs it in a child process
  under a per-call budget (`bounded_search.BoundedSearch`); tests and tools call it directly.
  """

  def __init__(self):
    self._fingerprint: str | None = None
    self._chunks: list[Chunk] = []
    self._index: TextIndex | None = None
    self._units: dict[str, tuple[str, list[Chunk]]] = {}  # path -> (its text, its units): an edit re-cuts one file
    self.builds = 0  # how many times an index was built (tests watch the cache with it)

  def _refresh(self, files: Mapping[str, str]) -> None:
    key = fingerprint(files)
    if key == self._fingerprint:
      return
    chunks, units = [], {}
    for path, text in indexable(files).items():
      cached = self._units.get(path)
      units[path] = cached if cached is not None and cached[0] == text else (text, chunk_file(path, text))
      chunks += units[path][1][:MAX_INDEX_UNITS - len(chunks)]
      if len(chunks) >= MAX_INDEX_UNITS:
        break
    self._units = units
    self._chunks = chunks
    self._index = TextIndex([c.document() for c in chunks])
    self._fingerprint = key
    self.builds += 1

  def search(self, files: Mapping[str, str], query: str, k: int) -> list[tuple[Chunk, float]]:
    """The best `k` units of the repository `files` (path -> text) for `query`, best first; [] for no match.

    Raises:
      ValueError: the query is empty or holds no searchable word (one sentence, for the model).
    """
    if not query.strip():
      raise ValueError("the query is empty; describe the code to find, e.g. 'parse a date string'.")
    if len(query) > MAX_QUERY_CHARS:
      raise ValueError(f"the query has {len(query)} characters; describe the code to find in at most "
                       f"{MAX_QUERY_CHARS}.")
    self._refresh(files)
    return [(self._chunks[i], score) for i, score in self._index.search(query, k)]


def render(hits: Sequence[tuple[Chunk, float]]) -> str:
  """The observation of search results: a "path:first-last (name)" header and the unit's first lines each, or
  "no matches." for none."""
  if not hits:
    return "no matches."
  parts = []
  for chunk, _ in hits:
    header = f"{chunk.path}:{chunk.start}-{chunk.end}" + (f" ({chunk.name})" if chunk.name else "")
    lines = _lines(chunk.text)
    shown = [line if len(line) <= SNIPPET_LINE_CHARS else line[:SNIPPET_LINE_CHARS] + " [...]"
             for line in lines[:SNIPPET_LINES]]
    if len(lines) > SNIPPET_LINES:
      shown.append(f"[... {len(lines) - SNIPPET_LINES} more lines]")
    parts.append("\n".join([header, *shown]))
  return "\n\n".join(parts)


def serve(memory_bytes: int) -> None:
  """The child side of `bounded_search`: one `CodeSearch` answering requests on stdin, one JSON line each.

  Request: {"files": {path: text}, "query": str, "k": int}. Answer: {"hits": [[path, start, end, name, text, doc,
  score], ...], "built": bool}, or {"error": sentence} for a query the index refuses. The address space is capped
  at what the imports mapped plus `memory_bytes`, so a build past it fails here (MemoryError, or the kernel's
  refusal ending the process) and never in the host process. Ends at end of input.
  """
  import numpy  # noqa: F401  (mapped before the cap is measured)
  import sklearn.decomposition
  import sklearn.feature_extraction.text
  import sklearn.preprocessing  # noqa: F401
  with open("/proc/self/status") as f:
    mapped = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))
  resource.setrlimit(resource.RLIMIT_AS, (mapped + memory_bytes, mapped + memory_bytes))
  search = CodeSearch()
  out = sys.stdout
  out.write("ready\n")
  out.flush()
  for line in sys.stdin:
    request = json.loads(line)
    builds = search.builds
    try:
      hits = search.search(request["files"], request["query"], int(request["k"]))
      answer = {"hits": [[c.path, c.start, c.end, c.name, c.text, c.doc, s] for c, s in hits],
                "built": search.builds > builds}
    except ValueError as e:
      answer = {"error": str(e)}
    except MemoryError:  # the index is half built: a fresh one next time
      search = CodeSearch()
      answer = {"memory": True}
    out.write(json.dumps(answer) + "\n")
    out.flush()
