def apply_discount(cents, percent):
    """`cents` reduced by `percent` percent, rounded down to whole cents."""
    if not 0 <= percent <= 100:
        raise ValueError("percent must be between 0 and 100")
    return cents * (100 - percent) // 100
