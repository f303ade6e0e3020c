import unittest

from slugs.slugify import slugify
from slugs.unique import unique_slug


class SlugTest(unittest.TestCase):

    def test_slugify(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")
        self.assertEqual(slugify("  Caf\u00e9 -- au lait "), "cafe-au-lait")

    def test_unique(self):
        self.assertEqual(unique_slug("A b", {"a-b", "a-b-2"}), "a-b-3")


if __name__ == "__main__":
    unittest.main()
