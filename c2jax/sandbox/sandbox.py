"""Isolated execution of untrusted code under bubblewrap (report: environments; code runs in isolated sandboxes).

The model's shell commands and the hidden tests that decide its reward run here. A `Sandbox` owns a fresh private
copy of the task repository on the host (`workdir`) and runs each command in a new bubblewrap container:

  /work           the writable copy (bind mount of `workdir`, its own tmpfs where the host allows): the only writable
                  place besides the tmpfs below
  /tmp, /dev/shm  private tmpfs, `file_size_mb` each (tmpfs lives in host memory, hence the bound)
  /usr            the host's system, read-only; /bin, /lib*, /sbin mirror the host's (symlinks or read-only binds)
  /etc            a minimal read-only view: ld.so.cache, alternatives, and a passwd/group naming the sandbox user
  /proc, /dev     fresh procfs for the new PID namespace, /proc/1 (bubblewrap's init) hidden under an empty tmpfs;
                  minimal devices (null, zero, urandom, ...)
  /, /dev         remounted read-only once built
  PRIVATE_DIRS    an empty read-only tmpfs over each that lies under a bound path: c2jax installed into /usr (e.g.
                  `pip install .` as root) ships the tasks' hidden tests and reference solutions as package data

Namespaces: every one bubblewrap supports (user, PID, network, IPC, UTS, cgroup), nested user namespaces disabled.
The network namespace holds only its own loopback: neither the internet nor the host's 127.0.0.1 is reachable. The
host's home, the project's checkout and the host's /tmp are not mounted, so they do not exist inside.

Syscalls (`seccomp.py`): the command and everything it starts run under a seccomp filter that refuses (EPERM)
ptrace, process_vm_*, mounts, namespace changes, kernel modules, bpf, io_uring, keyrings and the like. bubblewrap's
init (PID 1 inside) is the one process without it, so /proc/1 is hidden: nothing inside can debug it, write its
memory or make it run a command.

Limits, per call: a wall-clock timeout kills the container's PID namespace (every process dies with its PID 1,
so nothing outlives the call, not even daemons). CPU seconds (SIGKILL at the limit, no core), address space, file
size and no core files are set as bubblewrap is started (`_launcher`), so they hold for every process of the call,
bubblewrap's init included. The process count (RLIMIT_NPROC) is set inside, before /bin/sh starts, because only
there is it charged per user namespace (Linux >= 5.14): one sandbox's fork bomb does not starve another's, which a
limit on the shared host user would. The kernel exempts host root from RLIMIT_NPROC, so when the host runs as root
the container runs as the unprivileged host user `nobody` (65534) instead, which also keeps host root out of
untrusted code; inside, the user is always uid/gid 1000. stdout and stderr are read as they come and each is cut to
`output_bytes`: the head and the tail are kept (test summaries come last) around one marker line, so a huge output
costs neither host memory nor the verdict.

Limits over the whole call and the whole workdir, where the host allows them (`containment()` says which hold):
  * each call runs in its own cgroup (`cgroup.py`; v2 or v1, as root or in a delegated v2 subtree), which the
    call's first process joins before it execs bubblewrap: `call_memory_mb` of RAM + swap for all its processes
    together (their /tmp, /dev/shm and workdir pages included; past it the kernel's OOM killer ends one, counted in
    `RunResult.oom_kills`) and `max_procs` processes, plus one for bubblewrap's host-side process. The cgroup is
    removed after the call, leftovers killed.
  * as root, the workdir is its own tmpfs (host memory) of `workdir_mb` and `workdir_entries` inodes, mounted for
    the sandbox's whole life (the repository persists across calls) and unmounted by `close`: a write past it fails
    with ENOSPC during the call, inside and host-side alike. The sandbox's root directory (the container's /etc
    files and the workdir's mount point) is then made on a RAM filesystem (`RAM_DIR`), not in TMPDIR.
Where they do not hold: memory is bounded per process only (N processes may hold N x memory_mb), process count per
user namespace only (bubblewrap's init exempt, but unreachable, see Syscalls), and the disk written to /work within
one call per file only (FSIZE; the wall clock bounds the rest), measured by `Sandbox.usage` between calls so that
the caller can stop. Never bounded here: core dumps where the host's core_pattern pipes them to a helper (the
kernel ignores RLIMIT_CORE there).

  print(sandbox.containment())  # e.g. Containment(cgroup=<Version.V1: 'cgroup v1'>, disk=<DiskBound.TMPFS: ...>)

Availability: `check_available` starts one container with the very command line of a real call (`python3 -I -c
pass`) before the first sandbox of a process, so an old bubblewrap, a missing /usr/bin/python3 or a sandboxes'
directory (TMPDIR or `RAM_DIR`) the container's user cannot reach raises SandboxUnavailable instead of failing every
call. Every call also reports through bubblewrap's --json-status-fd whether its command started: a container that
fails to build later raises SandboxUnavailable too, never passes for the command's own failure.

Host-side file access (`read_file`, `write_file`, ...) is confined to `workdir`: paths are relative POSIX paths
without '..', and a path whose resolution (symlinks followed) leaves `workdir` is refused, as is anything but a
regular file (a FIFO the command made would block the host's open forever). Inside the container a symlink to a
host path sees only the container's view of that path. The host's walks of the whole tree (`list_files`, `files`,
`usage`, `close`) go from directory fd to directory fd, no symlink followed, without recursion: a tree nested
thousands deep, entries vanishing mid-walk, or a directory swapped for a symlink to a host directory while the host
reads neither crash nor mislead them.

A `SandboxPool` runs many sandboxed calls at once on a bounded number of threads (the work is in subprocesses).

  with Sandbox({"solution.py": "X = 3"}) as box:
    result = box.run("python3 -c 'import solution; print(solution.X)'")
    assert result.ok and result.stdout.strip() == "3"
"""

from __future__ import annotations

import atexit
import concurrent.futures
import ctypes
import dataclasses
import enum
import errno
import glob
import json
import math
import os
import pathlib
import re
import select
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from typing import Any, Callable, Iterable, Mapping

from c2jax.sandbox import cgroup as cgroup_lib
from c2jax.sandbox import seccomp

# Module-level so that tests (and unusual installs) can point at another binary; read at every check.
BWRAP = "/usr/bin/bwrap"
PRLIMIT = "/usr/bin/prlimit"
SETPRIV = "/usr/bin/setpriv"

_INSIDE_UID = 1000
_NOBODY = 65534
_WORK = "/work"
_PATH = "/opt/c2jax/bin:/usr/bin:/bin"
_PATH_MAX = 4096  # Linux's PATH_MAX: the longest path the host can open by name
_KILL_GRACE_S = 5.0  # how long readers may take to see EOF once the container is dead
# What the availability probe runs in a real container: the interpreter every task needs, isolated as grep runs it.
_PROBE_COMMAND = "python3 -I -c pass"


