import unittest

from units.convert import convert
from units.errors import IncompatibleUnits


class LengthTest(unittest.TestCase):

    def test_metric(self):
        self.assertAlmostEqual(convert(1.5, "km", "m"), 1500)
        self.assertAlmostEqual(convert(250, "cm", "m"), 2.5)

    def test_imperial(self):
        self.assertAlmostEqual(convert(1, "mi", "km"), 1.609344)
        self.assertAlmostEqual(convert(3, "ft", "cm"), 91.44)
        self.assertAlmostEqual(convert(1, "mi", "ft"), 5280)

    def test_no_mixing_dimensions(self):
        with self.assertRaises(IncompatibleUnits):
            convert(1, "kg", "m")

    def test_mass_unchanged(self):
        self.assertAlmostEqual(convert(1, "kg", "lb"), 2.2046226218)
