import unittest

from textstats import top_words, word_count
from textstats.tokenize import words


class WhitespaceTest(unittest.TestCase):

    def test_repeated_spaces(self):
        self.assertEqual(word_count("one  two   three"), 3)

    def test_newlines_and_tabs(self):
        self.assertEqual(word_count("one\ntwo\tthree\n"), 3)

    def test_empty_text(self):
        self.assertEqual(word_count("   "), 0)

    def test_punctuation_only_tokens_are_not_words(self):
        self.assertEqual(words("Hello , world !"), ["hello", "world"])

    def test_top_words_across_lines(self):
        self.assertEqual(top_words("Go go\n\ngo stop", n=1), [("go", 3)])

    def test_plain_sentence(self):
        self.assertEqual(word_count("The cat sat on the mat."), 6)
