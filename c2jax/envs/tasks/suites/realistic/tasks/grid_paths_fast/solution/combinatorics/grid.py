def count_paths(rows, cols):
    """Monotone paths (right or down steps) from the top-left to the bottom-right cell of a rows x cols grid."""
    if rows < 1 or cols < 1:
        return 0
    row = [1] * cols  # paths into each cell of the current row
    for _ in range(rows - 1):
        for c in range(1, cols):
            row[c] += row[c - 1]
    return row[-1]
