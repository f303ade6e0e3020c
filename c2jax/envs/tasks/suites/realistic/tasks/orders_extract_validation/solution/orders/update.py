from orders.create import get_order
from orders.validation import validate_quantity


def update_quantity(order_id, quantity):
    validate_quantity(quantity)
    order = get_order(order_id)
    order["quantity"] = quantity
    return order
