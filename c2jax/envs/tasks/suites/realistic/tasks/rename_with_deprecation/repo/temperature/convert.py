def c2f(celsius):
    return celsius * 9 / 5 + 32


def f2c(fahrenheit):
    return (fahrenheit - 32) * 5 / 9
