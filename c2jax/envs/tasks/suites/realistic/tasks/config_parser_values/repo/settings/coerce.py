def coerce(value):
    """'42' -> 42, '1.5' -> 1.5, 'true'/'false' -> bool, anything else stays a string."""
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
