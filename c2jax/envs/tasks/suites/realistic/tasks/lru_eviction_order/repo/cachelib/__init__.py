from cachelib.lru import LRUCache
from cachelib.memo import memoize

__all__ = ["LRUCache", "memoize"]
