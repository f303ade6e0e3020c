"""The pure-Python unified diff against git: git's diffs apply here to git's result, and the diffs written here apply
with `git apply` to the same result; offsets, renames, quoting, missing newlines and CRLF; every refusal is one
sentence naming the file and the hunk.

Attacks (a task instance's patch is untrusted text): C-quoted paths with NUL bytes, out-of-range or non-octal escapes
and bytes that are not UTF-8 are refused in one sentence; the offset search runs in a child process under a memory
limit and a timeout on 30 KB patches against a 100,000-line file, written to make the search compare the hunk at
every position, and must equal an exhaustive nearest-position search on random files.
"""

import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tasks import unified_diff as ud
from c2jax.envs.tasks.unified_diff import PatchError

_GIT = shutil.which("git")
_GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}
_WORDS = ("alpha", "beta", "gamma", "", "x = 1", "    return y", "tab\there", "crlf\r", "-- not a header",
          "+++ nor this", "@@ nor this @@")


def _random_text(rng: random.Random, n: int) -> str:
  text = "\n".join(rng.choice(_WORDS) for _ in range(n))
  return text + "\n" if rng.random() < 0.7 else text


def _mutate(rng: random.Random, text: str) -> str:
  lines = text.split("\n")
  for _ in range(rng.randint(1, 5)):
    i = rng.randrange(len(lines) + 1)
    op = rng.choice(["insert", "delete", "replace"])
    if op == "insert" or not lines:
      lines.insert(i, rng.choice(_WORDS + ("new line",)))
    elif op == "delete":
      del lines[min(i, len(lines) - 1)]
    else:
      lines[min(i, len(lines) - 1)] = "changed"
  return "\n".join(lines)


def _random_change(rng: random.Random) -> tuple[dict[str, str], dict[str, str]]:
  """A repository and a changed copy: files edited, deleted, added (some empty, some with odd names)."""
  before = {f"pkg{d}/mod{j}.py": _random_text(rng, rng.randint(0, 40)) for d in range(2) for j in range(3)}
  before["odd name/with space.py"] = _random_text(rng, 5)
  after = {}
  for path, text in before.items():
    r = rng.random()
    if r < 0.15:
      continue
    after[path] = _mutate(rng, text) if r < 0.85 else text
  if rng.random() < 0.5:
    after['new dir/qu"ote.py'] = _random_text(rng, rng.randint(1, 6))
  if rng.random() < 0.3:
    after["pkg0/empty.py"] = ""
  return before, after


def _write(root: pathlib.Path, files: dict[str, str]) -> None:
  for path, text in files.items():
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(text.encode())


def _read(root: pathlib.Path) -> dict[str, str]:
  return {p.relative_to(root).as_posix(): p.read_bytes().decode() for p in root.rglob("*")
          if p.is_file() and ".git" not in p.relative_to(root).parts}


def _git(root: pathlib.Path, command: str, stdin: str | None = None) -> str:
  # Bytes both ways: text mode would turn the CRLF lines into LF on the way.
  return subprocess.run(f"git {command}", shell=True, cwd=root, env=_GIT_ENV, check=True, capture_output=True,
                        input=None if stdin is None else stdin.encode()).stdout.decode()


