import re


def validate_sku(sku):
    if not isinstance(sku, str) or not re.fullmatch(r"[A-Z]{3}-\d{4}", sku):
        raise ValueError(f"bad SKU {sku!r}: expected like ABC-1234")


def validate_quantity(quantity):
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= 100:
        raise ValueError(f"bad quantity {quantity!r}: expected an integer in 1..100")
