from billing.money import format_cents, to_cents


class Invoice:

    def __init__(self):
        self.lines = []  # (description, cents)

    def add_line(self, description, amount):
        self.lines.append((description, to_cents(amount)))

    def total_cents(self):
        return sum(cents for _, cents in self.lines)

    def render(self):
        rows = [f"{desc}: {format_cents(cents)}" for desc, cents in self.lines]
        rows.append(f"TOTAL: {format_cents(self.total_cents())}")
        return "\n".join(rows)
