import unittest

from records.dedupe import dedupe
from records.merge import merge_sources


class DedupeTest(unittest.TestCase):

    def test_order(self):
        self.assertEqual(dedupe([3, 1, 3, 2, 1]), [3, 1, 2])

    def test_merge(self):
        self.assertEqual(merge_sources(["a", "b"], ["b", "c"], ["a"]), ["a", "b", "c"])


if __name__ == "__main__":
    unittest.main()
