import unittest

from routes.graph import Graph
from routes.search import shortest_path


class SearchTest(unittest.TestCase):

    def test_cycle(self):
        g = Graph()
        for a, b in [("a", "b"), ("b", "c"), ("c", "a"), ("a", "c")]:
            g.add_edge(a, b)
        self.assertEqual(shortest_path(g, "a", "c"), ["a", "c"])
        self.assertEqual(shortest_path(g, "b", "a"), ["b", "c", "a"])


if __name__ == "__main__":
    unittest.main()
