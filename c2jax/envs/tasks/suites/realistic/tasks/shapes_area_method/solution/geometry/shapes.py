import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Circle:
    radius: float

    def area(self):
        return math.pi * self.radius ** 2


@dataclass(frozen=True)
class Rectangle:
    width: float
    height: float

    def area(self):
        return self.width * self.height


@dataclass(frozen=True)
class Square:
    side: float

    def area(self):
        return self.side ** 2
