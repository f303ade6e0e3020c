"""Test-wide setup: 8 fake CPU devices, so that the parallel tests can build meshes; must run before jax loads."""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()


def pytest_configure(config):
  # `make test-unit` (pytest -m "not e2e") leaves these out; `make test` runs everything.
  config.addinivalue_line("markers", "e2e: end-to-end: real processes (trainer, actors, entry points), notebooks")
