import unittest

from cachelib import LRUCache, memoize


class LRUTest(unittest.TestCase):

    def test_capacity(self):
        cache = LRUCache(2)
        for k in "abc":
            cache.put(k, k.upper())
        self.assertEqual(len(cache), 2)
        self.assertNotIn("a", cache)
        self.assertEqual(cache.get("c"), "C")

    def test_memoize(self):
        calls = []

        @memoize(capacity=4)
        def square(x):
            calls.append(x)
            return x * x

        self.assertEqual([square(3), square(3), square(4)], [9, 9, 16])
        self.assertEqual(calls, [3, 4])


if __name__ == "__main__":
    unittest.main()
