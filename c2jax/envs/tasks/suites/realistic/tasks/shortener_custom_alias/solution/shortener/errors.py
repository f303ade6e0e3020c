class AliasTakenError(Exception):
    """The requested alias already names another URL."""
