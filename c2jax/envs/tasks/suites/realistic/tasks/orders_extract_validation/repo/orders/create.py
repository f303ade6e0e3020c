import re

_orders = {}


def create_order(order_id, sku, quantity):
    if not isinstance(sku, str) or not re.fullmatch(r"[A-Z]{3}-\d{4}", sku):
        raise ValueError(f"bad SKU {sku!r}: expected like ABC-1234")
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= 100:
        raise ValueError(f"bad quantity {quantity!r}: expected an integer in 1..100")
    _orders[order_id] = {"sku": sku, "quantity": quantity}
    return _orders[order_id]


def get_order(order_id):
    return _orders[order_id]
