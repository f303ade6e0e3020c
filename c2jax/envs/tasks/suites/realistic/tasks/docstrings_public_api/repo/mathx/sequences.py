def fibonacci(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def triangular(n):
    return n * (n + 1) // 2


def collatz_length(start, limit=10_000):
    n, steps = start, 0
    while n != 1 and steps < limit:
        n = n // 2 if n % 2 == 0 else 3 * n + 1
        steps += 1
    return steps
