import inspect
import unittest

from mathx import algebra, sequences


def public_functions(module):
    return [f for name, f in inspect.getmembers(module, inspect.isfunction)
            if not name.startswith("_") and f.__module__ == module.__name__]


class DocsTest(unittest.TestCase):

    def test_module_docstrings(self):
        for module in (algebra, sequences):
            self.assertTrue((module.__doc__ or "").strip(), module.__name__)

    def test_function_docstrings_name_parameters(self):
        functions = public_functions(algebra) + public_functions(sequences)
        self.assertEqual(len(functions), 5)
        for f in functions:
            doc = inspect.getdoc(f) or ""
            self.assertTrue(doc, f.__name__)
            for param in inspect.signature(f).parameters:
                self.assertIn(param, doc, f"{f.__name__} does not mention {param}")

    def test_behaviour_unchanged(self):
        self.assertEqual(algebra.gcd(-4, 6), 2)
        self.assertEqual(algebra.lcm(0, 5), 0)
        self.assertEqual(sequences.fibonacci(10), 55)
        self.assertEqual(sequences.collatz_length(27), 111)
