"""Evaluation of policies on coding-task suites in sandboxes (`harness.py`, `policies.py`)."""
