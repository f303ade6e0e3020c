def to_cents(amount):
    """An amount of currency given as a decimal string ("12.34") in integer cents, rounded half up."""
    return int(round(float(amount) * 100))


def format_cents(cents):
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"
