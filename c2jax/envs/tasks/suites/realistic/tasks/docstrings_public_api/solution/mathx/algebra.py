"""Integer algebra: greatest common divisors and least common multiples."""


def gcd(a, b):
    """The greatest common divisor of integers `a` and `b` (never negative; gcd(0, 0) is 0)."""
    while b:
        a, b = b, a % b
    return abs(a)


def lcm(a, b):
    """The least common multiple of integers `a` and `b` (never negative; 0 when either is 0)."""
    if a == 0 or b == 0:
        return 0
    return abs(a * b) // gcd(a, b)


def _check(n):
    if n < 0:
        raise ValueError("negative")
