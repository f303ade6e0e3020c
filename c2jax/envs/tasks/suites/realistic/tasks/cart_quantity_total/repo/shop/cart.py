from shop.pricing import apply_discount


class Cart:
    """Items with quantities; prices in integer cents."""

    def __init__(self):
        self._lines = {}  # sku -> (item, quantity)

    def add(self, item, quantity=1):
        if quantity < 1:
            raise ValueError("quantity must be at least 1")
        _, current = self._lines.get(item.sku, (item, 0))
        self._lines[item.sku] = (item, current + quantity)

    def remove(self, sku):
        self._lines.pop(sku, None)

    def quantity(self, sku):
        return self._lines.get(sku, (None, 0))[1]

    def subtotal_cents(self):
        return sum(item.price_cents for item, quantity in self._lines.values())

    def total_cents(self, discount_percent=0):
        return apply_discount(self.subtotal_cents(), discount_percent)