def _installed_copies() -> tuple[str, ...]:
  """The c2jax package directories a sandbox could see: this one, and copies installed into system Pythons."""
  found = {str(pathlib.Path(__file__).resolve().parents[1])}
  for pattern in ("/usr/lib/python3*/*-packages/c2jax", "/usr/local/lib/python3*/*-packages/c2jax"):
    found.update(os.path.realpath(p) for p in glob.glob(pattern))
  return tuple(sorted(found))


# Host directories the sandbox must never show (the hidden tests and reference solutions are package data of
# c2jax.envs.tasks.suites): each one under a path the container binds gets an empty tmpfs over it. Module-level so that
# tests can point it elsewhere; read at every call.
PRIVATE_DIRS: tuple[str, ...] = _installed_copies()


# Where sandbox roots are made when every workdir is its own tmpfs (`DiskBound.TMPFS`): a root then holds only the
# container's three /etc files and the workdir's mount point, and on a RAM filesystem making and removing it never
# waits on a disk's journal (on an ext4 root beside a job writing checkpoints, 13 ms median and up to 85 ms against
# 0.1 ms: docs/benchmarks.md, tools/bench_sandbox.py). Elsewhere the roots, workdirs included, stay in TMPDIR.
# Module-level so that tests can point it elsewhere; read at every sandbox.
RAM_DIR = "/dev/shm"


class SandboxUnavailable(RuntimeError):
  """bubblewrap is missing or cannot create its namespaces here: code is never run unsandboxed instead."""


class SandboxPathError(ValueError):
  """A host-side path is absolute, contains '..', resolves (through symlinks) outside the workdir, or names
  something other than a regular file or directory (a FIFO, a socket)."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
  """Resource limits of a sandboxed command (per call), and of the workdir (over all calls of one sandbox).

  Attributes:
    wall_s: wall-clock seconds before the whole container is killed (`RunResult.timed_out`).
    cpu_s: CPU seconds per process (RLIMIT_CPU, SIGKILL at the limit).
    memory_mb: address space per process in MiB (RLIMIT_AS).
    max_procs: processes (and threads) in the container, its init included (RLIMIT_NPROC, per user namespace;
      and the call's cgroup pids.max, with bubblewrap's host-side process, where the cgroup holds).
    output_bytes: bytes kept of stdout and of stderr, each (head and tail around a marker line).
    file_size_mb: largest file a process may write (RLIMIT_FSIZE), and the size of the /tmp and /dev/shm tmpfs.
    call_memory_mb: memory (RAM + swap, page cache and tmpfs pages included) of all the call's processes together
      in MiB, where the call's cgroup holds (`containment()`); None: twice `memory_mb`.
    workdir_mb: what the workdir may hold, in MiB, where it is its own tmpfs (`containment()`): writes past it
      fail with ENOSPC, inside the call and host-side alike.
    workdir_entries: files, directories and links the workdir may hold where it is its own tmpfs (its inodes).
  """

  wall_s: float = 10.0
  cpu_s: int = 10
  memory_mb: int = 512
  max_procs: int = 64
  output_bytes: int = 65536
  file_size_mb: int = 64
  call_memory_mb: int | None = None
  workdir_mb: int = 256
  workdir_entries: int = 50000


@dataclasses.dataclass(frozen=True)
class RunResult:
  """The outcome of one sandboxed command.

  Attributes:
    exit_code: the shell's exit status (128 + N when killed by signal N); None when the wall clock ran out.
    stdout, stderr: decoded as UTF-8 (undecodable bytes replaced), each at most `output_bytes` plus a marker line.
    timed_out: the wall-clock limit killed the container.
    truncated: stdout or stderr was cut.
    wall_s: seconds from launch to the end of the container.
    oom_kills: processes the kernel killed because the call reached `call_memory_mb` (0 where no cgroup holds).
  """

  exit_code: int | None
  stdout: str
  stderr: str
  timed_out: bool
  truncated: bool
  wall_s: float
  oom_kills: int = 0

  @property
  def ok(self) -> bool:
    return self.exit_code == 0 and not self.timed_out


# ---------------------------------------------------------------------------------------------------------------
# Containment beyond bubblewrap and the per-process rlimits: what this host allows.


class DiskBound(enum.Enum):
  """How the workdir's disk use is bounded."""

  TMPFS = "its own tmpfs"  # of workdir_mb and workdir_entries: writes past them fail with ENOSPC during the call
  AFTER_CALL = "after the call"  # the host's filesystem: RLIMIT_FSIZE per file, `Sandbox.usage` between calls


@dataclasses.dataclass(frozen=True)
class Containment:
  """What bounds a call here beyond the namespaces, the seccomp filter and the per-process rlimits.

  Attributes:
    cgroup: the version of the per-call cgroup (`call_memory_mb` and `max_procs` over the whole call, bubblewrap's
      init included), or None where no cgroup holds.
    disk: how the workdir is bounded.
    missing: one sentence per piece that does not hold here, saying why and what holds instead.
  """

  cgroup: cgroup_lib.Version | None
  disk: DiskBound
  missing: tuple[str, ...] = ()


_containment_lock = threading.Lock()
# euid -> (what holds, the hierarchy per-call cgroups go in): found once per process and user, as the probe is.
_containments: dict[int, tuple[Containment, cgroup_lib.Hierarchy | None]] = {}

_LIBC = ctypes.CDLL(None, use_errno=True)
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_TMPFS_SOURCE = b"c2jax-sandbox"  # how the workdirs' mounts show in /proc/mounts


def containment() -> Containment:
  """What bounds a call on this host, found once per process (by trying each piece for real).

  As root with cgroups (v2 with the memory and pids controllers delegated, or the v1 memory and pids
  hierarchies) every call runs in its own cgroup, and every sandbox's workdir is its own tmpfs. Elsewhere
  `missing` says what does not hold; then memory is bounded per process only (memory_mb, so N processes may hold
  N x memory_mb), process count per user namespace only (max_procs, bubblewrap's init exempt), and the workdir
  per file only (file_size_mb) until `Sandbox.usage` measures it after the call.
  """
  return _detected()[0]


def _detected() -> tuple[Containment, cgroup_lib.Hierarchy | None]:
  euid = os.geteuid()
  with _containment_lock:
    if euid not in _containments:
      _containments[euid] = _find_containment()
    return _containments[euid]


def _owner_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # someone else's live process
  return True


