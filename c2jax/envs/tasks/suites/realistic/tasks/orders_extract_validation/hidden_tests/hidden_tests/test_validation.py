import ast
import inspect
import unittest
from unittest import mock

import orders.create
import orders.update
from orders import validation
from orders.create import create_order
from orders.update import update_quantity


class Called(Exception):
    """Raised by a patched validator: proves the order function called it."""


def patched(name):
    """Patches the validator `name` wherever the order modules can reach it (the module, or a name imported)."""
    patches = [mock.patch.object(validation, name, side_effect=Called(name))]
    for module in (orders.create, orders.update):
        if hasattr(module, name):
            patches.append(mock.patch.object(module, name, side_effect=Called(name)))
    return patches


def leftover_checks(module):
    """Comparisons with number literals, isinstance calls and regex matching left in a module's source."""
    found = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Constant) and type(o.value) in (int, float) for o in operands):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in ("isinstance", "fullmatch", "match", "search"):
                found.append(ast.unparse(node))
    return found


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
        calls = [("validate_sku", lambda: create_order(20, "ABC-1234", 3)),
                 ("validate_quantity", lambda: create_order(21, "ABC-1234", 3)),
                 ("validate_quantity", lambda: update_quantity(10, 5))]
        create_order(10, "ABC-1234", 3)
        for name, call in calls:
            patches = patched(name)
            for p in patches:
                p.start()
            try:
                with self.assertRaises(Called, msg=f"{name} is not called"):
                    call()
            finally:
                for p in patches:
                    p.stop()

    def test_no_duplicated_checks_left(self):
        for module in (orders.create, orders.update):
            self.assertEqual(leftover_checks(module), [], module.__name__)

    def test_behaviour(self):
        create_order(10, "ABC-1234", 3)
        self.assertEqual(update_quantity(10, 7)["quantity"], 7)
        with self.assertRaises(ValueError):
            update_quantity(10, 101)
        with self.assertRaises(ValueError):
            create_order(11, "ABC1234", 1)
