import unittest

from routes.graph import Graph
from routes.search import shortest_path


def build(edges):
    g = Graph()
    for a, b in edges:
        g.add_edge(a, b)
    return g


class DeadEndTest(unittest.TestCase):

    def test_dead_end_branch(self):
        g = build([("a", "x"), ("a", "b"), ("b", "c")])
        self.assertEqual(shortest_path(g, "a", "c"), ["a", "b", "c"])

    def test_unreachable(self):
        g = build([("a", "b"), ("c", "a")])
        self.assertIsNone(shortest_path(g, "a", "c"))

    def test_start_is_goal(self):
        self.assertEqual(shortest_path(build([("a", "b")]), "b", "b"), ["b"])

    def test_unknown_start(self):
        self.assertIsNone(shortest_path(build([("a", "b")]), "z", "a"))
