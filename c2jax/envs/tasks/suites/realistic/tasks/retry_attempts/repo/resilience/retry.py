import functools
import time

from resilience.backoff import delays


def retry(times=3, exceptions=(Exception,), base_delay=0.0, factor=2.0, sleep=time.sleep):
    """Calls the function up to `times` times in all, sleeping with exponential backoff between attempts.

    Exceptions not in `exceptions` propagate at once; after the last attempt the last exception propagates.
    """

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            last = None
            for delay in delays(base_delay, factor, times - 1):
                try:
                    return fn(*args, **kwargs)
                except exceptions as e:
                    last = e
                    sleep(delay)
            raise last

        return wrapper

    return decorate
