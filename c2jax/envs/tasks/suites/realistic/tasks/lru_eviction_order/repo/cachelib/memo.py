import functools

from cachelib.lru import LRUCache


def memoize(capacity=128):
    """Caches a function's results by its positional arguments in an LRUCache."""

    def decorate(fn):
        cache = LRUCache(capacity)
        missing = object()

        @functools.wraps(fn)
        def wrapper(*args):
            value = cache.get(args, missing)
            if value is missing:
                value = fn(*args)
                cache.put(args, value)
            return value

        wrapper.cache = cache
        return wrapper

    return decorate
