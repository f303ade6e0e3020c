import unittest

from mathx.algebra import gcd, lcm
from mathx.sequences import collatz_length, fibonacci, triangular


class MathxTest(unittest.TestCase):

    def test_algebra(self):
        self.assertEqual(gcd(12, 18), 6)
        self.assertEqual(lcm(4, 6), 12)

    def test_sequences(self):
        self.assertEqual([fibonacci(i) for i in range(7)], [0, 1, 1, 2, 3, 5, 8])
        self.assertEqual(triangular(4), 10)
        self.assertEqual(collatz_length(6), 8)


if __name__ == "__main__":
    unittest.main()
