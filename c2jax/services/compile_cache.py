"""The persistent cache of compiled programs that every run uses, so that a second run of the same programs on one
machine (a rerun in a fresh workdir, a resumed job, the actors a job starts, the next `make demo`) compiles nothing
new.

  directory = compile_cache.use(cfg.compilation_cache)   # before the first compile; its processes inherit it

Where: the run config's directory, else $JAX_COMPILATION_CACHE_DIR (one cache shared by every run that sets it: a
test session's, a cluster's), else `<C2JAX_CACHE_DIR or ~/.cache/c2jax>/jax`, beside the finished SFTs and the BPEs.

Why a program is never stale: jax keys each entry by a hash of the program itself (its HLO after lowering), the jax
and jaxlib versions, the XLA flags and the device kind, so a code change that changes a program compiles it anew
and one that does not reuses it; nothing here decides what is the same.
"""

from __future__ import annotations

import os

import jax

from c2jax.data.bpe import default_cache_dir

# Every program is kept, however fast it compiled (jax's own floor is 1 s, which on a CPU leaves out most of a small
# model's programs; a floor of 0.1 s still left tens of eager host-side programs per process compiled anew in every
# run), so that a second run compiles nothing new. $JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS, when set, wins.
MIN_COMPILE_TIME_S = 0.0


def directory(explicit: str = "") -> str:
  """The cache directory of a run: `explicit`, else $JAX_COMPILATION_CACHE_DIR, else the user's cache."""
  return explicit or os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(default_cache_dir(), "jax")


def use(explicit: str = "") -> str:
  """Points jax, and the processes this one starts (through the environment), at `directory(explicit)`; returns it."""
  path = os.path.abspath(directory(explicit))
  min_s = float(os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", str(MIN_COMPILE_TIME_S)))
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_s)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = path
  return path
