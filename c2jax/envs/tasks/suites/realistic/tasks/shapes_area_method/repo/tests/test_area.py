import math
import unittest

from geometry.area import area, total_area
from geometry.shapes import Circle, Rectangle, Square


class AreaTest(unittest.TestCase):

    def test_each(self):
        self.assertAlmostEqual(area(Circle(1)), math.pi)
        self.assertEqual(area(Rectangle(2, 3)), 6)
        self.assertEqual(area(Square(4)), 16)

    def test_total(self):
        self.assertAlmostEqual(total_area([Square(1), Rectangle(1, 2)]), 3)


if __name__ == "__main__":
    unittest.main()
