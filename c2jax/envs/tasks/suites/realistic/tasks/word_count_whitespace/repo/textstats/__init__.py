from textstats.stats import top_words, word_count

__all__ = ["top_words", "word_count"]
