from collections import defaultdict


class EventBus:
    """Handlers subscribe to named events; publish calls them in subscription order."""

    def __init__(self):
        self._handlers = defaultdict(list)

    def subscribe(self, event, handler):
        self._handlers[event].append(handler)

    def publish(self, event, *args, **kwargs):
        """Calls every handler of `event`; returns their results in order."""
        return [handler(*args, **kwargs) for handler in list(self._handlers[event])]

    def handler_count(self, event):
        return len(self._handlers[event])
