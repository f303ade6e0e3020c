"""Per-call cgroups of the sandbox: memory (RAM + swap) and process count of every process of one call together.

rlimits bound each process; a call that forks bounds nothing as a whole (a few children under the per-process
cap held 1.6 GB). A `CallCgroup` is a fresh cgroup per sandboxed call: the call's first process joins it (`join_argv`)
before it execs bubblewrap, so everything the call ever runs (bubblewrap's init inside included) is in it and cannot
leave (moving out needs write access to the common ancestor's cgroup.procs, which the call's user lacks). It is
removed after the call, its leftovers killed first.

  * cgroup v2: a subtree with the memory and pids controllers enabled in `cgroup.subtree_control` that this process
    may write, found from this process's own cgroup upwards (the root cgroup as root, or a delegated subtree
    with this process in a leaf of it, e.g. systemd's Delegate=yes). memory.max, memory.swap.max = 0, pids.max;
    OOM kills from memory.events.
  * cgroup v1: the memory and pids hierarchies, a child of this process's own cgroup in each (so the call stays
    inside this process's own limits). memory.limit_in_bytes and memory.memsw.limit_in_bytes (RAM + swap, where
    swap accounting is on), pids.max; OOM kills from memory.oom_control.

`find()` picks one (v2 first) by making and joining a real cgroup once; where neither works it says why, and
the sandbox falls back to its per-process rlimits.

The process joins while it still runs as the caller (root, or the owner of the delegated subtree), before the
sandbox drops to its unprivileged host user.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import signal
import subprocess
import time
import uuid

_MOUNTINFO = "/proc/self/mountinfo"
_SELF_CGROUP = "/proc/self/cgroup"
_PREFIX = "c2jax-call-"


class Version(enum.Enum):
  V2 = "cgroup v2"
  V1 = "cgroup v1"


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  """Where per-call cgroups are made: one directory per controller (the same one on v2)."""

  version: Version
  memory_parent: str
  pids_parent: str


def _mounts() -> list[tuple[str, str, str, str]]:
  """(fstype, mount root within the hierarchy, mount point, super options) of the cgroup filesystems."""
  found = []
  with open(_MOUNTINFO) as f:
    for line in f:
      left, _, right = line.partition(" - ")
      fields, rest = left.split(), right.split()
      if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
        found.append((rest[0], fields[3], fields[4].replace("\\040", " "), rest[2]))
  return found


def _own_paths() -> dict[str, str]:
  """This process's cgroup per v1 controller name, and "" for the v2 hierarchy (from /proc/self/cgroup)."""
  paths = {}
  with open(_SELF_CGROUP) as f:
    for line in f:
      _, controllers, path = line.rstrip("\n").split(":", 2)
      for name in controllers.split(",") if controllers else [""]:
        paths[name] = path
  return paths


def _join(mount_point: str, mount_root: str, path: str) -> str | None:
  """The directory of cgroup `path` under a mount of the hierarchy rooted at `mount_root`; None if not below it."""
  rel = os.path.relpath(path, mount_root)
  return None if rel.startswith("..") else os.path.normpath(os.path.join(mount_point, rel))


def _v2_parent() -> tuple[str | None, str]:
  own = _own_paths().get("")
  mounts = [m for m in _mounts() if m[0] == "cgroup2"]
  if own is None or not mounts:
    return None, "no cgroup v2 hierarchy is mounted"
  _, root, point, _ = mounts[0]
  directory = _join(point, root, own)
  while directory is not None:
    try:
      with open(os.path.join(directory, "cgroup.subtree_control")) as f:
        enabled = f.read().split()
    except OSError:
      enabled = []
    if {"memory", "pids"} <= set(enabled) and os.access(directory, os.W_OK):
      return directory, ""
    if os.path.normpath(directory) == os.path.normpath(point):
      break
    directory = os.path.dirname(directory)
  return None, (f"no cgroup v2 directory from this process's own ({own}) up to {point} has the memory and pids "
                "controllers in cgroup.subtree_control and is writable here")


def _v1_parents() -> tuple[tuple[str, str] | None, str]:
  own = _own_paths()
  parents = {}
  for fstype, root, point, options in _mounts():
    for name in ("memory", "pids"):
      if fstype == "cgroup" and name in options.split(",") and name in own and name not in parents:
        directory = _join(point, root, own[name])
        if directory is not None and os.access(directory, os.W_OK):
          parents[name] = directory
  missing = [n for n in ("memory", "pids") if n not in parents]
  if missing:
    return None, f"no writable cgroup v1 {' or '.join(missing)} hierarchy holds this process"
  return (parents["memory"], parents["pids"]), ""


