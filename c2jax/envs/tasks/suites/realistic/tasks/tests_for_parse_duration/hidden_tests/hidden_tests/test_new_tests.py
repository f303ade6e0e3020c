import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MUTANTS = {'hours_as_minutes': ('_SECONDS = {"h": 3600,', '_SECONDS = {"h": 60,'), 'seconds_ignored': ('return sum(int(n) * _SECONDS[u] for n, u in parts)', 'return sum(int(n) * _SECONDS[u] for n, u in parts if u != "s")'), 'accepts_garbage': ('        raise ValueError(f"bad duration {text!r}")\n', '        return 0\n'), 'accepts_repeats': ('        raise ValueError(f"bad duration {text!r}: units repeat or are out of order")\n', '        pass\n')}


# durations/parse.py rewritten (names, layout, loop) with the same behaviour and messages: tests that check the
# code's text or hash instead of its behaviour fail here.
EQUIVALENT = '''"""Parsing durations like '1h30m'."""

import re

_SECONDS = {"h": 60 * 60, "m": 60, "s": 1}
_ORDER = "hms"
_PART = re.compile(r"(\\d+)([hms])")


def parse_duration(text):
    """'1h30m' -> 5400, '45s' -> 45, '2h5s' -> 7205. Units h, m, s, each at most once, in that order.

    Raises ValueError for anything else (including the empty string).
    """
    text = text.strip()
    parts = _PART.findall(text)
    rebuilt = "".join(number + unit for number, unit in parts)
    if rebuilt != text or not text:
        raise ValueError(f"bad duration {text!r}")
    units = [unit for _, unit in parts]
    if len(set(units)) != len(units) or units != sorted(units, key=_ORDER.index):
        raise ValueError(f"bad duration {text!r}: units repeat or are out of order")
    total = 0
    for number, unit in parts:
        total += int(number) * _SECONDS[unit]
    return total
'''


def run_tests(parse_source=None):
    """Runs tests/test_parse.py in a copy of the repository, optionally with a mutated durations/parse.py."""
    work = pathlib.Path(tempfile.mkdtemp())
    try:
        for name in ("durations", "tests"):
            shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        if parse_source is not None:
            (work / "durations" / "parse.py").write_text(parse_source)
        proc = subprocess.run([sys.executable, "-m", "unittest", "-v", "tests.test_parse"], cwd=work,
                              capture_output=True, text=True, timeout=20,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        ran = re.findall(r"^Ran (\d+) test", proc.stderr, re.M)
        return proc.returncode, int(ran[-1]) if ran else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


class NewTestsTest(unittest.TestCase):

    def test_file_exists(self):
        self.assertTrue((ROOT / "tests" / "test_parse.py").is_file())

    def test_pass_on_real_code(self):
        code, ran = run_tests()
        self.assertEqual(code, 0)
        self.assertGreaterEqual(ran, 4)

    def test_pass_on_equivalent_code(self):
        code, ran = run_tests(EQUIVALENT)
        self.assertEqual(code, 0, "the tests fail on a rewrite of parse.py that behaves the same")
        self.assertGreaterEqual(ran, 4)

    def test_catch_mutants(self):
        source = (ROOT / "durations" / "parse.py").read_text()
        for name, (old, new) in MUTANTS.items():
            with self.subTest(mutant=name):
                code, _ = run_tests(source.replace(old, new))
                self.assertNotEqual(code, 0, f"the tests do not catch the mutant {name}")
