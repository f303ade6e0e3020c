def area(shape):
    return shape.area()


def total_area(shapes):
    return sum(area(s) for s in shapes)