def _is_open_tmpfs(path: str) -> bool:
  """Whether `path` is the mount point of a tmpfs that this process can write in and any user can traverse (the
  container's host user, nobody under host root, reads the /etc files bound from a root there), and where no other
  user can move our directories away: sticky where others may write (as /tmp is), since the host writes a root's
  files as root."""
  real = os.path.realpath(path)
  try:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
      types = [line.split(" - ", 1)[1].split()[0] for line in f
               if " - " in line and line.split()[4].replace("\\040", " ") == real]
    mode = os.stat(real).st_mode
  except (OSError, IndexError):
    return False
  return (bool(types) and types[-1] == "tmpfs" and stat.S_ISDIR(mode) and bool(mode & stat.S_IXOTH)
          and bool(mode & stat.S_ISVTX or not mode & (stat.S_IWOTH | stat.S_IWGRP))
          and os.access(real, os.W_OK | os.X_OK))


def _roots_dir() -> str:
  """Where this process makes sandbox roots: `RAM_DIR` where every workdir is its own tmpfs and `RAM_DIR` is an
  open tmpfs (`_is_open_tmpfs`), else TMPDIR."""
  if _detected()[0].disk is DiskBound.TMPFS and _is_open_tmpfs(RAM_DIR):
    return RAM_DIR
  return tempfile.gettempdir()


def reap_stale_workdirs() -> int:
  """Unmounts and deletes the workdir tmpfs of sandboxes whose process died without `close` (SIGKILL, a lost
  host); returns how many. Their directories carry the owner's pid (`c2jax-sandbox-<pid>-...`); a live owner's, or
  another temp dir's, are left alone. Runs once per process with the first containment check."""
  reaped = 0
  prefixes = {os.path.join(os.path.realpath(d), "c2jax-sandbox-") for d in (tempfile.gettempdir(), RAM_DIR)}
  try:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
      points = [line.split()[4] for line in f if f" {_TMPFS_SOURCE.decode()} " in line]
  except OSError:
    return 0
  for point in points:
    point = point.replace("\\040", " ")
    prefix = next((p for p in prefixes if point.startswith(p)), None)
    rest = point[len(prefix):] if prefix is not None and point.endswith("/work") else ""
    pid = rest.split("-", 1)[0]
    if not pid.isdigit() or _owner_alive(int(pid)):
      continue
    try:
      _unmount(pathlib.Path(point))
      _remove_tree(pathlib.Path(point).parent)
      reaped += 1
    except OSError:
      continue  # busy or gone meanwhile: the next process tries again
  return reaped


def _find_containment() -> tuple[Containment, cgroup_lib.Hierarchy | None]:
  if os.geteuid() == 0:
    reap_stale_workdirs()
  missing = []
  hierarchy, why = cgroup_lib.find()
  if hierarchy is None:
    missing.append(f"No per-call cgroup ({why}): memory is bounded per process (memory_mb) and process count per "
                   "user namespace (max_procs), not over the whole call; run as root with cgroups, or delegate a "
                   "cgroup v2 subtree with the memory and pids controllers to this process.")
  disk = DiskBound.AFTER_CALL
  if os.geteuid() != 0:
    missing.append("The workdir is on the host's filesystem (mounting a tmpfs for it needs root): a call's writes "
                   "are bounded per file (file_size_mb) and measured only after the call (Sandbox.usage).")
  else:
    probe = tempfile.mkdtemp(prefix="c2jax-sandbox-probe-")
    try:
      _mount_tmpfs(pathlib.Path(probe), 1, 16)
      _unmount(pathlib.Path(probe))
      disk = DiskBound.TMPFS
    except OSError as e:
      missing.append(f"The workdir is on the host's filesystem (a tmpfs cannot be mounted here: {e.strerror}): a "
                     "call's writes are bounded per file (file_size_mb) and measured only after the call.")
    finally:
      try:
        os.rmdir(probe)
      except OSError:
        pass  # still mounted after a failed unmount: left for the host's temp cleaner, the tmpfs then unused
  return Containment(cgroup=hierarchy.version if hierarchy else None, disk=disk, missing=tuple(missing)), hierarchy


def _mount_tmpfs(path: pathlib.Path, size_mb: int, entries: int) -> None:
  # nosuid, nodev: nothing the sandbox writes may gain privileges or reach devices on the host side.
  # +1 inode: the tmpfs's root is one, and `Sandbox.usage` does not count it.
  options = f"size={size_mb}m,nr_inodes={entries + 1},mode=0755".encode()
  if _LIBC.mount(_TMPFS_SOURCE, os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), str(path))


def _unmount(path: pathlib.Path) -> None:
  # Detached: a host thread still reading a file (e.g. `files()`) cannot make it fail; the memory goes with it.
  if _LIBC.umount2(os.fsencode(path), _MNT_DETACH) != 0:
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err), str(path))


_seccomp_program: bytes | None = None


def _seccomp() -> bytes:
  global _seccomp_program
  if _seccomp_program is None:
    try:
      _seccomp_program = seccomp.program()
    except ValueError as e:
      raise SandboxUnavailable(str(e)) from None
  return _seccomp_program


# ---------------------------------------------------------------------------------------------------------------
# Availability.

_probe_lock = threading.Lock()
# (bwrap, prlimit, temp dir, euid) that started a real container once in this process: what the probe depends on.
_probed: set[tuple[str, str, str, int]] = set()


def _host_user() -> tuple[int, int] | None:
  """The host (uid, gid) the container runs as when it must not be the caller's own: host root -> nobody."""
  return (_NOBODY, _NOBODY) if os.geteuid() == 0 else None


