import re

from shortener.codes import encode
from shortener.errors import AliasTakenError

_ALIAS = re.compile(r"[A-Za-z0-9-]{3,20}")


class Shortener:

    def __init__(self):
        self._urls = {}
        self._counter = 1000

    def shorten(self, url, alias=None):
        if not url.startswith(("http://", "https://")):
            raise ValueError("only http(s) URLs can be shortened")
        if alias is not None:
            if not _ALIAS.fullmatch(alias):
                raise ValueError("an alias is 3-20 letters, digits or '-'")
            if alias in self._urls:
                raise AliasTakenError(alias)
            code = alias
        else:
            code = encode(self._counter)
            self._counter += 1
        self._urls[code] = url
        return code

    def resolve(self, code):
        return self._urls[code]
