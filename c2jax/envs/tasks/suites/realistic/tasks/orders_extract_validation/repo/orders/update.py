from orders.create import get_order


def update_quantity(order_id, quantity):
    if not isinstance(quantity, int) or isinstance(quantity, bool) or not 1 <= quantity <= 100:
        raise ValueError(f"bad quantity {quantity!r}: expected an integer in 1..100")
    order = get_order(order_id)
    order["quantity"] = quantity
    return order
