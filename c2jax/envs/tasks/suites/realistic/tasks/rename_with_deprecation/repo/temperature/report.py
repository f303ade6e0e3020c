from temperature.convert import c2f


def daily_report(readings_celsius):
    """One line per reading, in both scales."""
    return [f"{c:.1f}C = {c2f(c):.1f}F" for c in readings_celsius]
