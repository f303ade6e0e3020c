import unittest

from events import EventBus


class UnsubscribeTest(unittest.TestCase):

    def test_unsubscribe(self):
        bus = EventBus()
        calls = []
        stop = bus.subscribe("e", calls.append)
        bus.publish("e", 1)
        stop()
        bus.publish("e", 2)
        self.assertEqual(calls, [1])
        self.assertEqual(bus.handler_count("e"), 0)

    def test_unsubscribe_twice_is_harmless(self):
        bus = EventBus()
        stop = bus.subscribe("e", print)
        stop()
        stop()

    def test_other_handlers_stay(self):
        bus = EventBus()
        stop = bus.subscribe("e", lambda: "a")
        bus.subscribe("e", lambda: "b")
        stop()
        self.assertEqual(bus.publish("e"), ["b"])

    def test_once(self):
        bus = EventBus()
        calls = []
        bus.once("e", calls.append)
        bus.publish("e", 1)
        bus.publish("e", 2)
        self.assertEqual(calls, [1])
        self.assertEqual(bus.handler_count("e"), 0)

    def test_once_returns_result(self):
        bus = EventBus()
        bus.once("e", lambda x: x * 2)
        self.assertEqual(bus.publish("e", 4), [8])
