"""Coding tasks: the task format (`coding_tasks.py`), SWE-bench-style instances (`swe_tasks.py`, `unified_diff.py`)
and the registered suites (`suites/`)."""
