"""Integer sequences: Fibonacci numbers, triangular numbers and Collatz trajectories."""


def fibonacci(n):
    """The `n`-th Fibonacci number, counting fibonacci(0) == 0 and fibonacci(1) == 1."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def triangular(n):
    """The `n`-th triangular number 1 + 2 + ... + n."""
    return n * (n + 1) // 2


def collatz_length(start, limit=10_000):
    """The number of Collatz steps from `start` down to 1, giving up after `limit` steps."""
    n, steps = start, 0
    while n != 1 and steps < limit:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
