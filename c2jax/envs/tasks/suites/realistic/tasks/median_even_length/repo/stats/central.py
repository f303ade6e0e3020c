from collections import Counter


def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def mode(values):
    """The most common value (the first seen among ties)."""
    counts = Counter(values)
    if not counts:
        raise ValueError("mode of an empty sequence")
    return counts.most_common(1)[0][0]
