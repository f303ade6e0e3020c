import unittest

from cachelib import LRUCache, memoize


class RecencyTest(unittest.TestCase):

    def test_get_refreshes(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertEqual(cache.get("a"), 1)
        cache.put("c", 3)
        self.assertIn("a", cache)
        self.assertNotIn("b", cache)

    def test_update_refreshes_without_growing(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        cache.put("a", 10)
        self.assertEqual(len(cache), 2)
        cache.put("c", 3)
        self.assertEqual(cache.get("a"), 10)
        self.assertNotIn("b", cache)

    def test_miss_does_not_change_order(self):
        cache = LRUCache(2)
        cache.put("a", 1)
        cache.put("b", 2)
        self.assertIsNone(cache.get("zzz"))
        cache.put("c", 3)
        self.assertNotIn("a", cache)

    def test_memoized_hot_key_survives(self):
        calls = []

        @memoize(capacity=2)
        def ident(x):
            calls.append(x)
            return x

        ident(1)
        ident(2)
        ident(1)
        ident(3)
        ident(1)
        self.assertEqual(calls, [1, 2, 3])
