import unittest

from bank.account import Account
from bank.errors import InsufficientFunds


class AccountTest(unittest.TestCase):

    def test_deposit_withdraw(self):
        acc = Account("ann", 100)
        acc.deposit(50)
        acc.withdraw(30)
        self.assertEqual(acc.balance, 120)

    def test_overdraw(self):
        with self.assertRaises(InsufficientFunds):
            Account("bob", 10).withdraw(11)


if __name__ == "__main__":
    unittest.main()
