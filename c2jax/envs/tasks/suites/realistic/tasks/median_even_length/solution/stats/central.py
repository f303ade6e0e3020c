from collections import Counter


def mean(values):
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence")
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of an empty sequence")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def mode(values):
    """The most common value (the first seen among ties)."""
    counts = Counter(values)
    if not counts:
        raise ValueError("mode of an empty sequence")
    return counts.most_common(1)[0][0]
