import unittest

from shortener.errors import AliasTakenError
from shortener.service import Shortener


class AliasTest(unittest.TestCase):

    def test_alias(self):
        s = Shortener()
        self.assertEqual(s.shorten("https://a.org", alias="my-link"), "my-link")
        self.assertEqual(s.resolve("my-link"), "https://a.org")

    def test_taken(self):
        s = Shortener()
        s.shorten("https://a.org", alias="dup")
        with self.assertRaises(AliasTakenError):
            s.shorten("https://b.org", alias="dup")
        self.assertEqual(s.resolve("dup"), "https://a.org")

    def test_invalid(self):
        s = Shortener()
        for alias in ["ab", "x" * 21, "has space", "semi;colon", ""]:
            with self.assertRaises(ValueError, msg=alias):
                s.shorten("https://a.org", alias=alias)

    def test_generated_codes_still_work(self):
        s = Shortener()
        code = s.shorten("https://c.org")
        self.assertEqual(s.resolve(code), "https://c.org")
