from collections import defaultdict


class EventBus:
    """Handlers subscribe to named events; publish calls them in subscription order."""

    def __init__(self):
        self._handlers = defaultdict(list)

    def subscribe(self, event, handler):
        """Adds `handler`; returns a function that removes it again."""
        self._handlers[event].append(handler)

        def unsubscribe():
            if handler in self._handlers[event]:
                self._handlers[event].remove(handler)

        return unsubscribe

    def once(self, event, handler):
        """Adds `handler` for the next publish of `event` only."""

        def run_once(*args, **kwargs):
            unsubscribe()
            return handler(*args, **kwargs)

        unsubscribe = self.subscribe(event, run_once)
        return unsubscribe

    def publish(self, event, *args, **kwargs):
        """Calls every handler of `event`; returns their results in order."""
        return [handler(*args, **kwargs) for handler in list(self._handlers[event])]

    def handler_count(self, event):
        return len(self._handlers[event])
