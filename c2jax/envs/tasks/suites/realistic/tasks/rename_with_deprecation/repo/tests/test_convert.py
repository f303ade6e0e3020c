import unittest

from temperature.convert import c2f, f2c
from temperature.report import daily_report


class ConvertTest(unittest.TestCase):

    def test_round_trip(self):
        self.assertEqual(c2f(100), 212)
        self.assertEqual(f2c(32), 0)

    def test_report(self):
        self.assertEqual(daily_report([0, 37]), ["0.0C = 32.0F", "37.0C = 98.6F"])


if __name__ == "__main__":
    unittest.main()
