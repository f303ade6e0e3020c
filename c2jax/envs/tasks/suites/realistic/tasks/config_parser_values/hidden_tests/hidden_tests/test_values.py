import os
import tempfile
import unittest

from settings.loader import load
from settings.parser import parse


class ValuesTest(unittest.TestCase):

    def test_equals_in_value(self):
        self.assertEqual(parse("url = https://x.org/?a=1&b=2"), {"url": "https://x.org/?a=1&b=2"})

    def test_inline_comment(self):
        self.assertEqual(parse("port = 80  # the web port"), {"port": 80})

    def test_hash_inside_value_is_kept(self):
        self.assertEqual(parse("color = #ff0000"), {"color": "#ff0000"})

    def test_loader(self):
        fd, path = tempfile.mkstemp(suffix=".cfg")
        with os.fdopen(fd, "w") as f:
            f.write("# top\nname = demo # trailing\nquery = a=b\n")
        try:
            self.assertEqual(load(path), {"name": "demo", "query": "a=b"})
        finally:
            os.remove(path)

    def test_basic_still_works(self):
        self.assertEqual(parse("debug = false\n\n# x\nn = 3"), {"debug": False, "n": 3})
