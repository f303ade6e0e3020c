from settings.coerce import coerce


def parse(text):
    """`key = value` lines; blank lines and lines starting with '#' are skipped."""
    config = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=")
        config[key.strip()] = coerce(value.strip())
    return config
