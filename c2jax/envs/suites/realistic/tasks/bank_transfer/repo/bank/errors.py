class InsufficientFunds(Exception):
    pass
