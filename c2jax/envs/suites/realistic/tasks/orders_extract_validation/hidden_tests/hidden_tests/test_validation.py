import ast
import inspect
import unittest

import orders.create
import orders.update
from orders import validation
from orders.create import create_order
from orders.update import update_quantity


def names_used(module):
    tree = ast.parse(inspect.getsource(module))
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


class ValidationTest(unittest.TestCase):

    def test_validators(self):
        validation.validate_sku("ABC-1234")
        validation.validate_quantity(100)
        for bad in ["abc", "ABC-12345", 12, None]:
            with self.assertRaises(ValueError):
                validation.validate_sku(bad)
        for bad in [0, 101, True, 2.0, "3"]:
            with self.assertRaises(ValueError):
                validation.validate_quantity(bad)

    def test_callers_use_them(self):
        self.assertIn("validate_sku", names_used(orders.create))
        self.assertIn("validate_quantity", names_used(orders.create))
        self.assertIn("validate_quantity", names_used(orders.update))

    def test_no_duplicated_checks_left(self):
        for module in (orders.create, orders.update):
            self.assertNotIn("1 <= quantity <= 100", inspect.getsource(module))

    def test_behaviour(self):
        create_order(10, "ABC-1234", 3)
        self.assertEqual(update_quantity(10, 7)["quantity"], 7)
        with self.assertRaises(ValueError):
            update_quantity(10, 101)
        with self.assertRaises(ValueError):
            create_order(11, "ABC1234", 1)