def find() -> tuple[Hierarchy | None, str]:
  """The hierarchy per-call cgroups go in, tried for real (made, joined by `/bin/true`, removed); else (None, why
  not, in one sentence)."""
  reasons = []
  v2, why = _v2_parent()
  candidates = [Hierarchy(Version.V2, v2, v2)] if v2 else []
  reasons.append(why)
  v1, why = _v1_parents()
  if v1:
    candidates.append(Hierarchy(Version.V1, *v1))
  reasons.append(why)
  for hierarchy in candidates:
    try:
      group = CallCgroup(hierarchy, memory_bytes=64 << 20, max_pids=8)
      try:
        proc = subprocess.run(group.join_argv() + ["/bin/true"], capture_output=True, env={}, timeout=30)
        if proc.returncode != 0:
          raise OSError(f"a process could not join it: {proc.stderr.decode(errors='replace').strip()}")
      finally:
        group.remove()
      return hierarchy, ""
    except (OSError, subprocess.SubprocessError) as e:
      reasons.append(f"{hierarchy.version.value} at {hierarchy.memory_parent} is not usable ({e})")
  return None, "; ".join(r for r in reasons if r)


class CallCgroup:
  """One call's fresh cgroup(s), with their limits set, for the call's first process to join.

  Args:
    hierarchy: from `find`.
    memory_bytes: RAM + swap of all the call's processes together (page cache and tmpfs pages included).
    max_pids: processes and threads of the call together.

  Raises:
    OSError: a cgroup could not be made or limited (whatever was made is removed again).
  """

  def __init__(self, hierarchy: Hierarchy, memory_bytes: int, max_pids: int):
    self.hierarchy = hierarchy
    name = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    v2 = hierarchy.version == Version.V2
    self.dirs = [os.path.join(hierarchy.memory_parent, name)]
    if hierarchy.pids_parent != hierarchy.memory_parent:  # v1 with the two controllers in separate hierarchies
      self.dirs.append(os.path.join(hierarchy.pids_parent, name))
    made = []
    try:
      for d in self.dirs:
        os.mkdir(d, 0o755)
        made.append(d)
      memory, pids = self.dirs[0], self.dirs[-1]
      if v2:
        _write(memory, "memory.max", memory_bytes)
        _write(memory, "memory.swap.max", 0, optional=True)  # absent where swap accounting is off
      else:
        _write(memory, "memory.limit_in_bytes", memory_bytes)
        _write(memory, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)  # after the RAM limit: >= it
      _write(pids, "pids.max", max_pids)
    except BaseException:
      self.dirs = made
      self.remove()
      raise

  def join_argv(self) -> list[str]:
    """A command-line prefix: the process moves itself into the cgroup(s), then execs the rest (exit 125 if it
    cannot, so the rest never runs outside)."""
    # v1: `tasks` moves the writing thread alone, which the kernel does without the global lock that a whole
    # process's move takes (its writer waits for an RCU grace period, about 10 ms per call); the shell is one
    # thread, so that is the whole process. v2 takes whole processes only (cgroup.procs).
    name = "cgroup.procs" if self.hierarchy.version == Version.V2 else "tasks"
    script = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *(os.path.join(d, name) for d in self.dirs), "--"]

  def oom_kills(self) -> int:
    """Processes the kernel's OOM killer ended because the call reached its memory limit."""
    memory = self.dirs[0] if self.dirs else None
    if memory is None:
      return 0
    name = "memory.events" if self.hierarchy.version == Version.V2 else "memory.oom_control"
    try:
      with open(os.path.join(memory, name)) as f:
        for line in f:
          key, _, value = line.partition(" ")
          if key == "oom_kill":
            return int(value)
    except (OSError, ValueError):
      pass
    return 0

  def remove(self, grace_s: float = 5.0) -> bool:
    """Kills what is left in the cgroup(s) and removes them; whether they are gone. Idempotent."""
    deadline = time.monotonic() + grace_s
    left = []
    for d in self.dirs:
      while True:
        _kill_members(d)
        try:
          os.rmdir(d)
          break
        except FileNotFoundError:
          break
        except OSError:  # EBUSY: members still exiting (a dying PID namespace is reaped asynchronously)
          if time.monotonic() > deadline:
            left.append(d)
            break
          time.sleep(0.005)
    self.dirs = left
    return not left


def _write(directory: str, name: str, value: int, optional: bool = False) -> None:
  path = os.path.join(directory, name)
  if optional and not os.path.exists(path):
    return
  with open(path, "w") as f:
    f.write(str(value))


def _kill_members(directory: str) -> None:
  """SIGKILL to every process in the cgroup, each through a pidfd so that a recycled pid is never hit."""
  kill = os.path.join(directory, "cgroup.kill")  # v2, Linux >= 5.14: the kernel does it all
  if os.path.exists(kill):
    try:
      with open(kill, "w") as f:
        f.write("1")
      return
    except OSError:
      pass
  try:
    with open(os.path.join(directory, "cgroup.procs")) as f:
      pids = [int(p) for p in f.read().split()]
  except OSError:
    return
  for pid in pids:
    try:
      fd = os.pidfd_open(pid)
    except OSError:
      continue  # already gone
    try:
      with open(os.path.join(directory, "cgroup.procs")) as f:
        still_member = str(pid) in f.read().split()
      if still_member:  # the pidfd names the process that holds the pid now: still ours
        signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
      pass
    finally:
      os.close(fd)
