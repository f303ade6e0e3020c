from calendar_utils.months import days_in_month


def day_of_year(year, month, day):
    """1 for January 1st."""
    if not 1 <= day <= days_in_month(year, month):
        raise ValueError(f"{year}-{month:02d} has no day {day}")
    return sum(days_in_month(year, m) for m in range(1, month)) + day
