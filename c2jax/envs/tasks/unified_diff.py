"""Unified diffs in pure Python: parse, apply to a repository held as path -> text, and write (git's format).

SWE-bench-style task instances (c2jax/envs/tasks/swe_tasks.py) carry their tests and their reference solution as unified
diffs against a repository snapshot; grading must not assume a `patch` or `git` binary on the host, so this module
applies them itself, as strictly as `git apply` does:

  files = apply(repo, patch_text)       # the repository after the patch (a new dict; `repo` is left as it is)
  paths = touched(patch_text)           # every path the patch reads, writes, creates, renames or deletes
  text = make(before, after)            # a git-style diff from one repository to another (`git apply` takes it)

What is read: git diffs (`diff --git a/x b/x`, `new file mode`, `deleted file mode`, `rename from/to`, `copy
from/to`, `index`, mode lines; a file section without hunks: an empty new file, a pure rename, a mode change) and
plain unified diffs (`--- x` / `+++ x` with optional tab-separated timestamps). Paths lose git's `a/` and `b/`
prefixes when both sides carry them, or a first directory in which alone the two sides differ (`diff -ru old new`);
`/dev/null` names no file; git's C-quoted paths are unquoted. Text before the
first file section (a commit message) is ignored. A hunk applies where its context and removed lines match the file
exactly, at the position its header names or, failing that, at the nearest other position after the previous hunk
(git's offset search, without fuzz: no context line is ever ignored), found through an index of the file's lines
(`_LineIndex`) in time that grows with the file, not with file x hunk. `\\ No newline at end of file` ends the line
before it without a newline.

What is refused, each in one sentence naming the file and the hunk (`PatchError`): a hunk whose lines are not in
the file, a binary patch, a malformed header or hunk, a change to a file the repository lacks, the creation of one
it already holds, a deletion whose hunks leave text, a path that is absolute or leaves the repository, and a quoted
path with a NUL byte, an escape other than git's (three octal digits from 000 to 377, or one of a b f n r t v and
the backslash and the quote) or bytes that are not UTF-8.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import secrets
from typing import Mapping

import numpy as np

from c2jax.envs.tasks.coding_tasks import TaskFormatError, check_path

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_NO_NEWLINE = "\\ No newline at end of file"
_DEV_NULL = "/dev/null"
_CONTEXT = 3
_OCTAL = re.compile(r"[0-3][0-7][0-7]")  # one byte, as git writes it: \000 to \377
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"'}
_ESCAPE_NAMES = " ".join(_ESCAPES)


class PatchError(ValueError):
  """A patch that does not parse or does not apply; the message names the file and the hunk."""


@dataclasses.dataclass(frozen=True)
class Hunk:
  """One hunk: its header's ranges (1-based starts, as written) and its lines as (tag, text).

  Each text keeps its line ending ("\\n", or none for a line marked `\\ No newline at end of file`); tag is " "
  (context), "-" (removed) or "+" (added).
  """

  old_start: int
  old_len: int
  new_start: int
  new_len: int
  lines: tuple[tuple[str, str], ...]
  header: str

  @property
  def old(self) -> list[str]:
    return [text for tag, text in self.lines if tag != "+"]

  @property
  def new(self) -> list[str]:
    return [text for tag, text in self.lines if tag != "-"]


@dataclasses.dataclass(frozen=True)
class FilePatch:
  """The change to one file: old_path None creates it, new_path None deletes it, both and different renames it (or
  copies it, when `copy`); `binary` marks a change this module cannot apply."""

  old_path: str | None
  new_path: str | None
  hunks: tuple[Hunk, ...] = ()
  copy: bool = False
  binary: bool = False

  @property
  def path(self) -> str:
    """The path the change is named by in messages (the new one, the old one for a deletion)."""
    return self.new_path if self.new_path is not None else self.old_path


def split_lines(text: str) -> list[str]:
  """`text` as lines that keep their "\\n" (the last one may lack it); only "\\n" ends a line, as in diffs."""
  lines = text.split("\n")
  out = [line + "\n" for line in lines[:-1]]
  if lines[-1]:
    out.append(lines[-1])
  return out


def _unquote(path: str) -> str:
  """git's C-style quoting ("a/x\\ty") undone; an unquoted path is returned as it is.

  An octal escape is three octal digits of one byte (\\000 to \\377, as git writes them); the bytes must be UTF-8
  and hold no NUL (no file name can), else the path is refused in one sentence.
  """
  if not (len(path) >= 2 and path[0] == path[-1] == '"'):
    return path
  body, out, i = path[1:-1], bytearray(), 0
  while i < len(body):
    c = body[i]
    if c != "\\":
      out += c.encode("utf-8", errors="surrogatepass")
      i += 1
    elif _OCTAL.fullmatch(body[i + 1:i + 4]):
      out.append(int(body[i + 1:i + 4], 8))
      i += 4
    elif i + 1 < len(body) and body[i + 1] in _ESCAPES:
      out += _ESCAPES[body[i + 1]].encode("utf-8")
      i += 2
    else:
      raise PatchError(f"The patch names the path {path[:200]}, whose quoting is not git's (an escape is three "
                       f"octal digits from 000 to 377 or one of {_ESCAPE_NAMES} after a backslash).")
  try:
    unquoted = out.decode("utf-8")
  except UnicodeDecodeError:
    raise PatchError(f"The patch names the path {path[:200]}, whose bytes are not UTF-8 text.") from None
  if "\0" in unquoted:
    raise PatchError(f"The patch names the path {path[:200]}, which holds a NUL byte that no file name can hold.")
  return unquoted


def _header_path(raw: str) -> str:
  """The path of a `---` / `+++` line's rest: timestamp cut at the tab, quoting undone."""
  raw = raw.rstrip("\n").rstrip("\r")
  if raw.startswith('"'):
    end = raw.find('"', 1)
    while end > 0 and raw[end - 1] == "\\":
      end = raw.find('"', end + 1)
    return _unquote(raw[:end + 1]) if end > 0 else raw
  return raw.split("\t", 1)[0].rstrip(" ")


