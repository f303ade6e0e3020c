"""Test-wide setup, before jax loads: 8 fake CPU devices, so that the parallel tests can build meshes; XLA:CPU's
LLVM backend at -O0, and under `make test` its element-wise emitters (below); and one persistent compilation cache
for the session, so that a program compiled by one test is not compiled again by a later test (through another
Python function) or by a process a test starts.

C2JAX_TEST_COMPILATION_CACHE=<dir> keeps that cache across sessions (a rerun then compiles almost nothing);
by default it is a temporary directory removed at the end, so every session compiles as CI does. Under pytest-xdist
the workers inherit the controller's environment, so they share the one cache.

After each module a fixture drops the jit caches and checks that the module left denormals unflushed
(`_module_hygiene`); the tiers are markers declared in pytest.ini.
"""

import atexit
import enum
import gc
import importlib.util
import json
import os
import shutil
import tempfile

_FLAGS = ["--xla_force_host_platform_device_count=8"]
# The CPU suite compiles for compile time, not run time: most of its programs are small and run a few times, and
# XLA's compiles are a third of its time (docs/benchmarks.md, "Test suite"). LLVM runs at -O0: optimizing the
# machine code cost more CPU than it saved. XLA's HLO passes (fusion, layouts, the order of every reduction) run the
# same at every level; only LLVM's code generation changes. A process with jax's CUDA plugin (the GPU compile tier, a
# GPU machine) keeps the default build, whose registers and spills it reports; C2JAX_TEST_XLA_OPT=1 keeps it here too.
_CPU = importlib.util.find_spec("jax_cuda12_plugin") is None and not os.environ.get("C2JAX_TEST_XLA_OPT")
if _CPU:
  _FLAGS.append("--xla_backend_optimization_level=0")


class Emitters(enum.Enum):
  """How XLA:CPU emits each fusion's code (C2JAX_TEST_CPU_EMITTERS; `make test` sets ELEMENTAL)."""

  FUSION = "fusion"  # XLA's default: MLIR fusion emitters, then LLVM
  # Straight to LLVM IR, with one LLVM module per program (the workers already fill both cores; splitting a module
  # across threads only adds work): the same fusions, a fraction of the compile time. These emitters cannot lower
  # float4 containers (an invalid LLVM bitcast), so tests that hold them are marked `fusion_emitters` and `make test`
  # runs them in a session of their own.
  ELEMENTAL = "elemental"


try:
  EMITTERS = Emitters(os.environ.get("C2JAX_TEST_CPU_EMITTERS", Emitters.FUSION.value))
except ValueError:
  raise SystemExit(f"C2JAX_TEST_CPU_EMITTERS={os.environ['C2JAX_TEST_CPU_EMITTERS']!r}: use one of "
                   f"{[e.value for e in Emitters]}.") from None
if _CPU and EMITTERS is Emitters.ELEMENTAL:
  _FLAGS += ["--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1"]
for _flag in _FLAGS:
  if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = os.environ.get("C2JAX_TEST_COMPILATION_CACHE")
  if not _cache:
    _cache = tempfile.mkdtemp(prefix="c2jax-test-compilation-cache-")
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.makedirs(_cache, exist_ok=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache
  # Every program that takes a noticeable time to compile (jax's default floor is 1 s).
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


import jax  # after XLA_FLAGS and the cache directory are set
import numpy as np
import pytest


_SUBNORMAL = np.float32(np.finfo(np.float32).smallest_subnormal)


@pytest.fixture(autouse=True, scope="module")
def _module_hygiene(request):
  """After each test module: its compiled programs are dropped, and it must not leave the process flushing
  denormals to zero.

  A worker runs many modules in one process: without `jax.clear_caches()` (as maxtext's conftest does) it keeps
  every executable it compiled. A module that turns on flush-to-zero (torch.set_flush_denormal) changes every later
  module's float arithmetic in that worker (tests/pallas_kernels/exact_divide_test.py's IEEE references).
  """
  yield
  if not os.environ.get("C2JAX_TEST_KEEP_COMPILED"):  # =1 keeps them: the control run of docs/benchmarks.md
    jax.clear_caches()
    gc.collect()
  if np.multiply(_SUBNORMAL, np.float32(1.0)) == 0:
    pytest.fail(f"{request.module.__name__} left this process flushing denormals to zero "
                "(torch.set_flush_denormal(True)?): restore it, or set it only in a tool's own process.")


# Seconds each file took in a suite run (tools/test_durations.py writes it); a file without an entry is estimated
# from its markers. Only the order below depends on them.
_DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "file_durations.json")
_GUESS_S = {"e2e": 40.0, "mesh": 10.0, "slow": 10.0}  # seconds guessed for a file by its slowest marker; else 1


def pytest_collection_modifyitems(config, items):
  """The longest files first (by tests/file_durations.json, else by their markers), each file's tests in their
  order. Under `make test`, xdist then hands out whole files with the most tests first (its --loadscope-reorder), so
  this order decides among files that hold as many tests; the order alone changed nothing measurable
  (docs/design/tests.md).
  """
  del config
  try:
    with open(_DURATIONS, encoding="utf-8") as f:
      measured = json.load(f)
  except (OSError, ValueError):  # no figures: the markers alone order the files
    measured = {}

  guess: dict[str, float] = {}
  for item in items:
    path = item.nodeid.split("::")[0]
    marks = [s for m, s in _GUESS_S.items() if item.get_closest_marker(m)]
    guess[path] = max(guess.get(path, 1.0), *marks) if marks else guess.get(path, 1.0)
  seconds = {path: float(measured.get(path, g)) for path, g in guess.items()}
  items.sort(key=lambda item: -seconds[item.nodeid.split("::")[0]])  # stable: a file's tests keep their order


def pytest_runtest_setup(item):
  """A test marked `fusion_emitters` fails at once, saying why, in a session on the element-wise emitters."""
  if _CPU and EMITTERS is Emitters.ELEMENTAL and item.get_closest_marker("fusion_emitters"):
    pytest.fail("this test needs XLA:CPU's fusion emitters (marked fusion_emitters): run it without "
                "C2JAX_TEST_CPU_EMITTERS=elemental (`make test` runs such tests in a session of their own).",
                pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """On the element-wise emitters, a failure to lower (float4 containers) says which marker the test lacks."""
  outcome = yield
  report = outcome.get_result()
  if (_CPU and EMITTERS is Emitters.ELEMENTAL and report.failed and call.excinfo is not None
      and "Invalid LLVM IR" in str(call.excinfo.value)):
    report.sections.append(("c2jax", "XLA:CPU's element-wise emitters (C2JAX_TEST_CPU_EMITTERS=elemental) cannot "
                            "lower this program (float4 containers?): mark the test fusion_emitters (pytest.ini)."))
