import unittest

from shop.cart import Cart
from shop.models import Item

PEN = Item("p1", "pen", 150)
BOOK = Item("b1", "book", 1200)


class CartQuantityTest(unittest.TestCase):

    def test_quantity_counts(self):
        cart = Cart()
        cart.add(PEN, quantity=3)
        self.assertEqual(cart.subtotal_cents(), 450)

    def test_repeated_adds_accumulate(self):
        cart = Cart()
        cart.add(PEN)
        cart.add(PEN, 2)
        cart.add(BOOK)
        self.assertEqual(cart.quantity("p1"), 3)
        self.assertEqual(cart.subtotal_cents(), 1650)

    def test_discount_applies_to_quantities(self):
        cart = Cart()
        cart.add(BOOK, 2)
        self.assertEqual(cart.total_cents(discount_percent=25), 1800)

    def test_single_items_still_work(self):
        cart = Cart()
        cart.add(PEN)
        cart.add(BOOK)
        self.assertEqual(cart.total_cents(), 1350)