def _git_paths(rest: str) -> tuple[str, str] | None:
  """The two paths of a `diff --git <a> <b>` line (quoted, or the same path twice); None when ambiguous."""
  rest = rest.rstrip("\n").rstrip("\r")
  if rest.startswith('"'):
    end = rest.find('" ', 1)
    if end < 0:
      return None
    return _unquote(rest[:end + 1]), _unquote(rest[end + 2:])
  if rest.endswith('"'):
    start = rest.rfind(' "')
    return (rest[:start], _unquote(rest[start + 1:])) if start >= 0 else None
  n = len(rest)
  # "a/P b/P": the same path twice, so the split is in the middle (paths may hold spaces).
  if n % 2 == 1 and rest[(n - 1) // 2] == " ":
    first, second = rest[:(n - 1) // 2], rest[(n + 1) // 2:]
    if first[2:] == second[2:] or first == second:
      return first, second
  if rest.startswith("a/") and rest.count(" b/") == 1:  # a rename: two paths, one way to split them
    first, second = rest.split(" b/")
    return first, "b/" + second
  return None


class _Section:
  """A file section while it is read."""

  def __init__(self, line_no: int):
    self.line_no = line_no
    self.git_old = self.git_new = None
    self.old = self.new = None  # from --- / +++
    self.rename_from = self.rename_to = None
    self.copy = self.binary = self.created = self.deleted = False
    self.hunks: list[Hunk] = []


def _strip_prefixes(old: str | None, new: str | None) -> tuple[str | None, str | None]:
  """The first path component dropped (like `patch -p1`) where it is git's a/ and b/ on every named side, or where
  both sides are named and differ only there (`diff -ru before after`); paths kept as they are otherwise (-p0)."""
  named = [p for p in (old, new) if p is not None and p != _DEV_NULL]
  prefixed = (old is None or old == _DEV_NULL or old.startswith("a/")) and (
      new is None or new == _DEV_NULL or new.startswith("b/"))
  if len(named) == 2 and not prefixed and "/" in old and "/" in new:
    (old_top, old_rest), (new_top, new_rest) = old.split("/", 1), new.split("/", 1)
    prefixed = old_top != new_top and old_rest == new_rest
  if named and prefixed:
    old = old if old is None or old == _DEV_NULL else old.split("/", 1)[1]
    new = new if new is None or new == _DEV_NULL else new.split("/", 1)[1]
  return old, new


def _shown(section: _Section) -> str:
  """The file a section changes, for messages while it is read (a/ and b/ prefixes dropped)."""
  for name in (section.new, section.git_new, section.old, section.git_old):
    if name is not None and name != _DEV_NULL:
      return name[2:] if name.startswith(("a/", "b/")) else name
  return "?"


def _finish(section: _Section) -> FilePatch:
  where = f"file section at line {section.line_no}"
  if section.rename_from is not None or section.rename_to is not None:
    if section.rename_from is None or section.rename_to is None:
      raise PatchError(f"The patch's {where} has a rename or copy without both 'from' and 'to'.")
    old, new = section.rename_from, section.rename_to  # git writes them without prefixes
  elif section.old is not None or section.new is not None:
    old, new = _strip_prefixes(section.old, section.new)
  elif section.git_old is not None:
    old, new = _strip_prefixes(section.git_old, section.git_new)
    if section.created:
      old = _DEV_NULL
    if section.deleted:
      new = _DEV_NULL
  else:
    raise PatchError(f"The patch's {where} names no file (no 'diff --git', '---' or '+++' path).")
  old = None if old == _DEV_NULL else old
  new = None if new == _DEV_NULL else new
  if old is None and new is None:
    raise PatchError(f"The patch's {where} names /dev/null on both sides.")
  for path in (old, new):
    if path is not None:
      if "\0" in path:  # an unquoted path with a raw NUL
        raise PatchError(f"The patch's {where} names {path[:200]!r}, which holds a NUL byte that no file name can "
                         "hold.")
      try:
        check_path(path)
      except TaskFormatError:
        raise PatchError(f"The patch's {where} names {path[:200]!r}, which is not a relative path inside the "
                         "repository.") from None
  return FilePatch(old_path=old, new_path=new, hunks=tuple(section.hunks), copy=section.copy,
                   binary=section.binary)


def _read_hunk(lines: list[str], i: int, path: str, number: int) -> tuple[Hunk, int]:
  """The hunk whose header is lines[i]; returns it and the index of the line after it."""
  header = lines[i].rstrip("\n").rstrip("\r")
  match = _HUNK.match(header)
  if match is None:
    raise PatchError(f"Hunk {number} of {path} has a malformed header {header!r} (want '@@ -a,b +c,d @@').")
  old_start, new_start = int(match.group(1)), int(match.group(3))
  old_len = 1 if match.group(2) is None else int(match.group(2))
  new_len = 1 if match.group(4) is None else int(match.group(4))
  body: list[tuple[str, str]] = []
  old_left, new_left = old_len, new_len
  i += 1
  while old_left > 0 or new_left > 0:
    if i >= len(lines):
      raise PatchError(f"Hunk {number} of {path} ({header}) ends early: its header promises {old_len} old and "
                       f"{new_len} new lines.")
    line = lines[i]
    tag, text = (line[0], line[1:]) if line not in ("\n", "") else (" ", line)  # an emptied context line
    if tag == "\\":
      if body:
        body[-1] = (body[-1][0], body[-1][1].rstrip("\n"))
      i += 1
      continue
    if tag not in " -+" or (tag in " -" and old_left == 0) or (tag in " +" and new_left == 0):
      raise PatchError(f"Hunk {number} of {path} ({header}) is malformed at patch line {i + 1}: {line[:60]!r} "
                       f"does not fit its counts ({old_len} old, {new_len} new lines).")
    body.append((tag, text))
    old_left -= tag != "+"
    new_left -= tag != "-"
    i += 1
  if i < len(lines) and lines[i].startswith("\\"):  # the marker after the hunk's last line
    if body:
      body[-1] = (body[-1][0], body[-1][1].rstrip("\n"))
    i += 1
  return Hunk(old_start, old_len, new_start, new_len, tuple(body), header), i


def parse(text: str) -> list[FilePatch]:  # noqa: C901
  """The file changes of a unified diff, in order. Empty text is an empty patch; other text without any file
  section is refused."""
  lines = split_lines(text)
  patches: list[FilePatch] = []
  section: _Section | None = None
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.startswith("diff --git "):
      if section is not None:
        patches.append(_finish(section))
      section = _Section(i + 1)
      paths = _git_paths(line[len("diff --git "):])
      if paths is not None:
        section.git_old, section.git_new = paths
      i += 1
    elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
      if section is None or section.old is not None or section.hunks:
        if section is not None:
          patches.append(_finish(section))
        section = _Section(i + 1)
      section.old, section.new = _header_path(line[4:]), _header_path(lines[i + 1][4:])
      i += 2
    elif section is None:
      i += 1  # preamble: a commit message, an email header
    elif line.startswith("@@"):
      hunk, i = _read_hunk(lines, i, _shown(section), len(section.hunks) + 1)
      section.hunks.append(hunk)
    else:
      stripped = line.rstrip("\n").rstrip("\r")
      if stripped.startswith("new file mode"):
        section.created = True
      elif stripped.startswith("deleted file mode"):
        section.deleted = True
      elif stripped.startswith(("rename from ", "copy from ")):
        section.rename_from = _unquote(stripped.split(" ", 2)[2])
        section.copy = stripped.startswith("copy")
      elif stripped.startswith(("rename to ", "copy to ")):
        section.rename_to = _unquote(stripped.split(" ", 2)[2])
      elif stripped.startswith(("Binary files ", "GIT binary patch")):
        section.binary = True
      i += 1  # index, mode, similarity lines and trailing text carry nothing to apply
  if section is not None:
    patches.append(_finish(section))
  if not patches and text.strip():
    raise PatchError("The patch holds no file change (no 'diff --git' or '---'/'+++' header); give a unified diff.")
  return patches


def _as_patches(patch: str | list[FilePatch]) -> list[FilePatch]:
  return parse(patch) if isinstance(patch, str) else list(patch)


def touched(patch: str | list[FilePatch]) -> list[str]:
  """Every path the patch names (old and new sides), sorted."""
  return sorted({p for fp in _as_patches(patch) for p in (fp.old_path, fp.new_path) if p is not None})


# Primes below 2^30 for the window hashes: a product of two residues fits int64.
_PRIMES = (1_000_000_007, 998_244_353)
_FIRST_RADIUS = 64  # lines either side of the expected position searched first (then 4x wider each time)


def _powers(base: int, prime: int, n: int) -> np.ndarray:
  """[base^0, ..., base^n] mod prime (int64), by binary exponentiation over all exponents at once."""
  exponents = np.arange(n + 1, dtype=np.int64)
  out = np.ones(n + 1, dtype=np.int64)
  square, bit = base % prime, 0
  while (1 << bit) <= n:
    odd = ((exponents >> bit) & 1).astype(bool)
    out[odd] = out[odd] * square % prime
    square, bit = square * square % prime, bit + 1
  return out


class _LineIndex:
  """A file's lines, indexed to find a hunk's old lines at the position nearest to an expected one.

  Each distinct line gets an id, and the positions of every id are kept sorted. A hunk can only start where its
  rarest line sits at that line's offset in the hunk, so those positions are the only candidates; each is tested
  at once by a hash of its window (sum_k id[i + k] * B^(i + k) mod p, for two primes p and bases B drawn at random
  per file, so that no patch can be written to collide, from prefix sums), and the equal windows nearest to the
  expected position are compared line by line. Candidates are taken in windows around the expected position that
  grow 4x at a time, so a search costs O(occurrences of the hunk's rarest line within twice the distance it moved)
  numpy work, at most the file's length, where comparing the hunk at every position outward from the expected one
  cost O(file x hunk).
  """

  def __init__(self, lines: list[str]):
    self.lines = lines
    self._ids: dict[str, int] = {}
    n = len(lines)
    ids = np.fromiter((self._ids.setdefault(line, len(self._ids)) for line in lines), np.int64, n)
    self._by_id = np.argsort(ids, kind="stable")  # positions grouped by id, ascending within an id
    self._start = np.concatenate([[0], np.cumsum(np.bincount(ids, minlength=len(self._ids)))])
    self._hashes = []
    for prime in _PRIMES:
      base = secrets.randbelow(prime - 2) + 2
      powers = _powers(base, prime, n)
      prefix = np.zeros(n + 1, dtype=np.int64)
      np.cumsum((ids + 1) * powers[:n] % prime, out=prefix[1:])  # < n * 2^30: no overflow below 2^33 lines
      self._hashes.append((prime, powers, prefix % prime))

  def find(self, old: list[str], expected: int, lowest: int) -> int | None:
    """The index >= lowest where `old` (non-empty) matches the lines, nearest to `expected` (earlier on a tie)."""
    n, m = len(self.lines), len(old)
    old_ids = [self._ids.get(line) for line in old]
    if None in old_ids or lowest > n - m:  # a line the file does not hold
      return None
    counts = [self._start[i + 1] - self._start[i] for i in old_ids]
    k = int(np.argmin(counts))  # the rarest line, at offset k in the hunk
    starts = self._by_id[self._start[old_ids[k]]:self._start[old_ids[k] + 1]] - k
    starts = starts[np.searchsorted(starts, lowest):np.searchsorted(starts, n - m, side="right")]
    wants = [sum((i + 1) * int(pw) for i, pw in zip(old_ids, powers[:m])) % prime
             for prime, powers, _ in self._hashes]
    # Windows of growing width around `expected`: a match inside one is the nearest of all, and the work stays
    # proportional to the candidates within twice the distance of the match.
    radius = _FIRST_RADIUS
    while True:
      window = starts[np.searchsorted(starts, expected - radius):np.searchsorted(starts, expected + radius,
                                                                                  side="right")]
      for want, (prime, powers, prefix) in zip(wants, self._hashes):
        window = window[(prefix[window + m] - prefix[window]) % prime == want * powers[window] % prime]
      at = self._nearest_equal(window, old, expected)
      if at is not None or (expected - radius <= lowest and expected + radius >= n - m):
        return at
      radius *= 4

  def _nearest_equal(self, starts: np.ndarray, old: list[str], expected: int) -> int | None:
    """The start in `starts` (ascending) nearest to `expected` (earlier on a tie) whose lines equal `old`."""
    m = len(old)
    right = int(np.searchsorted(starts, expected))
    left = right - 1
    while left >= 0 or right < len(starts):
      if right >= len(starts) or (left >= 0 and expected - starts[left] <= starts[right] - expected):
        at, left = int(starts[left]), left - 1
      else:
        at, right = int(starts[right]), right + 1
      if self.lines[at:at + m] == old:  # equal hashes of unequal windows are possible, if unlikely
        return at
    return None


def _locate(lines: list[str], old: list[str], expected: int, lowest: int,
            index: list[_LineIndex]) -> int | None:
  """The index >= lowest where `old` matches `lines`, nearest to `expected` (earlier first on a tie).

  The expected position is tried first; the file is indexed (`_LineIndex`, built once into `index`) only for a
  hunk that has moved.
  """
  n, m = len(lines), len(old)
  expected = min(max(expected, lowest), max(n - m, lowest))
  if lowest > n - m:
    return None
  if lines[expected:expected + m] == old:  # an empty `old` matches here
    return expected
  if not index:
    index.append(_LineIndex(lines))
  return index[0].find(old, expected, lowest)


def apply_hunks(text: str, hunks: tuple[Hunk, ...] | list[Hunk], path: str) -> str:
  """`text` with `hunks` applied in order (see the module docstring); raises PatchError naming `path`."""
  lines = split_lines(text)
  out: list[str] = []
  pos = offset = 0
  index: list[_LineIndex] = []
  for number, hunk in enumerate(hunks, 1):
    old = hunk.old
    if len(old) != hunk.old_len or len(hunk.new) != hunk.new_len:
      raise PatchError(f"Hunk {number} of {path} ({hunk.header}) holds {len(old)} old and {len(hunk.new)} new "
                       f"lines; its header says {hunk.old_len} and {hunk.new_len}.")
    # An empty old side inserts after line old_start; otherwise the hunk starts at line old_start.
    stated = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
    at = _locate(lines, old, stated + offset, pos, index)
    if at is None:
      raise PatchError(f"Hunk {number} of {path} ({hunk.header}) does not apply: its context and removed lines are "
                       "not in the file.")
    out += lines[pos:at] + hunk.new
    pos, offset = at + len(old), at - stated
  out += lines[pos:]
  return "".join(out)


def apply(files: Mapping[str, str], patch: str | list[FilePatch]) -> dict[str, str]:
  """The repository `files` (path -> text) after `patch` (diff text or parsed); `files` is not changed.

  File sections apply in order, each to the repository as the sections before it left it.
  """
  out = dict(files)
  for fp in _as_patches(patch):
    if fp.binary:
      raise PatchError(f"The patch's change to {fp.path} is binary; only text hunks apply (give the file's text "
                       "in the snapshot instead).")
    if fp.old_path is None:
      if fp.new_path in out:
        raise PatchError(f"The patch creates {fp.new_path}, which the repository already holds.")
      before = ""
    else:
      if fp.old_path not in out:
        raise PatchError(f"The patch changes {fp.old_path}, which the repository lacks.")
      before = out[fp.old_path]
    after = apply_hunks(before, fp.hunks, fp.path)
    if fp.new_path is None:
      if after:
        left = len(split_lines(after))
        raise PatchError(f"The patch deletes {fp.old_path}, but its hunks leave {left} line{'s' * (left != 1)} of "
                         "it.")
      del out[fp.old_path]
      continue
    if fp.old_path is not None and fp.old_path != fp.new_path and not fp.copy:
      del out[fp.old_path]
    if fp.old_path != fp.new_path and fp.new_path in out:
      raise PatchError(f"The patch renames or copies {fp.old_path} onto {fp.new_path}, which the repository "
                       "already holds.")
    out[fp.new_path] = after
  return out


# ---------------------------------------------------------------------------------------------------- writing


def _range(start: int, stop: int) -> str:
  """A hunk header's range for lines [start, stop) (0-based), as difflib and git write it."""
  length = stop - start
  if length == 1:
    return f"{start + 1}"
  return f"{start if length == 0 else start + 1},{length}"


def _body(tag: str, line: str) -> list[str]:
  if line.endswith("\n"):
    return [tag + line]
  return [tag + line + "\n", _NO_NEWLINE + "\n"]


def _quote(path: str) -> str:
  """A path as git writes it in headers: C-quoted when it holds a quote, a backslash or a control character."""
  if not any(c in path for c in '"\\') and all(ord(c) >= 32 for c in path):
    return path
  escaped = {v: k for k, v in _ESCAPES.items()}
  inner = "".join("\\" + escaped[c] if c in escaped else f"\\{ord(c):03o}" if ord(c) < 32 else c for c in path)
  return f'"{inner}"'


def make(before: Mapping[str, str], after: Mapping[str, str], context: int = _CONTEXT) -> str:
  """A git-style unified diff taking `before` to `after` (path -> text), files in sorted order; "" when equal.

  Added files are `new file mode 100644` against /dev/null, removed ones `deleted file mode 100644`; an empty added
  or removed file is its header alone, as git writes it.
  """
  out: list[str] = []
  for path in sorted(set(before) | set(after)):
    old, new = before.get(path), after.get(path)
    if old == new:
      continue
    a, b = _quote("a/" + path), _quote("b/" + path)
    out.append(f"diff --git {a} {b}\n")
    if old is None:
      out.append("new file mode 100644\n")
    elif new is None:
      out.append("deleted file mode 100644\n")
    old_lines, new_lines = split_lines(old or ""), split_lines(new or "")
    if not old_lines and not new_lines:
      continue
    out.append(f"--- {a if old is not None else _DEV_NULL}\n+++ {b if new is not None else _DEV_NULL}\n")
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
      i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
      out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
      for tag, a1, a2, b1, b2 in group:
        if tag == "equal":
          for line in old_lines[a1:a2]:
            out += _body(" ", line)
          continue
        for line in old_lines[a1:a2]:
          out += _body("-", line)
        for line in new_lines[b1:b2]:
          out += _body("+", line)
  return "".join(out)
