import unittest

from linalg import Matrix


class MatmulTest(unittest.TestCase):

    def test_transpose(self):
        self.assertEqual(Matrix([[1, 2, 3], [4, 5, 6]]).transpose(), Matrix([[1, 4], [2, 5], [3, 6]]))

    def test_matmul(self):
        a = Matrix([[1, 2], [3, 4]])
        b = Matrix([[5, 6], [7, 8]])
        self.assertEqual(a @ b, Matrix([[19, 22], [43, 50]]))

    def test_rectangular(self):
        a = Matrix([[1, 2, 3]])
        b = Matrix([[1], [0], [2]])
        self.assertEqual(a @ b, Matrix([[7]]))
        self.assertEqual((b @ a).shape, (3, 3))

    def test_mismatch(self):
        with self.assertRaises(ValueError):
            Matrix([[1, 2]]) @ Matrix([[1, 2]])

    def test_identity(self):
        a = Matrix([[2, 0], [1, 3]])
        self.assertEqual(a @ Matrix([[1, 0], [0, 1]]), a)
