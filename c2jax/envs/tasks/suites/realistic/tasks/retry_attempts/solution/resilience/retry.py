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
            for attempt, delay in enumerate(delays(base_delay, factor, times)):
                try:
                    return fn(*args, **kwargs)
                except exceptions:
                    if attempt == times - 1:
                        raise
                    sleep(delay)
            raise ValueError("times must be at least 1")

        return wrapper

    return decorate
