class Graph:
    """A directed graph built edge by edge."""

    def __init__(self):
        self.edges = {}

    def add_edge(self, src, dst):
        self.edges.setdefault(src, []).append(dst)

    def neighbors(self, node):
        return self.edges.get(node, [])

    def nodes(self):
        out = set(self.edges)
        for targets in self.edges.values():
            out.update(targets)
        return out
