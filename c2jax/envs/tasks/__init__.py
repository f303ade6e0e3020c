"""Coding tasks: the task format (`coding_tasks.py`), SWE-bench-style instances (`swe_tasks.py`, `unified_diff.py`),
a user's own tasks (`user_tasks.py`) and the registered suites (`suites/`)."""
