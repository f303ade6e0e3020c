def ways(n, steps=(1, 2)):
    """Ways to climb n stairs taking any of `steps` at a time (order matters)."""
    if n == 0:
        return 1
    if n < 0:
        return 0
    return sum(ways(n - s, steps) for s in steps)
