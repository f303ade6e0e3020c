"""CPU placement of the RL processes: the trainer and the actor pool on disjoint cores of one machine.

On a cluster the trainer and the actors run on separate accelerators (report section 6), so a synchronous schedule
leaves each idle while the other works, and asynchronous RL wins that time back. On one CPU machine every process
shares the same cores unless told otherwise; pinning them to disjoint sets (`trainer.cpus`, `actors.cpus`) gives
each its own hardware, as a cluster would, and keeps the trainer's update from slowing the actors' sampling.

  cpus = parse_cpus("0-3,6")        # {0, 1, 2, 3, 6}
  pin(cpus)                         # this process, every thread it has and every thread it starts
  trainer, actors = split_cpus()    # the cores this process may use, halved (the first half for the trainer)

Linux only (`os.sched_setaffinity`); elsewhere `pin` raises.
"""

from __future__ import annotations

import os


def parse_cpus(spec: str) -> frozenset[int]:
  """CPU ids of a Linux cpu-list ("0-3,6"); empty for "" (no pinning).

  Raises:
    ValueError: on malformed input, a descending range or a negative id.
  """
  cpus = set()
  for part in (p.strip() for p in str(spec).split(",")):
    if not part:
      continue
    lo, sep, hi = part.partition("-")
    try:
      a, b = int(lo), int(hi) if sep else int(lo)
    except ValueError:
      raise ValueError(f"CPU list {spec!r}: {part!r} is not an id or a range like 2-5.") from None
    if a < 0 or b < a:
      raise ValueError(f"CPU list {spec!r}: {part!r} is not an ascending range of ids >= 0.")
    cpus.update(range(a, b + 1))
  return frozenset(cpus)


def format_cpus(cpus) -> str:
  """The cpu-list of a set of ids (ranges collapsed): format_cpus({0, 1, 2, 6}) == "0-2,6"."""
  ids, parts = sorted(cpus), []
  i = 0
  while i < len(ids):
    j = i
    while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
      j += 1
    parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
    i = j + 1
  return ",".join(parts)


def pin(cpus) -> None:
  """Restricts this process to `cpus`: every existing thread (XLA's pools may already run) and, by inheritance,
  every later one. Nothing happens for an empty set.

  Raises:
    ValueError: when a CPU does not exist or the process may not run on it.
    OSError: on a platform without sched_setaffinity.
  """
  cpus = frozenset(cpus)
  if not cpus:
    return
  if not hasattr(os, "sched_setaffinity"):
    raise OSError("CPU pinning (trainer.cpus / actors.cpus) needs Linux's sched_setaffinity.")
  # Not checked against this process's current mask: an actor started by a pinned trainer inherits the trainer's
  # cores and moves to its own (any CPU of the machine's cpuset may be chosen).
  missing = {i for i in cpus if i >= (os.cpu_count() or 0)}
  if missing:
    raise ValueError(f"CPUs {format_cpus(missing)} do not exist (this machine has {os.cpu_count()}).")
  try:
    threads = [int(t) for t in os.listdir("/proc/self/task")]
  except OSError:
    threads = [0]
  for tid in threads:
    try:
      os.sched_setaffinity(tid, cpus)
    except ProcessLookupError:  # a thread that ended meanwhile
      pass
    except OSError as e:
      raise ValueError(f"Cannot pin to CPUs {format_cpus(cpus)} ({e}); a container or cgroup may allow only some "
                       "of the machine's CPUs.") from e


def pin_thread(cpus) -> None:
  """Restricts the calling thread (and the processes it starts, by inheritance) to `cpus`; nothing for an empty
  set. The agent loop's tool workers call it, so sandboxes run on their own cores beside the engine's."""
  cpus = frozenset(cpus)
  if cpus:
    os.sched_setaffinity(0, cpus)  # 0: the calling thread (Linux)


def split_cpus() -> tuple[frozenset[int], frozenset[int]]:
  """(trainer, actors): the CPUs this process may use, the first half (rounded up) for the trainer.

  Raises:
    ValueError: with fewer than 2 CPUs (nothing to split).
  """
  ids = sorted(os.sched_getaffinity(0))
  if len(ids) < 2:
    raise ValueError(f"Splitting CPUs between the trainer and the actors needs at least 2; this process has "
                     f"{len(ids)}.")
  half = (len(ids) + 1) // 2
  return frozenset(ids[:half]), frozenset(ids[half:])
