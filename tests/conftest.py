"""Test-wide setup, before jax loads: 8 fake CPU devices, so that the parallel tests can build meshes, and one
persistent compilation cache for the session, so that a program compiled by one test is not compiled again by a
later test (through another Python function) or by a process a test starts.

C2JAX_TEST_COMPILATION_CACHE=<dir> keeps that cache across sessions (a rerun then compiles almost nothing);
by default it is a temporary directory removed at the end, so every session compiles as CI does.
"""

import atexit
import os
import shutil
import tempfile

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = os.environ.get("C2JAX_TEST_COMPILATION_CACHE")
  if not _cache:
    _cache = tempfile.mkdtemp(prefix="c2jax-test-compilation-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.makedirs(_cache, exist_ok=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  # Every program that takes a noticeable time to compile (jax's default floor is 1 s).
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


def pytest_configure(config):
  # `make test-unit` (pytest -m "not e2e") leaves these out; `make test` runs everything.
  config.addinivalue_line("markers", "e2e: end-to-end: real processes (trainer, actors, entry points), notebooks")
