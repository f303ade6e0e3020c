import unittest

from shortener.codes import encode
from shortener.service import Shortener


class ServiceTest(unittest.TestCase):

    def test_encode(self):
        self.assertEqual(encode(0), "0")
        self.assertEqual(encode(61), "Z")
        self.assertEqual(encode(62), "10")

    def test_round_trip(self):
        s = Shortener()
        code = s.shorten("https://example.com/a")
        self.assertEqual(s.resolve(code), "https://example.com/a")

    def test_rejects_other_schemes(self):
        with self.assertRaises(ValueError):
            Shortener().shorten("ftp://x")


if __name__ == "__main__":
    unittest.main()
