import math
import unittest

from geometry.area import area, total_area
from geometry.shapes import Circle, Rectangle, Square


class Triangle:

    def __init__(self, base, height):
        self.base, self.height = base, height

    def area(self):
        return self.base * self.height / 2


class PolymorphismTest(unittest.TestCase):

    def test_methods(self):
        self.assertAlmostEqual(Circle(2).area(), 4 * math.pi)
        self.assertEqual(Rectangle(2, 5).area(), 10)
        self.assertEqual(Square(3).area(), 9)

    def test_new_shape_through_functions(self):
        self.assertEqual(area(Triangle(4, 3)), 6)
        self.assertEqual(total_area([Triangle(2, 2), Square(2)]), 6)

    def test_existing_behaviour(self):
        self.assertAlmostEqual(area(Circle(1)), math.pi)
        self.assertAlmostEqual(total_area([Square(1), Rectangle(1, 2)]), 3)
