import unittest

from calendar_utils.dates import day_of_year
from calendar_utils.leap import is_leap
from calendar_utils.months import days_in_month


class GregorianTest(unittest.TestCase):

    def test_centuries(self):
        self.assertFalse(is_leap(1900))
        self.assertFalse(is_leap(2100))
        self.assertTrue(is_leap(2000))
        self.assertTrue(is_leap(1600))

    def test_ordinary_years(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))

    def test_february(self):
        self.assertEqual(days_in_month(1900, 2), 28)
        self.assertEqual(days_in_month(2000, 2), 29)

    def test_day_of_year(self):
        self.assertEqual(day_of_year(2100, 3, 1), 60)
        with self.assertRaises(ValueError):
            day_of_year(1900, 2, 29)
