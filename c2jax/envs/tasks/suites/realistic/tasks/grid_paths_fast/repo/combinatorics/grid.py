def count_paths(rows, cols):
    """Monotone paths (right or down steps) from the top-left to the bottom-right cell of a rows x cols grid."""
    if rows < 1 or cols < 1:
        return 0
    if rows == 1 or cols == 1:
        return 1
    return count_paths(rows - 1, cols) + count_paths(rows, cols - 1)
