import unittest

from billing.invoice import Invoice
from billing.money import format_cents, to_cents


class MoneyTest(unittest.TestCase):

    def test_to_cents(self):
        self.assertEqual(to_cents("1.50"), 150)
        self.assertEqual(to_cents("20"), 2000)

    def test_format(self):
        self.assertEqual(format_cents(1234), "12.34")
        self.assertEqual(format_cents(-5), "-0.05")

    def test_invoice(self):
        inv = Invoice()
        inv.add_line("tea", "3.20")
        inv.add_line("cake", "4.10")
        self.assertEqual(inv.render(), "tea: 3.20\ncake: 4.10\nTOTAL: 7.30")


if __name__ == "__main__":
    unittest.main()