@absltest.skipIf(_GIT is None, "git is not installed: the independent reference these tests compare against")
class AgainstGitTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.dir = pathlib.Path(tempfile.mkdtemp())
    self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

  def _repo(self, name: str, files: dict[str, str]) -> pathlib.Path:
    root = self.dir / name
    root.mkdir()
    _write(root, files)
    _git(root, "init -q")
    _git(root, "add -A")
    _git(root, "commit -qm base --allow-empty")
    return root

  def _git_diff(self, before: dict[str, str], after: dict[str, str], renames: bool) -> str:
    root = self._repo("git_diff", before)
    for path in before:
      (root / path).unlink()
    _write(root, after)
    _git(root, "add -A")
    return _git(root, f"diff --cached {'-M' if renames else '--no-renames'}")

  @parameterized.parameters(0, 1, 2, 3, 4, 5, 6, 7)
  def test_git_diffs_apply_here(self, seed):
    rng = random.Random(seed)
    for case in range(6):
      before, after = _random_change(rng)
      diff = self._git_diff(before, after, renames=False)
      self.assertEqual(ud.apply(before, diff), after, f"seed {seed} case {case}")
      shutil.rmtree(self.dir / "git_diff")

  @parameterized.parameters(0, 1, 2, 3, 4, 5, 6, 7)
  def test_diffs_written_here_apply_with_git(self, seed):
    rng = random.Random(100 + seed)
    for case in range(6):
      before, after = _random_change(rng)
      text = ud.make(before, after)
      root = self._repo("git_apply", before)
      _git(root, "apply -", stdin=text)
      self.assertEqual(_read(root), after, f"seed {seed} case {case}")
      self.assertEqual(ud.apply(before, text), after)
      shutil.rmtree(root)

  def test_renames_and_copies_from_git(self):
    body = "".join(f"line {i}\n" for i in range(40))
    before = {"src/old_name.py": body, "src/keep.py": body.replace("line", "row")}
    after = {"src/new_name.py": body.replace("line 7\n", "line seven\n"), "src/keep.py": before["src/keep.py"],
             "src/copy.py": before["src/keep.py"]}
    root = self._repo("renames", before)
    (root / "src/old_name.py").rename(root / "src/new_name.py")
    _write(root, after)
    _git(root, "add -A")
    diff = _git(root, "diff --cached -M -C --find-copies-harder")
    self.assertIn("rename from src/old_name.py", diff)
    self.assertIn("copy from src/keep.py", diff)
    self.assertEqual(ud.apply(before, diff), after)
    self.assertEqual(ud.touched(diff), ["src/copy.py", "src/keep.py", "src/new_name.py", "src/old_name.py"])

  def test_offsets_as_git_applies_them(self):
    # The diff was made against a file that has since grown and shrunk around the hunks: git finds each hunk at the
    # nearest offset, and so does this module.
    base = "".join(f"line {i}\n" for i in range(60))
    changed = base.replace("line 10\n", "line ten\n").replace("line 50\n", "").replace("line 30\n", "line 30\nnew\n")
    diff = ud.make({"f.py": base}, {"f.py": changed})
    moved = "head\n" * 7 + base.replace("line 40\n", "")
    root = self._repo("offsets", {"f.py": moved})
    _git(root, "apply -", stdin=diff)
    self.assertEqual(ud.apply({"f.py": moved}, diff), _read(root))
    self.assertNotEqual(_read(root)["f.py"], moved)


class UnifiedDiffTest(parameterized.TestCase):

  def test_no_newline_markers_both_ways(self):
    before, after = {"a.py": "x\ny"}, {"a.py": "x\ny\nz"}
    text = ud.make(before, after)
    self.assertEqual(text.count("\\ No newline at end of file"), 2)
    self.assertEqual(ud.apply(before, text), after)
    self.assertEqual(ud.apply(after, ud.make(after, before)), before)

  def test_plain_diffs_with_timestamps_and_directories(self):
    plain = ("--- a.py\t2024-01-01 00:00:00.000000000 +0000\n+++ a.py\t2024-01-02 00:00:00.000000000 +0000\n"
             "@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n")
    self.assertEqual(ud.apply({"a.py": "one\ntwo\n"}, plain), {"a.py": "one\nTWO\n"})
    ru = "diff -ru before/pkg/a.py after/pkg/a.py\n--- before/pkg/a.py\n+++ after/pkg/a.py\n@@ -1 +1 @@\n-one\n+1\n"
    self.assertEqual(ud.apply({"pkg/a.py": "one\n"}, ru), {"pkg/a.py": "1\n"})

  def test_preamble_and_empty_patch(self):
    self.assertEqual(ud.apply({"a": "x\n"}, ""), {"a": "x\n"})
    mail = "From abc Mon Sep 17 00:00:00 2001\nSubject: [PATCH] fix\n\n---\n a | 2 +-\n\n" + ud.make(
        {"a": "x\n"}, {"a": "y\n"}) + "-- \n2.39.2\n"
    self.assertEqual(ud.apply({"a": "x\n"}, mail), {"a": "y\n"})

  def test_empty_new_and_deleted_files(self):
    text = ud.make({"gone.py": ""}, {"pkg/__init__.py": ""})
    self.assertEqual(text, "diff --git a/gone.py b/gone.py\ndeleted file mode 100644\n"
                           "diff --git a/pkg/__init__.py b/pkg/__init__.py\nnew file mode 100644\n")
    self.assertEqual(ud.apply({"gone.py": ""}, text), {"pkg/__init__.py": ""})

  def test_the_input_is_left_alone(self):
    files = {"a.py": "1\n"}
    ud.apply(files, ud.make(files, {"a.py": "2\n"}))
    self.assertEqual(files, {"a.py": "1\n"})

  @parameterized.named_parameters(
      ("context_mismatch", {"a.py": "one\ntwo\nthree\n"},
       "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n one\n-TWO\n+2\n", r"^Hunk 1 of a\.py \(@@ -1,2 \+1,2 @@\) does not "),
      ("second_hunk", {"a.py": "".join(f"{i}\n" for i in range(20))},
       "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-0\n+zero\n@@ -15 +15 @@\n-nope\n+x\n", r"^Hunk 2 of a\.py"),
      ("missing_file", {}, "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x\n+y\n", "a.py, which the repository lacks"),
      ("creates_existing", {"a.py": "x\n"}, "--- /dev/null\n+++ b/a.py\n@@ -0,0 +1 @@\n+y\n", "already holds"),
      ("delete_leaves_text", {"a.py": "x\ny\n"}, "--- a/a.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n",
       "leave 1 line of it"),
      ("binary", {"a.png": "x"}, "diff --git a/a.png b/a.png\nBinary files a/a.png and b/a.png differ\n",
       "change to a.png is binary"),
      ("escaping_path", {}, "--- /dev/null\n+++ b/../etc/x\n@@ -0,0 +1 @@\n+y\n", "not a relative path"),
      ("bad_hunk_header", {"a.py": "x\n"}, "--- a/a.py\n+++ b/a.py\n@@ -1 +1\n-x\n+y\n", "malformed header"),
      ("hunk_ends_early", {"a.py": "x\n"}, "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n-x\n+y\n", "ends early"),
      ("stray_line_in_hunk", {"a.py": "x\n"}, "--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,2 @@\n-x\n?\n+y\n", "malformed at"),
      ("not_a_diff", {}, "this is prose,\nnot a patch\n", "holds no file change"),
  )
  def test_refusals_name_the_file_and_hunk(self, files, patch, words):
    with self.assertRaisesRegex(PatchError, words) as caught:
      ud.apply(files, patch)
    message = str(caught.exception)
    self.assertEqual(message.count(". "), 0, message)  # one sentence
    self.assertTrue(message.endswith("."), message)



