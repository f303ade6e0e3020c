import unittest

from stats.central import median
from stats.summary import describe


class MedianTest(unittest.TestCase):

    def test_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)
        self.assertEqual(median([10, 0]), 5)

    def test_odd(self):
        self.assertEqual(median([7, 1, 3]), 3)

    def test_empty(self):
        with self.assertRaises(ValueError):
            median([])

    def test_describe_even(self):
        self.assertEqual(describe([4, 1, 3, 2])["median"], 2.5)

    def test_generator_input(self):
        self.assertEqual(median(x for x in [5, 6]), 5.5)
