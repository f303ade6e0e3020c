import math

from geometry.shapes import Circle, Rectangle, Square


def area(shape):
    if isinstance(shape, Circle):
        return math.pi * shape.radius ** 2
    elif isinstance(shape, Rectangle):
        return shape.width * shape.height
    elif isinstance(shape, Square):
        return shape.side ** 2
    raise TypeError(f"unknown shape {type(shape).__name__}")


def total_area(shapes):
    return sum(area(s) for s in shapes)