def _new_file(quoted: str) -> str:
  """A git patch creating the file whose C-quoted path (with its b/ prefix) is `quoted`."""
  return (f"diff --git {quoted.replace('b/', 'a/', 1)} {quoted}\nnew file mode 100644\n--- /dev/null\n"
          f"+++ {quoted}\n@@ -0,0 +1 @@\n+z\n")


class QuotedPathAttackTest(parameterized.TestCase):
  """A path is git's C quoting of UTF-8 bytes, no NUL among them: anything else is refused in one sentence."""

  @parameterized.named_parameters(
      ("nul_octal", _new_file('"b/x\\000y.py"'), "NUL"),
      ("nul_octal_at_the_end", _new_file('"b/x.py\\000"'), "NUL"),
      ("nul_in_rename_to", 'diff --git a/a.py b/b.py\nsimilarity index 100%\nrename from a.py\n'
       'rename to "b\\000.py"\n', "NUL"),
      ("raw_nul_unquoted", "--- /dev/null\n+++ b/x\0y.py\n@@ -0,0 +1 @@\n+z\n", "NUL"),
      ("escape_400", _new_file('"b/x\\400.py"'), "quoting is not git's"),
      ("escape_777", _new_file('"b/x\\777.py"'), "quoting is not git's"),
      ("escape_with_8_and_9", _new_file('"b/x\\189.py"'), "quoting is not git's"),
      ("escape_of_arabic_digits", _new_file('"b/x\\\u0661\u0662\u0663.py"'), "quoting is not git's"),
      ("bytes_not_utf8", _new_file('"b/x\\377\\376.py"'), "not UTF-8"),
      ("lone_surrogate_escape", _new_file('"b/x\\355\\240\\200.py"'), "not UTF-8"),
  )
  def test_refused(self, patch, words):
    with self.assertRaisesRegex(PatchError, words) as caught:
      ud.apply({"a.py": "x\n"}, patch)
    message = str(caught.exception)
    self.assertEqual(message.count(". "), 0, message)  # one sentence
    self.assertTrue(message.endswith("."), message)

  def test_valid_escapes_are_read(self):
    self.assertEqual(ud.apply({}, _new_file('"b/caf\\303\\251 \\"q\\"\\t.py"')), {'café "q"\t.py': "z\n"})


def _exhaustive_apply(text: str, hunks) -> str | None:
  """The offset search as the module docstring states it, by trying every position (the reference of the indexed
  search): each hunk at the position >= the end of the previous one nearest to its stated one plus the previous
  hunk's offset, the earlier on a tie; None when a hunk is not in the file."""
  lines = ud.split_lines(text)
  out, pos, offset = [], 0, 0
  for hunk in hunks:
    old, n = hunk.old, len(lines)
    stated = hunk.old_start if hunk.old_len == 0 else hunk.old_start - 1
    expected = min(max(stated + offset, pos), max(n - len(old), pos))
    found = [at for at in range(pos, n - len(old) + 1) if lines[at:at + len(old)] == old]
    if not found:
      return None
    at = min(found, key=lambda a: (abs(a - expected), a))
    out += lines[pos:at] + hunk.new
    pos, offset = at + len(old), at - stated
  return "".join(out + lines[pos:])


