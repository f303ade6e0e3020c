PUNCTUATION = ".,;:!?\"'()"


def words(text):
    """The words of `text`, lower-cased, with surrounding punctuation removed."""
    out = []
    for raw in text.split():
        word = raw.strip(PUNCTUATION).lower()
        if word:
            out.append(word)
    return out
