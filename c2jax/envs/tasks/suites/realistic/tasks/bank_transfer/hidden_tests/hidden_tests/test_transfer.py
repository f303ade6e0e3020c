import unittest

from bank.account import Account
from bank.errors import InsufficientFunds
from bank.ledger import Ledger
from bank.transfer import transfer


class TransferTest(unittest.TestCase):

    def test_moves_money(self):
        a, b = Account("a", 100), Account("b", 5)
        transfer(a, b, 40)
        self.assertEqual((a.balance, b.balance), (60, 45))

    def test_insufficient_is_atomic(self):
        a, b = Account("a", 10), Account("b", 0)
        ledger = Ledger()
        with self.assertRaises(InsufficientFunds):
            transfer(a, b, 11, ledger)
        self.assertEqual((a.balance, b.balance), (10, 0))
        self.assertEqual(ledger.entries, [])

    def test_non_positive(self):
        a, b = Account("a", 10), Account("b", 0)
        for amount in (0, -5):
            with self.assertRaises(ValueError):
                transfer(a, b, amount)
        self.assertEqual((a.balance, b.balance), (10, 0))

    def test_ledger(self):
        a, b = Account("a", 10), Account("b", 0)
        ledger = Ledger()
        transfer(a, b, 7, ledger=ledger)
        self.assertEqual(len(ledger.entries), 1)
        kind, details = ledger.entries[0]
        self.assertEqual(kind, "transfer")
        self.assertEqual((details["src"], details["dst"], details["amount"]), ("a", "b", 7))
