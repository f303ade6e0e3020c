import re
import unicodedata


def slugify(text):
    """'Hello, World!' -> 'hello-world': ASCII letters and digits joined by single dashes."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
