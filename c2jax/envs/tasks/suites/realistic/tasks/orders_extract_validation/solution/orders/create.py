from orders.validation import validate_quantity, validate_sku

_orders = {}


def create_order(order_id, sku, quantity):
    validate_sku(sku)
    validate_quantity(quantity)
    _orders[order_id] = {"sku": sku, "quantity": quantity}
    return _orders[order_id]


def get_order(order_id):
    return _orders[order_id]
