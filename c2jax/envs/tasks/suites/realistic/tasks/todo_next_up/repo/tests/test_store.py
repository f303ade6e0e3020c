import unittest

from todo.store import TodoList


class StoreTest(unittest.TestCase):

    def test_add_complete(self):
        todos = TodoList()
        todos.add("write report")
        todos.add("call bank", priority=1)
        todos.complete("write report")
        self.assertEqual([t.title for t in todos.pending()], ["call bank"])

    def test_bad_priority(self):
        with self.assertRaises(ValueError):
            TodoList().add("x", priority=7)


if __name__ == "__main__":
    unittest.main()
