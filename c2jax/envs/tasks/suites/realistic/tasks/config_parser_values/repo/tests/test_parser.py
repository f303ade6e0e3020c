import unittest

from settings.parser import parse


class ParserTest(unittest.TestCase):

    def test_basic(self):
        text = "# server\nhost = example.com\nport = 8080\n\ndebug = true\nratio = 0.5\n"
        self.assertEqual(parse(text), {"host": "example.com", "port": 8080, "debug": True, "ratio": 0.5})

    def test_missing_equals(self):
        with self.assertRaises(ValueError):
            parse("oops")


if __name__ == "__main__":
    unittest.main()
