def delays(base, factor, count):
    """`count` delays: base, base * factor, base * factor ** 2, ..."""
    delay = base
    for _ in range(count):
        yield delay
        delay *= factor
