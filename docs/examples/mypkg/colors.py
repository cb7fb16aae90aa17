from enum import Enum


class Color(Enum):
    RED = 1
    GREEN = 2
