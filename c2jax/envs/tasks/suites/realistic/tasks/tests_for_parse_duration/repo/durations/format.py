def format_duration(seconds):
    """5400 -> '1h30m'; 0 -> '0s'."""
    if seconds < 0:
        raise ValueError("negative duration")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = "".join(f"{v}{u}" for v, u in ((hours, "h"), (minutes, "m"), (secs, "s")) if v)
    return out or "0s"
