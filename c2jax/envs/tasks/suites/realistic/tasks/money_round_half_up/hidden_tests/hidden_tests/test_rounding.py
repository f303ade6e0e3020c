import unittest

from billing.invoice import Invoice
from billing.money import to_cents


class RoundingTest(unittest.TestCase):

    def test_half_up(self):
        self.assertEqual(to_cents("1.005"), 101)
        self.assertEqual(to_cents("2.675"), 268)
        self.assertEqual(to_cents("0.125"), 13)

    def test_below_half(self):
        self.assertEqual(to_cents("0.124"), 12)

    def test_exact(self):
        self.assertEqual(to_cents("10"), 1000)
        self.assertEqual(to_cents("0.07"), 7)
        self.assertEqual(to_cents("19.99"), 1999)

    def test_invoice_total(self):
        inv = Invoice()
        inv.add_line("a", "1.005")
        inv.add_line("b", "2.675")
        self.assertEqual(inv.total_cents(), 369)
