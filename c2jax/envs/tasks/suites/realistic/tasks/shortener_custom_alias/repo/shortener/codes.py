import string

ALPHABET = string.digits + string.ascii_letters


def encode(number):
    """`number` (>= 0) in base 62."""
    if number == 0:
        return ALPHABET[0]
    digits = []
    while number:
        number, rest = divmod(number, len(ALPHABET))
        digits.append(ALPHABET[rest])
    return "".join(reversed(digits))
