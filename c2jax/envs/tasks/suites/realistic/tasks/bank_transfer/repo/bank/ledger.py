class Ledger:
    """An append-only list of (kind, details) entries."""

    def __init__(self):
        self.entries = []

    def record(self, kind, **details):
        self.entries.append((kind, details))