class OffsetSearchTest(parameterized.TestCase):

  @parameterized.parameters(range(6))
  def test_equals_the_exhaustive_search(self, seed):
    # Files of three distinct lines (so that hunks match in many places), hunks cut from the file or made up, stated
    # at random positions: the indexed search finds what trying every position finds.
    rng = random.Random(seed)
    for _ in range(60):
      lines = [rng.choice("abc") + "\n" for _ in range(rng.randint(0, 80))]
      hunks, at = [], 0
      for _ in range(rng.randint(1, 4)):
        m = rng.randint(0, 5)
        start = rng.randint(at, max(at, len(lines) - m)) if rng.random() < 0.8 else at
        old = lines[start:start + m] if rng.random() < 0.85 else [rng.choice("abc") + "\n" for _ in range(m)]
        body = tuple((" ", t) for t in old[:1]) + tuple(("-", t) for t in old[1:]) + (("+", "new\n"),)
        n_ctx = min(1, len(old))
        stated = max(0, start + rng.randint(-30, 30)) + (1 if m else 0)
        hunks.append(ud.Hunk(stated, len(old), stated, n_ctx + 1, body, f"@@ -{stated},{len(old)} @@"))
        at = start + m
      want = _exhaustive_apply("".join(lines), hunks)
      try:
        got = ud.apply_hunks("".join(lines), hunks, "f.py")
      except PatchError:
        got = None
      self.assertEqual(got, want, (lines, hunks))

  def test_thirty_kilobyte_patches_on_a_100k_line_file(self):
    # Each patch is ~30 KB; comparing the hunk at every position outward from the expected one took 14 to 31 s
    # here for each. The child process has 2 GiB of address space and 120 s in all.
    code = textwrap.dedent("""
        import json, resource, time
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        from c2jax.envs.tasks import unified_diff as ud
        N = 100_000
        cases = {}
        k = 10_000  # a hunk of 10,000 "x" lines and a "y": every position matches all but its last line
        cases["repeated_lines_refused"] = ({"f": "x\\n" * N + "z\\ny\\n"},
                                           "--- a/f\\n+++ b/f\\n@@ -1,%d +1,0 @@\\n" % (k + 1) + "-x\\n" * k
                                           + "-y\\n")
        cases["repeated_lines_matching_at_the_end"] = ({"f": "x\\n" * N + "y\\n"}, cases[
            "repeated_lines_refused"][1])
        distinct = "".join("line %d\\n" % i for i in range(N))
        cases["hunks_stated_half_the_file_away"] = ({"f": distinct}, "--- a/f\\n+++ b/f\\n" + "".join(
            "@@ -%d +%d @@\\n-line %d\\n+LINE %d\\n" % (s, s, 2 * h, 2 * h)
            for h, s in ((h, 1 if h % 2 == 0 else N // 2) for h in range(600))))
        pairs, lines = [], []
        for _ in range(N // 100):
            lines += ["b\\n", "a\\n"] * 49
            pairs.append(len(lines))
            lines += ["a\\n", "a\\n"]
        cases["frequent_lines_near_misses"] = ({"f": "".join(lines)}, "--- a/f\\n+++ b/f\\n" + "".join(
            "@@ -%d,2 +%d,2 @@\\n-a\\n+c\\n a\\n" % (at + 1 + 2 * (h % 2), at + 1 + 2 * (h % 2))
            for h, at in enumerate(pairs[:1000])))
        for name, (files, patch) in cases.items():
            start = time.perf_counter()
            try:
                out = ud.apply(files, patch)["f"].count("\\n")
            except ud.PatchError:
                out = "refused"
            print(json.dumps([name, len(patch), time.perf_counter() - start, out]), flush=True)
        """)
    env = {**os.environ, "PYTHONPATH": os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
      done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired as e:
      self.fail(f"the offset search ran past 120 s: {e.stdout}")
    self.assertEqual(done.returncode, 0, done.stderr[-2000:])
    results = {name: (size, seconds, out) for name, size, seconds, out in map(json.loads, done.stdout.splitlines())}
    self.assertEqual({k: v[2] for k, v in results.items()}, {
        "repeated_lines_refused": "refused", "repeated_lines_matching_at_the_end": 90_000,
        "hunks_stated_half_the_file_away": 100_000, "frequent_lines_near_misses": 100_000})
    for name, (size, seconds, _) in results.items():
      self.assertBetween(size, 20_000, 33_000, name)
      self.assertLess(seconds, 5.0, f"{name}: {seconds:.1f} s")


if __name__ == "__main__":
  absltest.main()
