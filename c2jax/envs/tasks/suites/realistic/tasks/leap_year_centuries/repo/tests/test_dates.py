import unittest

from calendar_utils.dates import day_of_year
from calendar_utils.months import days_in_month


class DatesTest(unittest.TestCase):

    def test_days_in_month(self):
        self.assertEqual(days_in_month(2023, 2), 28)
        self.assertEqual(days_in_month(2024, 2), 29)
        self.assertEqual(days_in_month(2023, 4), 30)

    def test_day_of_year(self):
        self.assertEqual(day_of_year(2023, 3, 1), 60)
        self.assertEqual(day_of_year(2024, 12, 31), 366)


if __name__ == "__main__":
    unittest.main()
