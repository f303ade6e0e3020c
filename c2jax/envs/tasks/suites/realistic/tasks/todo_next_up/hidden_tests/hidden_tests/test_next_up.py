import unittest

from todo.store import TodoList


class NextUpTest(unittest.TestCase):

    def setUp(self):
        self.todos = TodoList()
        for title, prio in [("a", 3), ("b", 1), ("c", 2), ("d", 1), ("e", 2)]:
            self.todos.add(title, priority=prio)

    def titles(self, tasks):
        return [t.title for t in tasks]

    def test_order(self):
        self.assertEqual(self.titles(self.todos.next_up(3)), ["b", "d", "c"])

    def test_default_n(self):
        self.assertEqual(len(self.todos.next_up()), 3)

    def test_skips_done(self):
        self.todos.complete("b")
        self.assertEqual(self.titles(self.todos.next_up(2)), ["d", "c"])

    def test_more_than_available(self):
        self.assertEqual(self.titles(self.todos.next_up(10)), ["b", "d", "c", "e", "a"])
