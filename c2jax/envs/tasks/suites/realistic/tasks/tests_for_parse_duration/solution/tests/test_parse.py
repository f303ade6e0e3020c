import unittest

from durations.parse import parse_duration


class ParseTest(unittest.TestCase):

    def test_single_units(self):
        self.assertEqual(parse_duration("2h"), 7200)
        self.assertEqual(parse_duration("3m"), 180)
        self.assertEqual(parse_duration("45s"), 45)

    def test_combined(self):
        self.assertEqual(parse_duration("1h30m"), 5400)
        self.assertEqual(parse_duration("2h5s"), 7205)
        self.assertEqual(parse_duration("1h1m1s"), 3661)

    def test_whitespace_is_trimmed(self):
        self.assertEqual(parse_duration(" 10m "), 600)

    def test_invalid(self):
        for text in ["", "abc", "10", "5x", "1h 30m", "-5s"]:
            with self.assertRaises(ValueError, msg=text):
                parse_duration(text)

    def test_repeated_or_unordered_units(self):
        for text in ["1h2h", "30m1h", "5s5s"]:
            with self.assertRaises(ValueError, msg=text):
                parse_duration(text)


if __name__ == "__main__":
    unittest.main()
