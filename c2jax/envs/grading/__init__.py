"""Grading a submission: the host's grader (`grading.py`), the hidden tests' rewriting (`instrument.py`), the judge
that runs them in the sandbox (`judge.py`) and the host's comparator (`canonical.py`)."""
