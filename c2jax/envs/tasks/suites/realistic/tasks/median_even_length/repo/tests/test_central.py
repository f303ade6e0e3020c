import unittest

from stats.central import mean, median, mode
from stats.summary import describe


class CentralTest(unittest.TestCase):

    def test_odd_median(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_mean_mode(self):
        self.assertEqual(mean([1, 2, 3, 6]), 3)
        self.assertEqual(mode([1, 2, 2, 3]), 2)

    def test_describe(self):
        self.assertEqual(describe([5, 1, 3]), {"n": 3, "mean": 3, "median": 3, "min": 1, "max": 5})


if __name__ == "__main__":
    unittest.main()
