import unittest

from durations.format import format_duration


class FormatTest(unittest.TestCase):

    def test_format(self):
        self.assertEqual(format_duration(5400), "1h30m")
        self.assertEqual(format_duration(7205), "2h5s")
        self.assertEqual(format_duration(0), "0s")


if __name__ == "__main__":
    unittest.main()
