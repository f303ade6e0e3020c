import unittest

from units.convert import convert
from units.errors import UnknownUnit


class ConvertTest(unittest.TestCase):

    def test_mass(self):
        self.assertAlmostEqual(convert(2, "kg", "g"), 2000)
        self.assertAlmostEqual(convert(1, "lb", "oz"), 16)

    def test_unknown(self):
        with self.assertRaises(UnknownUnit):
            convert(1, "kg", "stone")


if __name__ == "__main__":
    unittest.main()
