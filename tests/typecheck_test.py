"""The type check of the pure layers (mypy.ini) against a baseline that only shrinks.

mypy, pinned in setup.py's test extra and run by the interpreter that runs the suite, checks c2jax/rl,
c2jax/rollouts, c2jax/model, c2jax/typed_config.py and c2jax/registry.py. Each error it reports is keyed by file,
error code and message, without its line (an edit elsewhere in the file moves no key), and counted;
tests/typecheck_baseline.txt holds the errors known today. A new error fails the test, and so does an entry of the
baseline that mypy no longer reports, so that the baseline shrinks as the code is fixed:

  C2JAX_UPDATE_MYPY_BASELINE=1 .venv/bin/python -m pytest tests/typecheck_test.py    # rewrites the baseline

mypy's cache goes to a temporary directory removed at the end, so the suite writes nothing into the checkout and every
run checks from scratch as CI does (a cold run: ~15 s on 2 cores); C2JAX_MYPY_CACHE=<dir> keeps it across runs
(`make test-unit` keeps it in ~/.cache/c2jax/mypy). The baseline lives beside this file, not in tests/golden/, whose
files are the config snapshots of tests/configs_test.py.
"""

import collections
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "mypy.ini"
BASELINE = pathlib.Path(__file__).resolve().parent / "typecheck_baseline.txt"
_UPDATE = bool(os.environ.get("C2JAX_UPDATE_MYPY_BASELINE"))
_REWRITE = "C2JAX_UPDATE_MYPY_BASELINE=1 .venv/bin/python -m pytest tests/typecheck_test.py"
# The packages whose types the messages spell out: under other versions the same error may read differently.
_RECORDED = ("mypy", "jax", "numpy", "flax")
_RECORDED_PREFIX = "# Recorded with "

# `path:line[:column...]: severity: message  [code]`, as mypy prints without --pretty.
_LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+)(?::\d+)*: (?P<severity>error|note): (?P<message>.*?)"
                   r"(?:  \[(?P<code>[a-z0-9-]+)\])?$")
# A note about a whole file or the configuration (`mypy.ini: note: ...`).
_FILE_NOTE = re.compile(r"^[^:]+: note: ")


def run_mypy(cache_dir: str, *extra: str) -> subprocess.CompletedProcess:
  """mypy on mypy.ini's files, from the checkout's root, printing one line per error."""
  command = [sys.executable, "-m", "mypy", "--config-file", str(CONFIG), "--cache-dir", cache_dir,
             # The site-packages of this interpreter, also where it is not Python 3.11 (mypy.ini's python_version):
             # without it mypy would look for another interpreter of that version.
             "--python-executable", sys.executable,
             "--no-pretty", "--no-error-summary", "--show-error-codes", "--hide-error-context", "--no-color-output",
             *extra]
  return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def error_keys(output: str) -> tuple[collections.Counter, list[str]]:
  """({`path [code] message`: count} of mypy's errors, the lines of `output` that are neither error nor note)."""
  keys, unread = collections.Counter(), []
  for line in output.splitlines():
    if not line.strip() or _FILE_NOTE.match(line):
      continue
    match = _LINE.match(line)
    if match is None:
      unread.append(line)
      continue
    if match["severity"] != "error":
      continue
    path = pathlib.Path(match["path"])
    if path.is_absolute() and path.is_relative_to(ROOT):
      path = path.relative_to(ROOT)
    # A message that names another line ("defined on line 12") keeps no line either.
    message = re.sub(r"\bline \d+", "line N", match["message"])
    keys[f"{path.as_posix()} [{match['code'] or 'misc'}] {message}"] += 1
  return keys, unread


def _ran(result: subprocess.CompletedProcess, got: collections.Counter) -> bool:
  # Exit status 0: no error, 1: errors; 2 is a crash or a configuration error, and 1 with no error line is mypy not
  # starting (e.g. not installed).
  return result.returncode == 0 or (result.returncode == 1 and bool(got))


def read_baseline(path: pathlib.Path) -> tuple[collections.Counter, dict[str, str]]:
  """({key: count}, {package: version it was recorded with})."""
  keys, versions = collections.Counter(), {}
  for line in path.read_text(encoding="utf-8").splitlines():
    if line.startswith(_RECORDED_PREFIX):
      versions = dict(item.split(" ", 1) for item in line[len(_RECORDED_PREFIX):].rstrip(".").split(", "))
    if not line.strip() or line.startswith("#"):
      continue
    count, key = line.split(" ", 1)
    keys[key] += int(count)
  return keys, versions


def installed_versions() -> dict[str, str]:
  return {name: importlib.metadata.version(name) for name in _RECORDED}


def write_baseline(path: pathlib.Path, keys: collections.Counter) -> None:
  versions = ", ".join(f"{name} {version}" for name, version in installed_versions().items())
  header = [
      "# mypy's errors in the pure layers (mypy.ini) known today, one `count path [code] message` a line.",
      "# tests/typecheck_test.py fails on an error that is not here, and on an entry mypy no longer reports;",
      f"# after a fix, rewrite this file: {_REWRITE}",
      f"{_RECORDED_PREFIX}{versions}.",
  ]
  path.write_text("\n".join(header + [f"{keys[k]} {k}" for k in sorted(keys)]) + "\n", encoding="utf-8")


def _listed(keys: collections.Counter) -> str:
  return "".join(f"\n  {key}" + (f"  (x{keys[key]})" if keys[key] > 1 else "") for key in sorted(keys))


