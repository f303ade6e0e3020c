def dedupe(items):
    """The items without repeats, keeping the first occurrence of each (items must be hashable)."""
    seen = []
    out = []
    for item in items:
        if item not in seen:
            seen.append(item)
            out.append(item)
    return out
