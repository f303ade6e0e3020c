def dot(a, b):
    if len(a) != len(b):
        raise ValueError("vectors differ in length")
    return sum(x * y for x, y in zip(a, b))