def new_errors(got: collections.Counter, baseline: collections.Counter) -> str | None:
  """One sentence naming the errors `got` holds beyond `baseline`, or None."""
  new = got - baseline
  if not new:
    return None
  return (f"mypy reports {new.total()} error(s) that {BASELINE.name} does not hold: fix them (`.venv/bin/python -m "
          f"mypy` shows their lines); the baseline takes no new entries.{_listed(new)}")


def stale_entries(got: collections.Counter, baseline: collections.Counter) -> str | None:
  """One sentence naming the entries of `baseline` that `got` no longer holds, or None."""
  stale = baseline - got
  if not stale:
    return None
  return (f"{BASELINE.name} holds {stale.total()} error(s) that mypy no longer reports: the baseline only shrinks, "
          f"rewrite it with `{_REWRITE}` and commit it.{_listed(stale)}")


class TypecheckTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    if importlib.util.find_spec("mypy") is None:
      raise AssertionError(f"mypy is not installed in {sys.executable}: `pip install -e .[test]` installs the pinned "
                           "one.")
    cls.cache_dir = os.environ.get("C2JAX_MYPY_CACHE") or tempfile.mkdtemp(prefix="c2jax-mypy-cache-")
    os.makedirs(cls.cache_dir, exist_ok=True)
    cls.result = run_mypy(cls.cache_dir)
    cls.got, cls.unread = error_keys(cls.result.stdout)
    if _UPDATE and _ran(cls.result, cls.got) and not cls.unread:
      write_baseline(BASELINE, cls.got)

  @classmethod
  def tearDownClass(cls):
    if not os.environ.get("C2JAX_MYPY_CACHE"):
      shutil.rmtree(cls.cache_dir, ignore_errors=True)
    super().tearDownClass()

  def _check_ran(self, result: subprocess.CompletedProcess, got: collections.Counter, unread: list[str]) -> None:
    self.assertTrue(_ran(result, got),
                    f"mypy did not run to the end (exit status {result.returncode}):\n{result.stdout}{result.stderr}")
    self.assertEmpty(unread, "mypy printed lines this test cannot read (a changed output format?):\n"
                     + "\n".join(unread))

  def _version_hint(self) -> str:
    recorded = read_baseline(BASELINE)[1]
    differ = [f"{name} {recorded.get(name, '?')} there, {version} here"
              for name, version in installed_versions().items() if recorded.get(name) != version]
    return (f"\nThe baseline was recorded under other versions ({'; '.join(differ)}): where an entry only reads "
            "differently, rewrite it." if differ else "")

  def test_mypy_runs_and_its_output_is_read(self):
    self._check_ran(self.result, self.got, self.unread)

  def test_no_error_beyond_the_baseline(self):
    self._check_ran(self.result, self.got, self.unread)
    self.assertTrue(BASELINE.exists(), f"{BASELINE} is missing: write it with `{_REWRITE}`.")
    problem = new_errors(self.got, read_baseline(BASELINE)[0])
    if problem:
      self.fail(problem + self._version_hint())

  def test_every_baseline_entry_is_still_reported(self):
    self._check_ran(self.result, self.got, self.unread)
    self.assertTrue(BASELINE.exists(), f"{BASELINE} is missing: write it with `{_REWRITE}`.")
    problem = stale_entries(self.got, read_baseline(BASELINE)[0])
    if problem:
      self.fail(problem + self._version_hint())

  @pytest.mark.slow
  def test_a_planted_type_error_fails(self):
    # A copy of c2jax/rl/kl.py that calls its own k3 estimator with a string for an array, read by mypy in place of
    # the file (--shadow-file): the error is keyed to the real path, as one in the file would be.
    source = ROOT / "c2jax" / "rl" / "kl.py"
    with tempfile.TemporaryDirectory() as tmp:
      planted = pathlib.Path(tmp) / "kl.py"
      planted.write_text(source.read_text(encoding="utf-8") + '\n\n_PLANTED = k3("log_r")\n',
                         encoding="utf-8")
      result = run_mypy(self.cache_dir, "--shadow-file", str(source.relative_to(ROOT)), str(planted))
    got, unread = error_keys(result.stdout)
    self._check_ran(result, got, unread)
    want = {'c2jax/rl/kl.py [arg-type] Argument 1 to "k3" has incompatible type "str"; expected "Array"': 1}
    self.assertEqual(got - self.got, collections.Counter(want))
    problem = new_errors(got, self.got)
    self.assertIsNotNone(problem)
    self.assertIn("mypy reports 1 error(s) that typecheck_baseline.txt does not hold", problem)
    self.assertIn("\n  " + next(iter(want)), problem)
    # And once fixed, the entries are stale in a baseline that still holds them.
    problem = stale_entries(self.got, got)
    self.assertIsNotNone(problem)
    self.assertIn("holds 1 error(s) that mypy no longer reports", problem)
    self.assertIn("C2JAX_UPDATE_MYPY_BASELINE=1", problem)

  def test_keys_hold_no_line_and_count_duplicates(self):
    output = ("c2jax/rl/kl.py:12: error: Name \"x\" already defined on line 3  [no-redef]\n"
              "c2jax/rl/kl.py:40: note: See https://mypy.readthedocs.io\n"
              f"{ROOT}/c2jax/rl/kl.py:99:7: error: Name \"x\" already defined on line 5  [no-redef]\n")
    got, unread = error_keys(output)
    self.assertEmpty(unread)
    self.assertEqual(got, {'c2jax/rl/kl.py [no-redef] Name "x" already defined on line N': 2})


if __name__ == "__main__":
  absltest.main()
