import unittest

from combinatorics.grid import count_paths
from combinatorics.stairs import ways


class CountsTest(unittest.TestCase):

    def test_grid(self):
        self.assertEqual(count_paths(1, 5), 1)
        self.assertEqual(count_paths(3, 3), 6)
        self.assertEqual(count_paths(0, 3), 0)

    def test_stairs(self):
        self.assertEqual(ways(4), 5)
        self.assertEqual(ways(4, steps=(1, 3)), 3)


if __name__ == "__main__":
    unittest.main()
