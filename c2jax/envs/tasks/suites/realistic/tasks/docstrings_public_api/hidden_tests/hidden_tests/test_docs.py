import inspect
import re
import unittest

from mathx import algebra, sequences

# Words of which a docstring that says what the function returns uses at least one (a list of parameter names
# does not).
RESULT_WORDS = {
    "gcd": {"divisor", "divides", "factor"},
    "lcm": {"multiple"},
    "fibonacci": {"fibonacci"},
    "triangular": {"triangular", "sum", "total"},
    "collatz_length": {"step", "steps", "length", "count", "number"},
}


def public_functions(module):
    return [f for name, f in inspect.getmembers(module, inspect.isfunction)
            if not name.startswith("_") and f.__module__ == module.__name__]


class DocsTest(unittest.TestCase):

    def test_module_docstrings(self):
        for module in (algebra, sequences):
            self.assertTrue((module.__doc__ or "").strip(), module.__name__)

    def test_function_docstrings_name_parameters(self):
        functions = public_functions(algebra) + public_functions(sequences)
        self.assertEqual(sorted(f.__name__ for f in functions), sorted(RESULT_WORDS))
        for f in functions:
            doc = inspect.getdoc(f) or ""
            self.assertTrue(doc, f.__name__)
            for param in inspect.signature(f).parameters:
                self.assertRegex(doc, rf"\b{re.escape(param)}\b", f"{f.__name__} does not mention {param}")

    def test_function_docstrings_say_what_they_return(self):
        for f in public_functions(algebra) + public_functions(sequences):
            words = [w.lower() for w in re.findall(r"[A-Za-z]+", inspect.getdoc(f) or "")]
            params = set(inspect.signature(f).parameters)
            self.assertGreaterEqual(len([w for w in words if w not in params]), 4,
                                    f"{f.__name__}: a sentence, not a list of names")
            self.assertTrue(RESULT_WORDS[f.__name__] & set(words),
                            f"{f.__name__}: the docstring does not say what it returns")

    def test_behaviour_unchanged(self):
        self.assertEqual(algebra.gcd(-4, 6), 2)
        self.assertEqual(algebra.lcm(0, 5), 0)
        self.assertEqual(sequences.fibonacci(10), 55)
        self.assertEqual(sequences.collatz_length(27), 111)
