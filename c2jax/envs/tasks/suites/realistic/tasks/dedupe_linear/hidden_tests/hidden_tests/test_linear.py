import unittest

from records.dedupe import dedupe
from records.merge import merge_sources


class Key:
    """A hashable value that counts equality comparisons."""

    comparisons = 0

    def __init__(self, value):
        self.value = value

    def __hash__(self):
        return hash(self.value)

    def __eq__(self, other):
        Key.comparisons += 1
        return isinstance(other, Key) and self.value == other.value


class LinearTest(unittest.TestCase):

    def test_comparisons_grow_linearly(self):
        n = 600
        items = [Key(i) for i in range(n)] + [Key(i) for i in range(0, n, 2)]
        Key.comparisons = 0
        out = dedupe(items)
        self.assertEqual([k.value for k in out], list(range(n)))
        self.assertLess(Key.comparisons, 3 * n)

    def test_order_kept(self):
        self.assertEqual(dedupe(["b", "a", "b", "c", "a"]), ["b", "a", "c"])

    def test_generator_input(self):
        self.assertEqual(merge_sources(iter([1, 2]), (x for x in [2, 3])), [1, 2, 3])