def _launcher(lim: SandboxLimits, group: cgroup_lib.CallCgroup | None) -> list[str]:
  """What execs bubblewrap, each step exec'ing the next in one process: the call's cgroup joined (as the caller),
  the rlimits set, the host user switched (host root -> nobody); so bubblewrap's init inside holds all of them.

  RLIMIT_NPROC is not set here: on the host side it would count every process of the host user (host root runs
  every sandbox as nobody, so concurrent calls would share one budget); it is set inside, where it counts per user
  namespace, and the call's cgroup bounds the whole call, bubblewrap's init included. A small exec chain rather
  than a preexec_fn: subprocess then starts it with vfork, without copying the caller's (large) address space.
  """
  argv = group.join_argv() if group is not None else []
  argv += [PRLIMIT,
           f"--cpu={lim.cpu_s}",  # soft = hard: SIGKILL, not SIGXCPU (whose default action dumps core)
           f"--as={lim.memory_mb << 20}", f"--fsize={lim.file_size_mb << 20}", "--core=0", "--"]
  user = _host_user()
  if user is not None:
    argv += [SETPRIV, f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--"]
  return argv


def unavailable_reason() -> str | None:
  """None when the sandbox can run here, else the one sentence `check_available` would raise (for test skips)."""
  try:
    check_available()
  except SandboxUnavailable as e:
    return str(e)
  return None


def check_available() -> None:
  """Raises SandboxUnavailable (one sentence naming the fix) unless sandboxed commands can run here.

  The first check of a process starts a real container (the same command line as `Sandbox.run`) running
  `python3 -I -c pass`, so every way a call could fail to set up shows here, before any task is scored.
  """
  bwrap = BWRAP
  if not (os.path.isfile(bwrap) and os.access(bwrap, os.X_OK)):
    raise SandboxUnavailable(
        f"The sandbox needs bubblewrap at {bwrap}, which is missing: install it (`apt-get install bubblewrap`, or "
        "`make setup` as root); untrusted code is never run unsandboxed.")
  for tool, does in ((PRLIMIT, "applies its limits"), (SETPRIV, "switches host root to nobody")):
    if (tool == PRLIMIT or _host_user() is not None) and not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
      raise SandboxUnavailable(f"The sandbox {does} with {tool} (util-linux), which is missing: install util-linux.")
  _seccomp()  # an architecture the filter does not know refuses here, in its own sentence
  key = (bwrap, PRLIMIT, _roots_dir(), os.geteuid())
  with _probe_lock:
    if key in _probed:
      return
    _probe(bwrap)
    _probed.add(key)


def _probe(bwrap: str) -> None:
  """Runs `_PROBE_COMMAND` in a real sandbox; raises SandboxUnavailable naming the fix when that fails."""
  box = Sandbox.__new__(Sandbox)  # not Sandbox(): its constructor calls check_available
  try:
    box._setup({}, SandboxLimits(wall_s=30.0))
    result, setup_error = box._execute(_PROBE_COMMAND, None, None)
  except OSError as e:
    raise SandboxUnavailable(f"bubblewrap at {bwrap} could not be started ({e}); reinstall bubblewrap, and keep "
                             f"{_roots_dir()}, where sandboxes are made, a writable directory.") from e
  finally:
    if getattr(box, "_root", None) is not None:
      box.close()
  if setup_error is not None:
    if "unknown option" in setup_error.lower() or "unrecognized option" in setup_error.lower():
      fix = "install bubblewrap 0.8 or newer (the sandbox uses --disable-userns, --size and --json-status-fd)"
    else:
      fix = ("allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 and "
             "user.max_user_namespaces > 0) or run in a container that permits them, and keep "
             f"{_roots_dir()}, where sandboxes are made, traversable by the sandbox's user"
             f"{' (nobody: host root runs the sandbox as nobody)' if _host_user() else ''}")
    raise SandboxUnavailable(f"bubblewrap at {bwrap} cannot build the sandbox here ({setup_error}): {fix}.")
  if not result.ok:
    why = "timed out" if result.timed_out else (
        f"exit {result.exit_code}: " + (result.stderr.strip().splitlines()[-1:] or ["no message"])[0])
    raise SandboxUnavailable(
        f"The sandbox starts, but `{_PROBE_COMMAND}` fails inside it ({why}): install Python 3 at /usr/bin/python3 "
        "(`apt-get install python3`), which runs every task.")


_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def _system_dir_args() -> list[str]:
  """/bin, /lib*, /sbin as on the host: merged-/usr symlinks stay symlinks, real directories are bound read-only."""
  args = []
  for name in _SYSTEM_DIRS:
    if os.path.islink(name):
      args += ["--symlink", os.readlink(name), name]
    elif os.path.isdir(name):
      args += ["--ro-bind", name, name]
  return args


def _masked_dirs() -> list[str]:
  """The PRIVATE_DIRS the container would see (they resolve under a host directory it binds), resolved."""
  bound = ["/usr", "/etc/alternatives"] + [d for d in _SYSTEM_DIRS if os.path.isdir(d) and not os.path.islink(d)]
  roots = [pathlib.Path(os.path.realpath(b)) for b in bound if os.path.isdir(b)]
  masked = []
  for d in PRIVATE_DIRS:
    path = pathlib.Path(os.path.realpath(d))
    # A bound root itself is never masked: that would take the whole system away, and it holds no task data.
    if path.is_dir() and any(path != root and path.is_relative_to(root) for root in roots):
      masked.append(str(path))
  return sorted(masked)


def _mask_args() -> list[str]:
  args = []
  for path in _masked_dirs():
    # Small and read-only: the mask must neither leak the host's files nor become writable host memory.
    args += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
  return args


# ---------------------------------------------------------------------------------------------------------------
# Paths.


def _relative(path: str) -> pathlib.PurePosixPath:
  """Validates a workdir-relative POSIX path: not empty, not absolute, no '..', no NUL."""
  if not isinstance(path, str) or not path or "\0" in path:
    raise SandboxPathError(f"{path!r} is not a file path: give a non-empty relative POSIX path.")
  rel = pathlib.PurePosixPath(path)
  if rel.is_absolute() or ".." in rel.parts:
    raise SandboxPathError(f"{path!r} leaves the workdir: give a relative path without '..'.")
  if not rel.parts or rel.parts == (".",):
    raise SandboxPathError(f"{path!r} names the workdir itself, not a file in it.")
  return rel


def _open_regular(path: pathlib.Path, flags: int, shown: str) -> int:
  """An fd of the regular file `path` (never a symlink, FIFO, socket or device), blocking as usual once open.

  O_NONBLOCK makes the open itself return at once: a FIFO the sandboxed code made would otherwise block the host
  until something writes to it (which nothing ever will).
  """
  try:
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
  except OSError as e:
    if e.errno == errno.ENXIO:  # a FIFO without a reader, opened for writing
      raise SandboxPathError(f"{shown!r} is not a regular file (a FIFO or socket): refused.") from None
    raise
  try:
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
      raise IsADirectoryError(errno.EISDIR, "Is a directory", shown)
    if not stat.S_ISREG(mode):
      raise SandboxPathError(f"{shown!r} is not a regular file (a FIFO, socket or device): refused.")
    os.set_blocking(fd, True)
  except BaseException:
    os.close(fd)
    raise
  return fd


class _Visit(enum.Enum):
  """What a `_walk` visitor wants next."""

  DESCEND = "descend"  # into this directory (ignored for anything else)
  SKIP = "skip"  # not into it
  STOP = "stop"  # end the walk here


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(root: pathlib.Path, visit: Callable[[list[str], str, os.stat_result, int], _Visit],
          leave: Callable[[list[str], str, int], None] | None = None, open_up: bool = False) -> None:
  """Visits every entry under `root` (parents first), symlinks never followed, without recursion, two fds open.

  The sandboxed code shapes this tree: it may nest directories thousands deep (a recursive walk overflows
  Python's stack, a full path passes PATH_MAX), swap a directory for a symlink while the host walks, or take the
  permissions off a directory. So every step is relative to the open directory's fd, each component opened with
  O_NOFOLLOW, and the walk climbs back through ".." instead of holding one fd per level (a deep tree would exhaust
  the host's fds). ".." never leaves the workdir: the sandbox cannot rename a directory across the mount of /work.

  Args:
    root: the directory to walk (opened without following a symlink).
    visit: called with (parent's components, name, lstat, parent's fd) per entry; the fd is valid only then.
    leave: called with (parent's components, name, parent's fd) once a directory's entries are all visited.
    open_up: a directory without permissions for the caller is given mode 0700 to be entered.
  """
  fd = os.open(root, _DIR_FLAGS)
  parts: list[str] = []
  stack = [iter(os.listdir(fd))]
  try:
    while stack:
      name = next(stack[-1], None)
      if name is None:
        stack.pop()
        if stack:
          up = os.open("..", _DIR_FLAGS, dir_fd=fd)
          os.close(fd)
          fd = up
          left = parts.pop()
          if leave is not None:
            leave(parts, left, fd)
        continue
      try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
      except FileNotFoundError:
        continue
      what = visit(parts, name, st, fd)
      if what == _Visit.STOP:
        return
      if what != _Visit.DESCEND or not stat.S_ISDIR(st.st_mode):
        continue
      try:
        try:
          child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except PermissionError:
          if not open_up:
            raise
          os.chmod(name, 0o700, dir_fd=fd)  # lstat-checked as a directory just above
          child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
          names = os.listdir(child)
        except BaseException:
          os.close(child)
          raise
      except OSError:
        continue  # gone, turned into a symlink meanwhile, or unreadable: not entered
      os.close(fd)
      fd = child
      parts.append(name)
      stack.append(iter(names))
  finally:
    os.close(fd)


class _CappedOutput:
  """Bytes of one stream, at most `cap` kept: while it fits, all of it; past that, its first and last halves."""

  def __init__(self, cap: int):
    self.cap = max(0, cap)
    self.head = bytearray()  # the first cap // 2 bytes
    self.tail = bytearray()  # the last cap - cap // 2 bytes after the head (all of them while the stream fits)
    self.total = 0

  def add(self, chunk: bytes) -> None:
    self.total += len(chunk)
    room = self.cap // 2 - len(self.head)
    if room > 0:
      self.head += chunk[:room]
      chunk = chunk[room:]
    self.tail += chunk
    excess = len(self.tail) - (self.cap - self.cap // 2)
    if excess > 0:
      del self.tail[:excess]

  @property
  def truncated(self) -> bool:
    return self.total > self.cap

  def text(self) -> str:
    if not self.truncated:
      return bytes(self.head + self.tail).decode(errors="replace")
    cut = self.total - len(self.head) - len(self.tail)
    return (bytes(self.head).decode(errors="replace") + f"\n[... {cut} bytes truncated ...]\n" +
            bytes(self.tail).decode(errors="replace"))


def _drain(stream, out: _CappedOutput) -> None:
  # Keep reading past the cap (discarding) so that the writer is never blocked: its exit code stays real.
  while chunk := stream.read1(1 << 16):
    out.add(chunk)
  stream.close()


def _read_status(fd: int, into: bytearray) -> None:
  """Collects bubblewrap's --json-status-fd output (a few short lines) until bubblewrap closes it."""
  try:
    while chunk := os.read(fd, 4096):
      if len(into) < 65536:
        into += chunk
  except OSError:
    pass
  finally:
    os.close(fd)


def _command_started(status: bytes) -> bool:
  """Whether bubblewrap's status lines say that the command itself was started (it reports "exit-code" then)."""
  for line in status.decode(errors="replace").splitlines():
    try:
      if "exit-code" in json.loads(line):
        return True
    except (ValueError, TypeError):
      continue
  return False


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
  """Whether `proc` exited within `timeout_s` seconds (reaped then), woken the moment it exits.

  Popen.wait(timeout) polls, sleeping 1, 2, 4, ... up to 50 ms between looks, so a call that ends at 45 ms is seen at
  63 ms; a pidfd (Linux 5.3+) becomes readable when the process exits. It is safe against pid reuse: the process is
  ours and not yet reaped, so its pid names it until `wait`. Elsewhere the polling wait remains.
  """
  try:
    fd = os.pidfd_open(proc.pid)
  except (AttributeError, OSError):  # no pidfd_open here (an older kernel, a non-Linux host)
    try:
      proc.wait(timeout=timeout_s)
      return True
    except subprocess.TimeoutExpired:
      return False
  try:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    # Whole milliseconds in a C int; a longer (or infinite) timeout waits for the exit alone. EINTR is retried.
    ms = max(0, math.ceil(timeout_s * 1000)) if timeout_s < (2**31 - 1) / 1000 else None
    exited = bool(poller.poll(ms))
  finally:
    os.close(fd)
  if exited:
    proc.wait()  # returns at once: the process has exited
  return exited


def _feed(stream, data: bytes) -> None:
  try:
    stream.write(data)
  except (BrokenPipeError, OSError):
    pass  # The command exited without reading all of its input.
  finally:
    try:
      stream.close()
    except OSError:
      pass


# ---------------------------------------------------------------------------------------------------------------
# The sandbox.


_TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# (host path, size, mtime_ns) -> its copy in a 0755 directory under TMPDIR: a tool's own directory may be closed to
# the user bubblewrap runs as (host root runs the container as nobody, who cannot pass a 0700 directory such as a
# checkout under `mktemp -d`); one copy per process and file version, removed at exit.
_TOOL_COPIES: dict[tuple[str, int, int], str] = {}
_TOOL_COPIES_LOCK = threading.Lock()


def _bindable_copy(real: str) -> str:
  """A copy of the executable `real` that any user can read and run (made once per process and file version)."""
  st = os.stat(real)
  key = (real, st.st_size, st.st_mtime_ns)
  with _TOOL_COPIES_LOCK:
    if key not in _TOOL_COPIES:
      folder = tempfile.mkdtemp(prefix="c2jax-sandbox-tool-")
      os.chmod(folder, 0o755)  # mkdtemp makes it 0700
      atexit.register(shutil.rmtree, folder, ignore_errors=True)
      copy = os.path.join(folder, os.path.basename(real))
      shutil.copyfile(real, copy)
      os.chmod(copy, 0o755)
      _TOOL_COPIES[key] = copy
    return _TOOL_COPIES[key]


def _check_tools(tools: Mapping[str, str]) -> dict[str, str]:
  """The tools a sandbox binds (name -> the host copy bound, `_bindable_copy`); a bad name or a missing executable
  raises one sentence."""
  out = {}
  for name, path in tools.items():
    if not _TOOL_NAME.fullmatch(name) or name == "python":
      raise ValueError(f"Sandbox tool name {name!r} must be a plain file name (letters, digits, '_', '.', '-').")
    real = os.path.realpath(path)
    if not (os.path.isfile(real) and os.access(real, os.X_OK)):
      raise ValueError(f"Sandbox tool {name!r} at {path!r} is not an executable file; install it or fix the path.")
    out[name] = _bindable_copy(real)
  return out


class Sandbox:
  """A private writable copy of a repository and the bubblewrap container its commands run in.

  Args:
    files: relative POSIX path -> content (str is written as UTF-8) of the starting repository.
    limits: the per-call resource limits.
    tools: name -> a host executable, bound read-only at /opt/c2jax/bin/<name> (on the container's PATH): a
      trusted program the caller runs over the files, e.g. a linter (`c2jax.envs.grading.quality`). It runs under
      the same limits and namespaces as any command; it must need nothing outside /usr and /lib* (a static binary,
      or one linked against the system's libraries).

  Raises:
    SandboxUnavailable: bubblewrap is missing or unusable (nothing is created then).
    SandboxPathError: a path is absolute or contains '..'.
    ValueError: the files do not fit `limits.workdir_mb` or `limits.workdir_entries` (where those hold).
  """

  def __init__(self, files: Mapping[str, str | bytes], limits: SandboxLimits = SandboxLimits(),
               tools: Mapping[str, str] | None = None):
    check_available()
    self._setup(files, limits, _check_tools(tools or {}))

  def _setup(self, files: Mapping[str, str | bytes], limits: SandboxLimits,
             tools: Mapping[str, str] | None = None) -> None:
    rels = {path: _relative(path) for path in files}  # refuse bad paths before anything touches the disk
    self.limits = limits
    self._tools = dict(tools or {})
    self._user = _host_user()
    self._mounted = False
    self._closed = True  # until the root exists: close() then has nothing to delete
    # The owner's pid in the name: a process killed before close() leaves its mounted workdir for the next
    # process's `reap_stale_workdirs`.
    self._root = pathlib.Path(tempfile.mkdtemp(prefix=f"c2jax-sandbox-{os.getpid()}-", dir=_roots_dir()))
    self._closed = False
    try:
      self._workdir = self._root / "work"
      self._workdir.mkdir()
      if _detected()[0].disk == DiskBound.TMPFS:
        # The workdir's own filesystem, for the sandbox's whole life: the episode's repository lives there across
        # calls, and a call's writes stop at its size (ENOSPC) instead of filling the host's disk.
        _mount_tmpfs(self._workdir, limits.workdir_mb, limits.workdir_entries)
        self._mounted = True
      etc = self._root / "etc"
      etc.mkdir()
      (etc / "passwd").write_text(f"sandbox:x:{_INSIDE_UID}:{_INSIDE_UID}:sandbox:/tmp:/bin/sh\n"
                                  "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
      (etc / "group").write_text(f"sandbox:x:{_INSIDE_UID}:\nnogroup:x:65534:\n")
      (etc / "hostname").write_text("sandbox\n")
      # Explicit modes: under a umask of 077 bubblewrap, running as another user (nobody), could not read them.
      os.chmod(etc, 0o755)
      for name in ("passwd", "group", "hostname"):
        os.chmod(etc / name, 0o644)
      self._own(self._root)
      self._own(self._workdir)
      for path, content in files.items():
        try:
          self._write(rels[path], content)
        except OSError as e:
          if e.errno != errno.ENOSPC:
            raise
          raise ValueError(f"The starting files do not fit the workdir ({limits.workdir_mb} MiB, "
                           f"{limits.workdir_entries} entries): raise SandboxLimits.workdir_mb or "
                           "workdir_entries.") from None
    except BaseException:
      self.close()
      raise

  @property
  def workdir(self) -> pathlib.Path:
    """The host path of the writable copy (mounted at /work inside)."""
    return self._workdir

  # -- running ----------------------------------------------------------------------------------------------------

  def _argv(self, command: str, status_fd: int, seccomp_fd: int) -> list[str]:
    lim = self.limits
    tmp_bytes = str(lim.file_size_mb << 20)
    etc = self._root / "etc"
    return [
        BWRAP,
        # JSON lines: "exit-code" appears only once the command was started, which tells setup failures apart.
        "--json-status-fd", str(status_fd),
        "--unshare-all", "--unshare-user", "--disable-userns",
        "--uid", str(_INSIDE_UID), "--gid", str(_INSIDE_UID), "--hostname", "sandbox",
        "--die-with-parent", "--new-session",
        "--seccomp", str(seccomp_fd),  # the command and all it starts; bubblewrap's init is hidden below instead
        "--clearenv",
        "--setenv", "PATH", _PATH, "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp",
        "--setenv", "USER", "sandbox", "--setenv", "LANG", "C.UTF-8", "--setenv", "LC_ALL", "C.UTF-8",
        # No __pycache__ in the repository (diffs and grading see only what the code wrote); hashing is
        # deterministic so that a rerun of a task behaves the same.
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "PYTHONHASHSEED", "0",
        "--ro-bind", "/usr", "/usr",
        *_system_dir_args(),
        "--dir", "/etc",
        "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
        "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
        "--ro-bind", str(etc / "passwd"), "/etc/passwd",
        "--ro-bind", str(etc / "group"), "/etc/group",
        "--ro-bind", str(etc / "hostname"), "/etc/hostname",
        # Debian ships python3 only; `python` is a promise of the environment.
        "--symlink", "/usr/bin/python3", "/opt/c2jax/bin/python",
        *[arg for name, path in self._tools.items() for arg in ("--ro-bind", path, f"/opt/c2jax/bin/{name}")],
        "--proc", "/proc",
        # bubblewrap's init (PID 1) is the one process inside without the seccomp filter: no /proc/1 (its mem,
        # fds, environ) for anything to write through.
        "--size", "4096", "--tmpfs", "/proc/1", "--remount-ro", "/proc/1",
        "--dev", "/dev",
        "--size", tmp_bytes, "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", tmp_bytes, "--tmpfs", "/tmp",
        *_mask_args(),
        "--bind", str(self._workdir), _WORK,
        "--chdir", _WORK,
        "--remount-ro", "/",
        "--",
        # The other rlimits were set before bubblewrap started (`_launcher`); this one counts per user namespace
        # only when set inside it.
        PRLIMIT, f"--nproc={lim.max_procs}", "--",
        "/bin/sh", "-c", command,
    ]

  def run(self, command: str, timeout_s: float | None = None, stdin: str | None = None) -> RunResult:
    """Runs `command` with /bin/sh -c in a fresh container over the workdir (see the module docstring).

    Args:
      command: shell text; its cwd is /work, the writable copy.
      timeout_s: wall-clock limit for this call; `limits.wall_s` when None.
      stdin: text fed to the command's standard input (empty input when None).

    Returns:
      The RunResult; every process the command started is dead when this returns.

    Raises:
      SandboxUnavailable: bubblewrap is gone, or the container could not be built (the command never started).
    """
    if self._closed:
      raise RuntimeError("This sandbox is closed: create a new one.")
    check_available()
    result, setup_error = self._execute(command, timeout_s, stdin)
    if setup_error is not None:
      raise SandboxUnavailable(f"bubblewrap at {BWRAP} could not build this sandbox ({setup_error}); the command "
                               "did not run: check the host (namespaces, TMPDIR, disk space) and retry.")
    return result

  def _execute(self, command: str, timeout_s: float | None, stdin: str | None) -> tuple[RunResult, str | None]:
    """The result of one container, and bubblewrap's last error line when the command never started."""
    lim = self.limits
    wall = lim.wall_s if timeout_s is None else timeout_s
    start = time.monotonic()
    program = _seccomp()
    hierarchy = _detected()[1]
    group = None
    if hierarchy is not None:
      try:
        # +1: bubblewrap's own host-side process is in the cgroup too.
        group = cgroup_lib.CallCgroup(hierarchy, memory_bytes=_call_memory_mb(lim) << 20, max_pids=lim.max_procs + 1)
      except OSError as e:
        raise SandboxUnavailable(f"The sandbox could not make this call's cgroup under {hierarchy.memory_parent} "
                                 f"({e}); the command did not run: check the host's cgroups and retry.") from e
    try:
      return self._contained(command, wall, stdin, start, program, group)
    finally:
      if group is not None:
        group.remove(_KILL_GRACE_S)

  def _contained(self, command: str, wall: float, stdin: str | None, start: float, program: bytes,
                 group: cgroup_lib.CallCgroup | None) -> tuple[RunResult, str | None]:
    status_read, status_write = os.pipe()
    seccomp_read, seccomp_write = os.pipe()
    try:
      os.write(seccomp_write, program)  # a few hundred bytes: the pipe's buffer holds them all
    finally:
      os.close(seccomp_write)  # bwrap reads the program up to EOF
    try:
      proc = subprocess.Popen(
          _launcher(self.limits, group) + self._argv(command, status_write, seccomp_read),
          stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          start_new_session=True,  # its own process group, so that a timeout kills bwrap and nothing else
          close_fds=True, pass_fds=(status_write, seccomp_read), env={"PATH": "/usr/bin:/bin"})
    except BaseException:
      os.close(status_read)
      raise
    finally:
      os.close(status_write)  # bwrap holds its own copy; EOF then comes when bwrap is gone
      os.close(seccomp_read)
    status = bytearray()
    out = _CappedOutput(self.limits.output_bytes)
    err = _CappedOutput(self.limits.output_bytes)
    threads = [threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
               threading.Thread(target=_read_status, args=(status_read, status), daemon=True)]
    if stdin is not None:
      threads.append(threading.Thread(target=_feed, args=(proc.stdin, stdin.encode()), daemon=True))
    for t in threads:
      t.start()
    timed_out = not _wait(proc, wall)
    if timed_out:
      # SIGKILL to bwrap; --die-with-parent then kills the container's PID 1, and with it its whole namespace.
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()
    for t in threads:
      t.join(timeout=_KILL_GRACE_S)
    elapsed = time.monotonic() - start
    code = None if timed_out else proc.returncode
    if code is not None and code < 0:  # bwrap itself killed by a signal (it reports its child's as 128 + N)
      code = 128 - code
    result = RunResult(exit_code=code, stdout=out.text(), stderr=err.text(), timed_out=timed_out,
                       truncated=out.truncated or err.truncated, wall_s=elapsed,
                       oom_kills=group.oom_kills() if group is not None else 0)
    setup_error = None
    if not timed_out and not _command_started(bytes(status)):
      lines = result.stderr.strip().splitlines()
      setup_error = lines[-1] if lines else f"bubblewrap exited with {code} before starting the command"
    return result, setup_error

  # -- host-side files --------------------------------------------------------------------------------------------

  def _own(self, path: pathlib.Path) -> None:
    """Hands a host-created path to the container's host user (when that is not the caller)."""
    if self._user is not None:
      os.chown(path, *self._user, follow_symlinks=False)

  def _resolve(self, rel: pathlib.PurePosixPath) -> pathlib.Path:
    """The host path of `rel` with symlinks followed; refuses any resolution outside the workdir."""
    root = self._workdir.resolve()
    target = (root / rel).resolve()
    if target != root and not target.is_relative_to(root):
      raise SandboxPathError(f"{rel.as_posix()!r} resolves outside the workdir (a symlink escape): refused.")
    if target == root:
      raise SandboxPathError(f"{rel.as_posix()!r} names the workdir itself, not a file in it.")
    return target

  def _write(self, rel: pathlib.PurePosixPath, content: str | bytes) -> None:
    target = self._resolve(rel)
    root = self._workdir.resolve()
    # Create missing parents one by one so each is handed to the container's user.
    parent = root
    for part in target.relative_to(root).parts[:-1]:
      parent = parent / part
      if not parent.exists():
        parent.mkdir()
        self._own(parent)
      elif not parent.is_dir():
        raise SandboxPathError(f"{rel.as_posix()!r}: {parent.relative_to(root).as_posix()!r} is not a directory.")
    data = content.encode() if isinstance(content, str) else bytes(content)
    # O_NOFOLLOW: the target was resolved above, so a symlink here would be a new one; never write through it.
    # No O_TRUNC at open: only a file proven regular is truncated.
    fd = _open_regular(target, os.O_WRONLY | os.O_CREAT, rel.as_posix())
    with os.fdopen(fd, "wb") as f:
      f.truncate(0)
      f.write(data)
    self._own(target)

  def read_file(self, path: str) -> str:
    """The text of a workdir file (UTF-8, undecodable bytes replaced); refuses paths that leave the workdir."""
    target = self._resolve(_relative(path))
    fd = _open_regular(target, os.O_RDONLY, path)
    with os.fdopen(fd, "rb") as f:
      return f.read().decode(errors="replace")

  def write_file(self, path: str, content: str | bytes) -> None:
    """Creates or replaces a workdir file (parents created); refuses paths that leave the workdir."""
    self._write(_relative(path), content)

  def delete_file(self, path: str) -> None:
    """Removes a workdir file (a symlink itself, never its target); refuses paths that leave the workdir."""
    rel = _relative(path)
    parent = self._resolve(rel.parent) if rel.parent.parts else self._workdir.resolve()
    target = parent / rel.name
    if target.is_dir() and not target.is_symlink():
      raise IsADirectoryError(f"{path!r} is a directory, not a file.")
    os.unlink(target)

  def list_files(self) -> list[str]:
    """Relative POSIX paths of the workdir's regular files, sorted; symlinks are neither listed nor followed.

    Paths longer than PATH_MAX (4096 bytes) are not listed: no repository needs one, and the host could not open
    them by name. Names need not be UTF-8 (undecodable bytes come back as surrogate escapes, as os.listdir does).
    """
    return sorted(rel for rel, _ in self._regular_files(read=False))

  def files(self, max_file_bytes: int | None = None) -> dict[str, str]:
    """The workdir's UTF-8 text files (path -> content), e.g. for grading, diffs and code search; binary files, files
    whose path is not UTF-8, and files over `max_file_bytes` (when given; those are not read) are skipped."""
    texts = {}
    for rel, data in self._regular_files(read=True, max_bytes=max_file_bytes):
      try:
        rel.encode()
        texts[rel] = data.decode()
      except UnicodeError:
        continue
    return dict(sorted(texts.items()))

  def _regular_files(self, read: bool, max_bytes: int | None = None) -> list[tuple[str, bytes]]:
    """(relative path, content if `read` else b"") of every regular file, each opened relative to its directory's
    fd without following a symlink, so a directory swapped for a symlink meanwhile leads nowhere outside; with
    `max_bytes`, a file larger than that is left out, and not read past it."""
    found = []

    def visit(parts: list[str], name: str, st: os.stat_result, dir_fd: int) -> _Visit:
      rel = "/".join([*parts, name])
      if len(os.fsencode(rel)) + len(os.fsencode(str(self._workdir))) >= _PATH_MAX:
        return _Visit.SKIP  # and nothing below it
      if stat.S_ISDIR(st.st_mode):
        return _Visit.DESCEND
      if stat.S_ISREG(st.st_mode):
        if not read:
          found.append((rel, b""))
          return _Visit.SKIP
        if max_bytes is not None and st.st_size > max_bytes:
          return _Visit.SKIP
        try:
          fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError:
          return _Visit.SKIP
        with os.fdopen(fd, "rb") as f:
          if stat.S_ISREG(os.fstat(fd).st_mode):  # still the regular file that was listed
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
            if max_bytes is None or len(data) <= max_bytes:
              found.append((rel, data))
      return _Visit.SKIP

    _walk(self._workdir, visit)
    return found

  def usage(self, max_bytes: int | None = None, max_entries: int | None = None) -> tuple[int, int]:
    """(bytes of regular files, entries of any kind) in the workdir, symlinks not followed.

    Counting stops as soon as either count passes its cap (when given), so measuring a workdir flooded with files
    costs no more than the caps; the counts returned are then just past the cap. A directory the sandboxed code
    made unreadable is opened up (mode 0700) to be counted; however deep the tree, it is counted whole.
    """
    totals = [0, 0]

    def visit(parts: list[str], name: str, st: os.stat_result, dir_fd: int) -> _Visit:
      totals[1] += 1
      if stat.S_ISREG(st.st_mode):
        totals[0] += st.st_size
      if (max_bytes is not None and totals[0] > max_bytes) or (max_entries is not None and totals[1] > max_entries):
        return _Visit.STOP
      return _Visit.DESCEND

    _walk(self._workdir, visit, open_up=True)
    return totals[0], totals[1]

  # -- lifetime ---------------------------------------------------------------------------------------------------

  def close(self) -> None:
    """Deletes the workdir (unmounting its tmpfs first); the sandbox cannot run afterwards. Idempotent."""
    if self._closed:
      return
    self._closed = True
    if self._mounted:
      try:
        _unmount(self._workdir)
        self._mounted = False
      except OSError:
        pass  # then the tree is emptied file by file below, and only the mount point itself may stay
    _remove_tree(self._root)

  def __enter__(self) -> Sandbox:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()

  def __del__(self) -> None:
    if getattr(self, "_root", None) is not None and not getattr(self, "_closed", True):
      self.close()


def _call_memory_mb(lim: SandboxLimits) -> int:
  return 2 * lim.memory_mb if lim.call_memory_mb is None else lim.call_memory_mb


def _remove_tree(root: pathlib.Path) -> None:
  """Deletes `root` even where the sandboxed code left directories without permissions (mode 000, 0555), nested
  them thousands deep, or named them with bytes that are not UTF-8.

  Every directory is opened up (0700) before it is entered: a non-root owner can neither list nor empty a
  directory without r/w/x on it. `_walk` follows no symlink (a chmod or unlink through one would change a host
  directory) and needs neither recursion nor one fd per level. What cannot be removed is left in place, silently.
  """
  if not os.path.lexists(root):
    return
  try:
    os.chmod(root, 0o700)
  except OSError:
    pass

  def visit(parts: list[str], name: str, st: os.stat_result, dir_fd: int) -> _Visit:
    if stat.S_ISDIR(st.st_mode):
      return _Visit.DESCEND
    try:
      os.unlink(name, dir_fd=dir_fd)
    except OSError:
      pass
    return _Visit.SKIP

  def leave(parts: list[str], name: str, dir_fd: int) -> None:
    try:
      os.rmdir(name, dir_fd=dir_fd)
    except OSError:
      pass

  try:
    _walk(root, visit, leave, open_up=True)
  except OSError:
    pass  # the root itself is unreadable or gone
  try:
    os.rmdir(root)
  except OSError:
    pass


class SandboxPool:
  """Bounded concurrency for sandboxed work: at most `max_workers` functions (each usually a sandbox) at once.

  Threads suffice: each sandboxed command is a subprocess, so the GIL is released while it runs.
  """

  def __init__(self, max_workers: int):
    if max_workers < 1:
      raise ValueError(f"max_workers must be >= 1, got {max_workers}.")
    self.max_workers = max_workers
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers,
                                                           thread_name_prefix="c2jax-sandbox")

  def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> concurrent.futures.Future:
    return self._executor.submit(fn, *args, **kwargs)

  def map(self, fn: Callable[[Any], Any], iterable: Iterable[Any]) -> list:
    """fn over the items, in order; the first exception raised by a call is re-raised here."""
    return list(self._executor.map(fn, iterable))

  def close(self, cancel: bool = False) -> None:
    """Waits for the running calls; with `cancel`, queued calls that have not started are dropped first."""
    self._executor.shutdown(wait=True, cancel_futures=cancel)

  def __enter__(self) -> SandboxPool:
    return self

  def __exit__(self, exc_type: object, *exc: object) -> None:
    # On an error (Ctrl-C, a failed job re-raised by the caller) the rest of the queue is not worth waiting for.
    self.close(cancel=exc_type is not None)
