from temperature.convert import celsius_to_fahrenheit


def daily_report(readings_celsius):
    """One line per reading, in both scales."""
    return [f"{c:.1f}C = {celsius_to_fahrenheit(c):.1f}F" for c in readings_celsius]
