import unittest

from textstats import top_words, word_count


class StatsTest(unittest.TestCase):

    def test_word_count(self):
        self.assertEqual(word_count("The cat sat on the mat."), 6)

    def test_top_words(self):
        self.assertEqual(top_words("a b a c a b", n=2), [("a", 3), ("b", 2)])


if __name__ == "__main__":
    unittest.main()
