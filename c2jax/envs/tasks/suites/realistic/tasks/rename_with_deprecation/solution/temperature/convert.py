import warnings


def celsius_to_fahrenheit(celsius):
    return celsius * 9 / 5 + 32


def fahrenheit_to_celsius(fahrenheit):
    return (fahrenheit - 32) * 5 / 9


def c2f(celsius):
    """Deprecated: use celsius_to_fahrenheit."""
    warnings.warn("c2f is deprecated; use celsius_to_fahrenheit", DeprecationWarning, stacklevel=2)
    return celsius_to_fahrenheit(celsius)


def f2c(fahrenheit):
    """Deprecated: use fahrenheit_to_celsius."""
    warnings.warn("f2c is deprecated; use fahrenheit_to_celsius", DeprecationWarning, stacklevel=2)
    return fahrenheit_to_celsius(fahrenheit)
