from settings.coerce import coerce


def parse(text):
    """`key = value` lines; blank lines and lines starting with '#' are skipped, as are inline ' # comments'."""
    config = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise ValueError(f"line {number}: expected key = value")
        key, value = line.split("=", 1)
        # An inline comment starts with whitespace then "#"; a value may itself start with "#".
        value = value.strip().split(" #", 1)[0].strip()
        config[key.strip()] = coerce(value)
    return config
