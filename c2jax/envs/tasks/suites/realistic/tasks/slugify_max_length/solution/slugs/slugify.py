import re
import unicodedata


def slugify(text, max_length=None):
    """'Hello, World!' -> 'hello-world': ASCII letters and digits joined by single dashes."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    if max_length is None or len(slug) <= max_length:
        return slug
    cut = slug[:max_length]
    if slug[max_length] != "-" and "-" in cut:
        cut = cut.rsplit("-", 1)[0]  # the last word does not fit whole: drop it
    return cut.strip("-")
