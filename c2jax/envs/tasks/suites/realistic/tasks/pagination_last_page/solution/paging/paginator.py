class Paginator:
    """Splits `items` into pages of `per_page`; pages are numbered from 1."""

    def __init__(self, items, per_page=10):
        if per_page < 1:
            raise ValueError("per_page must be at least 1")
        self.items = list(items)
        self.per_page = per_page

    @property
    def num_pages(self):
        return max(1, -(-len(self.items) // self.per_page))

    def page(self, number):
        if not 1 <= number <= self.num_pages:
            raise IndexError(f"page {number} out of range 1..{self.num_pages}")
        start = (number - 1) * self.per_page
        return self.items[start:start + self.per_page]
