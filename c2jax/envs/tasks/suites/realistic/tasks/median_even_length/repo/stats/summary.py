from stats.central import mean, median


def describe(values):
    values = list(values)
    return {"n": len(values), "mean": mean(values), "median": median(values), "min": min(values),
            "max": max(values)}
