from bank.errors import InsufficientFunds


def transfer(src, dst, amount, ledger=None):
    """Moves `amount` from account `src` to account `dst`, all or nothing."""
    if amount <= 0:
        raise ValueError("transfer amount must be positive")
    if amount > src.balance:
        raise InsufficientFunds(f"{src.owner} has {src.balance}, needs {amount}")
    src.withdraw(amount)
    dst.deposit(amount)
    if ledger is not None:
        ledger.record("transfer", src=src.owner, dst=dst.owner, amount=amount)
