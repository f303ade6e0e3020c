import unittest

from linalg import Matrix
from linalg.vector import dot


class MatrixTest(unittest.TestCase):

    def test_shape_add(self):
        m = Matrix([[1, 2, 3], [4, 5, 6]])
        self.assertEqual(m.shape, (2, 3))
        self.assertEqual(m + m, Matrix([[2, 4, 6], [8, 10, 12]]))

    def test_ragged(self):
        with self.assertRaises(ValueError):
            Matrix([[1], [2, 3]])

    def test_dot(self):
        self.assertEqual(dot([1, 2], [3, 4]), 11)


if __name__ == "__main__":
    unittest.main()
