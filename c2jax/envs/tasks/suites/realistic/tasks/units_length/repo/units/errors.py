class UnknownUnit(KeyError):
    pass


class IncompatibleUnits(ValueError):
    pass
