class Matrix:
    """An immutable matrix of numbers, stored as a tuple of row tuples."""

    def __init__(self, rows):
        rows = tuple(tuple(r) for r in rows)
        if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("a matrix needs equal-length, non-empty rows")
        self.rows = rows

    @property
    def shape(self):
        return len(self.rows), len(self.rows[0])

    def __eq__(self, other):
        return isinstance(other, Matrix) and self.rows == other.rows

    def __repr__(self):
        return f"Matrix({[list(r) for r in self.rows]})"

    def __add__(self, other):
        if self.shape != other.shape:
            raise ValueError(f"cannot add shapes {self.shape} and {other.shape}")
        return Matrix([[a + b for a, b in zip(r, s)] for r, s in zip(self.rows, other.rows)])
