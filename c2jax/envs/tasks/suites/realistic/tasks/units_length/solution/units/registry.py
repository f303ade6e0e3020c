# unit -> (dimension, size in the dimension's base unit)
UNITS = {
    "g": ("mass", 1.0),
    "kg": ("mass", 1000.0),
    "lb": ("mass", 453.59237),
    "oz": ("mass", 28.349523125),
    "m": ("length", 1.0),
    "cm": ("length", 0.01),
    "km": ("length", 1000.0),
    "ft": ("length", 0.3048),
    "mi": ("length", 1609.344),
}
