import unittest

from events import EventBus


class BusTest(unittest.TestCase):

    def test_publish(self):
        bus = EventBus()
        bus.subscribe("saved", lambda x: x + 1)
        bus.subscribe("saved", lambda x: x * 10)
        self.assertEqual(bus.publish("saved", 2), [3, 20])
        self.assertEqual(bus.publish("other"), [])


if __name__ == "__main__":
    unittest.main()
