import unittest

from shop.cart import Cart
from shop.models import Item

PEN = Item("p1", "pen", 150)
BOOK = Item("b1", "book", 1200)


class CartTest(unittest.TestCase):

    def test_single_items(self):
        cart = Cart()
        cart.add(PEN)
        cart.add(BOOK)
        self.assertEqual(cart.subtotal_cents(), 1350)

    def test_remove(self):
        cart = Cart()
        cart.add(PEN)
        cart.remove("p1")
        self.assertEqual(cart.subtotal_cents(), 0)

    def test_discount(self):
        cart = Cart()
        cart.add(BOOK)
        self.assertEqual(cart.total_cents(discount_percent=10), 1080)


if __name__ == "__main__":
    unittest.main()
