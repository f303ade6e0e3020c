import unittest
import warnings

from temperature import convert
from temperature.report import daily_report


class RenameTest(unittest.TestCase):

    def test_new_names(self):
        self.assertEqual(convert.celsius_to_fahrenheit(100), 212)
        self.assertEqual(convert.fahrenheit_to_celsius(212), 100)

    def test_old_names_warn(self):
        for old, arg, want in [(convert.c2f, 0, 32), (convert.f2c, 32, 0)]:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.assertEqual(old(arg), want)
            self.assertTrue(any(issubclass(w.category, DeprecationWarning) for w in caught), old)

    def test_report_uses_new_names(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            self.assertEqual(daily_report([100]), ["100.0C = 212.0F"])
