import math
import signal
import unittest

from combinatorics.grid import count_paths
from combinatorics.stairs import ways


class Deadline:
    """Fails the block with TimeoutError after `seconds` (SIGALRM: the tests run in the main thread)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def _fire(self, signum, frame):
        raise TimeoutError(f"took more than {self.seconds}s")

    def __enter__(self):
        self.previous = signal.signal(signal.SIGALRM, self._fire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


def slow_ways(n, steps):
    table = [1] + [0] * n
    for i in range(1, n + 1):
        table[i] = sum(table[i - s] for s in steps if s <= i)
    return table[n]


class FastTest(unittest.TestCase):

    def test_grid(self):
        with Deadline(1.0):
            self.assertEqual(count_paths(60, 60), math.comb(118, 59))

    def test_stairs(self):
        with Deadline(1.0):
            self.assertEqual(ways(300), slow_ways(300, (1, 2)))
            self.assertEqual(ways(250, steps=(1, 3, 5)), slow_ways(250, (1, 3, 5)))

    def test_small_values(self):
        self.assertEqual(count_paths(2, 2), 2)
        self.assertEqual(count_paths(5, 0), 0)
        self.assertEqual(ways(0), 1)
        self.assertEqual(ways(10), 89)
