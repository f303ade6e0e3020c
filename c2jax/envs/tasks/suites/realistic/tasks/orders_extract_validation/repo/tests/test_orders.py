import unittest

from orders.create import create_order
from orders.update import update_quantity


class OrdersTest(unittest.TestCase):

    def test_create_update(self):
        create_order(1, "ABC-1234", 3)
        self.assertEqual(update_quantity(1, 5), {"sku": "ABC-1234", "quantity": 5})

    def test_bad_inputs(self):
        for sku, qty in [("abc", 1), ("ABC-1234", 0), ("ABC-1234", 101), ("ABC-1234", True), ("ABC-1234", 2.0)]:
            with self.assertRaises(ValueError):
                create_order(2, sku, qty)
        create_order(3, "XYZ-0001", 1)
        with self.assertRaises(ValueError):
            update_quantity(3, 0)


if __name__ == "__main__":
    unittest.main()
