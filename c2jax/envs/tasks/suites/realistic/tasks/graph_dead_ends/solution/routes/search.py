from collections import deque


def shortest_path(graph, start, goal):
    """The shortest list of nodes from `start` to `goal` (both included), or None when there is none."""
    queue = deque([[start]])
    seen = {start}
    while queue:
        path = queue.popleft()
        node = path[-1]
        if node == goal:
            return path
        for nxt in graph.neighbors(node):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(path + [nxt])
    return None
