from collections import Counter

from textstats.tokenize import words


def word_count(text):
    return len(words(text))


def top_words(text, n=3):
    """The `n` most common words as (word, count), most common first, ties in order of first appearance."""
    return Counter(words(text)).most_common(n)
