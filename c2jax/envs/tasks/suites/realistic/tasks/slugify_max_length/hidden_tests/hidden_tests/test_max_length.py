import unittest

from slugs.slugify import slugify


class MaxLengthTest(unittest.TestCase):

    def test_word_boundary(self):
        self.assertEqual(slugify("Hello World Again", max_length=12), "hello-world")

    def test_exact_fit(self):
        self.assertEqual(slugify("Hello World", max_length=11), "hello-world")

    def test_hard_cut(self):
        self.assertEqual(slugify("Supercalifragilistic", max_length=5), "super")

    def test_no_trailing_dash(self):
        self.assertEqual(slugify("ab cd", max_length=3), "ab")

    def test_default_unlimited(self):
        long = " ".join(["word"] * 40)
        self.assertEqual(len(slugify(long)), 40 * 5 - 1)
