"""A tiny shop: items, carts and discounts."""
