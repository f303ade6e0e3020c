from shortener.codes import encode


class Shortener:

    def __init__(self):
        self._urls = {}
        self._counter = 1000

    def shorten(self, url):
        if not url.startswith(("http://", "https://")):
            raise ValueError("only http(s) URLs can be shortened")
        code = encode(self._counter)
        self._counter += 1
        self._urls[code] = url
        return code

    def resolve(self, code):
        return self._urls[code]
