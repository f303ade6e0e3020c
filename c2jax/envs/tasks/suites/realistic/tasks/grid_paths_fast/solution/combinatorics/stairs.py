def ways(n, steps=(1, 2)):
    """Ways to climb n stairs taking any of `steps` at a time (order matters)."""
    if n < 0:
        return 0
    table = [1] + [0] * n  # table[i]: ways to climb i stairs
    for i in range(1, n + 1):
        table[i] = sum(table[i - s] for s in steps if s <= i)
    return table[n]
