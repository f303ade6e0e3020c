"""Attacks on the sandbox from inside `Sandbox.run`, each written as the attacker would, through the real code paths.

Every case asserts what the attack achieved inside (nothing it was after) and, through `SandboxTestCase`'s
tearDown, that the host is unchanged: watched host files keep their hashes and no process marked by the case
outlives its call. Cases that need the per-call cgroup or the workdir's own tmpfs skip (or fail, where CI requires
them) with the base class's sentence; the host-side cases run wherever bubblewrap does.
"""

import errno
import json
import os
import pathlib
import shlex
import socket
import threading
import time
from unittest import mock

from absl.testing import absltest

from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.sandbox.sandbox import Sandbox, SandboxLimits
from tests.sandbox.sandbox_test import FAST, SandboxTestCase, _call_cgroups, _workdir_mounts

# A call cap well under the 4 x 8 MiB tmpfs pages and buffers the memory attacks try to pin.
TIGHT = SandboxLimits(wall_s=20.0, cpu_s=10, memory_mb=256, max_procs=32, output_bytes=4096, file_size_mb=8,
                      call_memory_mb=300, workdir_mb=16)
_DEPTH = 3000  # past Python's recursion limit (1000) and, at two bytes a level, past PATH_MAX (4096)
_NEST = f"import os\nfor _ in range({_DEPTH}):\n  os.mkdir('d'); os.chdir('d')\nopen('deep.txt', 'w').write('x')\n"


def _shmem_mb() -> int:
  """The host's shmem (tmpfs and memfd pages) in MiB."""
  with open("/proc/meminfo") as f:
    for line in f:
      if line.startswith("Shmem:"):
        return int(line.split()[1]) >> 10
  raise AssertionError("no Shmem in /proc/meminfo")


def _fallback():
  """The containment of a host without cgroups or a workdir tmpfs: the workdir lies on the host's own disk."""
  fallback = sandbox_lib.Containment(cgroup=None, disk=sandbox_lib.DiskBound.AFTER_CALL, missing=("forced",))
  return mock.patch.dict(sandbox_lib._containments, {os.geteuid(): (fallback, None)})


class MemoryAttackTest(SandboxTestCase):
  """Memory that rlimits do not see (memfd, socket buffers) is still the call's: the cgroup ends it."""

  def setUp(self):
    super().setUp()
    self.require_cgroup()

  def test_memfd_pages_past_the_call_cap_are_oom_killed(self):
    # Each memfd holds 8 MiB (its FSIZE cap) of shmem, mapped nowhere, so RLIMIT_AS never sees it.
    script = ("import os\nfds = []\nfor i in range(100):\n  fd = os.memfd_create(f'm{i}')\n"
              "  for _ in range(8):\n    os.write(fd, b'x' * (1 << 20))\n  fds.append(fd)\n"
              "print('held', len(fds) * 8, flush=True)\n")
    before = _shmem_mb()
    r = self.box({"m.py": script}, TIGHT).run(f"python3 m.py # {self.marker}")
    self.assertEqual((r.exit_code, r.oom_kills), (137, 1), r)
    self.assertNotIn("held", r.stdout)  # 800 MiB asked for, killed before it held them
    # The ~300 MiB of shmem it did hold went with the call (a margin for other users' tmpfs meanwhile).
    self.assertLess(_shmem_mb(), before + 100)

  def test_one_big_memfd_is_refused_by_the_file_size_limit(self):
    script = "import os\nfd = os.memfd_create('x')\nos.ftruncate(fd, 1 << 30)\n"
    r = self.box(limits=TIGHT).run(f"python3 -c {shlex.quote(script)}")
    self.assertEqual(r.exit_code, 1)
    self.assertIn("File too large", r.stderr)

  def test_unix_socket_buffers_past_the_call_cap_are_oom_killed(self):
    # Kernel memory queued in datagram sockets: up to 20000 fds (RLIMIT_NOFILE) x 200 KiB would be 4 GB.
    script = ("import socket\nkeep = []\nfor _ in range(10000):\n"
              "  a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n  a.setblocking(False)\n"
              "  try:\n    while True:\n      a.send(b'x' * 60000)\n  except BlockingIOError:\n    pass\n"
              "  keep.append((a, b))\nprint('held', len(keep), flush=True)\n")
    r = self.box({"s.py": script}, TIGHT).run(f"python3 s.py # {self.marker}")
    self.assertEqual((r.exit_code, r.oom_kills), (137, 1), r)
    self.assertNotIn("held", r.stdout)

  def test_tmp_and_shm_hold_their_size_only(self):
    r = self.box(limits=TIGHT).run("for d in /tmp /dev/shm; do for i in $(seq 20); do "
                                   "head -c 4000000 /dev/zero > $d/f$i 2>/dev/null || break; done; done; "
                                   "du -sk /tmp /dev/shm")
    self.assertTrue(r.ok, r)
    sizes = [int(line.split()[0]) for line in r.stdout.splitlines()]
    self.assertLen(sizes, 2)
    for kib in sizes:
      self.assertLessEqual(kib, TIGHT.file_size_mb << 10)


class ProcessAttackTest(SandboxTestCase):

  def test_threads_count_against_the_process_limit(self):
    # Threads rather than processes: small stacks so that the address-space limit is not what stops them.
    script = ("import threading, time\nthreading.stack_size(64 << 10)\nn = 0\ntry:\n  for _ in range(500):\n"
              "    threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); n += 1\n"
              "except RuntimeError:\n  pass\nprint(n)\n")
    r = self.box(limits=TIGHT).run(f"python3 -c {shlex.quote(script)} {self.marker}")
    self.assertTrue(r.ok, r)
    self.assertLess(int(r.stdout), TIGHT.max_procs)

  def test_detached_sessions_and_reparented_orphans_die_with_the_call(self):
    # setsid + double fork (reparented to the namespace's init), nohup, a process group of its own, and a vfork
    # storm of short-lived children while the call ends.
    daemon = ("import os, time\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\n"
              "os.setpgid(0, 0)\ntime.sleep(1000)\n")
    box = self.box({f"{self.marker}.py": daemon})
    r = box.run(f"python3 {self.marker}.py; nohup sleep 1000 {self.marker} >/dev/null 2>&1 & "
                f"setsid sh -c 'sleep 1000' {self.marker} & "
                f"(while :; do /bin/true; done) & echo started # {self.marker}", timeout_s=3)
    self.assertEqual(r.stdout, "started\n")
    self.assertFalse(r.timed_out)  # the shell ended; what it left behind died with the namespace

  def test_a_kill_race_at_the_timeout_leaves_no_cgroup(self):
    self.require_cgroup()
    box = self.box({"storm.sh": "while :; do (sleep 10 &) ; done\n"})
    for timeout in (0.3, 0.6, 1.0):
      r = box.run(f"sh storm.sh # {self.marker}", timeout_s=timeout)
      self.assertTrue(r.timed_out)
      self.assertEqual(_call_cgroups(), [])


class EscapeAttackTest(SandboxTestCase):

  def test_cgroups_sys_and_the_host_init_are_out_of_sight(self):
    r = self.box().run("cat /proc/self/cgroup; ls /sys /sys/fs/cgroup; ls /proc/1; cat /proc/1/environ; "
                       "echo 0 > /proc/sys/kernel/core_pattern; true")
    self.assertTrue(all(line.endswith(":/") for line in r.stdout.splitlines()), r.stdout)  # its own namespace's root
    self.assertIn("cannot access '/sys'", r.stderr)
    self.assertIn("/proc/1/environ: No such file or directory", r.stderr)
    self.assertRegex(r.stderr, "core_pattern: (Permission denied|Read-only file system)")

  def test_namespaces_mounts_and_personality_are_refused(self):
    r = self.box().run("unshare -r true; unshare -m true; unshare -U true; setarch -R true; "
                       "mount -t tmpfs none /work 2>&1; true")
    self.assertEqual(r.stderr.count("Operation not permitted"), 4, r)
    self.assertIn("must be superuser", r.stdout)

  def test_raw_clone_into_new_namespaces_is_refused(self):
    # clone(2) itself is not filtered (every fork uses it): no nested user namespaces, and without capabilities no
    # other namespace either. A child that did start exits at once.
    if os.uname().machine != "x86_64":
      self.skipTest("the clone number and flag layout here are x86_64's; this host is another architecture.")
    flags = {"user": 0x10000000, "mnt": 0x00020000, "net": 0x40000000, "pid": 0x20000000, "cgroup": 0x02000000,
             "ipc": 0x08000000, "uts": 0x04000000}
    script = ("import ctypes, errno, json, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "libc.syscall.restype = ctypes.c_long\nout = {}\nfor name, flag in json.load(sys.stdin).items():\n"
              "  ctypes.set_errno(0)\n  pid = libc.syscall(ctypes.c_long(56), ctypes.c_long(flag | 17), 0, 0, 0, 0)\n"
              "  if pid == 0:\n    os._exit(0)\n  if pid > 0:\n    os.waitpid(pid, 0)\n"
              "  out[name] = errno.errorcode[ctypes.get_errno()] if pid < 0 else 'created'\nprint(json.dumps(out))\n")
    r = self.box().run(f"python3 -c {shlex.quote(script)}", stdin=json.dumps(flags))
    self.assertTrue(r.ok, r)
    self.assertEqual(json.loads(r.stdout), {"user": "ENOSPC", **{k: "EPERM" for k in flags if k != "user"}})

  def test_hard_links_device_nodes_and_immutable_files_are_refused(self):
    box = self.box()
    r = box.run("ln /usr/bin/python3 py; ln /etc/passwd pw; mknod null c 1 3; touch f; chattr +i f; true")
    self.assertEqual(r.stderr.count("Invalid cross-device link"), 2, r)  # /usr and /etc are other mounts
    self.assertIn("mknod: null: Operation not permitted", r.stderr)
    self.assertIn("Operation not permitted while setting flags", r.stderr)
    self.assertEqual(box.list_files(), ["f"])
    box.delete_file("f")  # not immutable: the host can clean it

  def test_a_host_abstract_unix_socket_is_unreachable(self):
    server = socket.socket(socket.AF_UNIX)
    self.addCleanup(server.close)
    name = f"\0{self.marker}".encode()
    server.bind(name)
    server.listen(1)
    r = self.box().run(f"python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect({name!r})\"")
    self.assertIn("ConnectionRefusedError", r.stderr)  # the abstract namespace is per network namespace
    server.settimeout(0.2)
    with self.assertRaises(socket.timeout):
      server.accept()

  def test_proc_self_root_and_cwd_lead_only_into_the_sandbox(self):
    box = self.box()
    r = box.run(f"echo x > /proc/self/root/{self.marker}; echo x > /proc/self/root/tmp/{self.marker} && "
                f"cat /proc/self/root/etc/passwd; ls /proc/self/cwd/; true")
    self.assertIn("Read-only file system", r.stderr)
    self.assertTrue(r.stdout.startswith("sandbox:x:1000:1000:"), r.stdout)
    self.assertFalse(os.path.lexists(f"/{self.marker}"))
    self.assertFalse(os.path.lexists(f"/tmp/{self.marker}"))


class SeccompAttackTest(SandboxTestCase):

  def test_int_0x80_from_a_64_bit_process_is_killed(self):
    # i386 getpid through the compat entry, from machine code in an executable mapping: the filter sees
    # AUDIT_ARCH_I386, whose numbers it does not speak, and kills the process (SIGSYS, 128 + 31).
    if os.uname().machine != "x86_64":
      self.skipTest("int 0x80 is an x86_64 compat entry; this host is another architecture.")
    script = ("import ctypes, mmap\nm = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
              "m.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))\n"
              "f = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(m)))\n"
              "print('calling', flush=True)\nprint('returned', f(), flush=True)\n")
    r = self.box({"i.py": script}).run("python3 i.py")
    self.assertEqual((r.exit_code, r.stdout), (159, "calling\n"), r)

  def test_x32_and_wide_syscall_numbers_are_refused(self):
    if os.uname().machine != "x86_64":
      self.skipTest("x32 numbers are an x86_64 encoding; this host is another architecture.")
    # ptrace (101) as x32, with bit 31 set, and with high bits the kernel truncates away; io_uring_setup as is.
    numbers = {"x32": 0x40000000 | 101, "bit31": (1 << 31) | 101, "high": (1 << 32) | 101, "io_uring": 425}
    script = ("import ctypes, json, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"
              "libc.syscall.restype = ctypes.c_long\nout = {}\n"
              "for k, nr in json.load(sys.stdin).items():\n  ctypes.set_errno(0)\n"
              "  ret = libc.syscall(ctypes.c_long(nr), 0, 0, 0, 0)\n  out[k] = (ret, ctypes.get_errno())\n"
              "print(json.dumps(out))\n")
    r = self.box().run(f"python3 -c {shlex.quote(script)}", stdin=json.dumps(numbers))
    self.assertTrue(r.ok, r)
    self.assertEqual(json.loads(r.stdout), {k: [-1, errno.EPERM] for k in numbers})


class HostSideAttackTest(SandboxTestCase):
  """What the sandboxed code leaves in the workdir must not break, slow or mislead the host's walks."""

  def test_deep_nesting_does_not_break_the_host_walks(self):
    # 3000 levels: a recursive walk (os.walk, shutil.rmtree) overflows Python's stack, a full path passes PATH_MAX.
    box = self.box({"top.txt": "t"}, TIGHT)
    r = box.run(f"python3 -c {shlex.quote(_NEST)}")
    self.assertTrue(r.ok, r)
    self.assertEqual(box.list_files(), ["top.txt"])  # the deep file's path is past PATH_MAX: not listed
    self.assertEqual(box.files(), {"top.txt": "t"})
    self.assertEqual(box.usage(), (2, _DEPTH + 2))  # counted whole all the same
    self.assertEqual(box.usage(max_entries=100)[1], 101)  # and stopped at a cap

  def test_deep_nesting_on_the_host_disk_is_removed_by_close(self):
    # Where the workdir is on the host's own disk (no tmpfs to unmount), close() itself must walk the tree.
    with _fallback():
      box = Sandbox({"top.txt": "t"}, FAST)
      root = box._root
      self.addCleanup(box.close)
      self.assertFalse(os.path.ismount(box.workdir))
      r = box.run(f"python3 -c {shlex.quote(_NEST)} && mkdir -p x/y && chmod 000 x/y x")
      self.assertTrue(r.ok, r)
      self.assertEqual(box.usage()[1], _DEPTH + 4)
      box.close()
    self.assertFalse(os.path.lexists(root))

  def test_non_utf8_names_fifos_sockets_and_symlinks(self):
    box = self.box({"ok.txt": "fine"})
    r = box.run("printf x > \"$(printf 'bad\\377name')\"; mkfifo fifo; ln -s /etc/passwd link; "
                "python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\"; "
                "head -c 16 /dev/urandom > bin.dat; printf '\\377' > latin.txt")
    self.assertTrue(r.ok, r)
    self.assertEqual(box.list_files(), ["bad\udcffname", "bin.dat", "latin.txt", "ok.txt"])
    self.assertEqual(box.files(), {"ok.txt": "fine"})  # text files with UTF-8 paths only, no host file
    self.assertEqual(box.read_file("bad\udcffname"), "x")
    self.assertEqual(box.usage()[1], 7)

  def test_a_directory_swapped_for_a_host_symlink_while_the_host_reads_leaks_nothing(self):
    # The race a path-based reader loses: `d/passwd` is listed as a regular file under a real directory, then
    # `d` becomes a symlink to /etc (the host's, seen from the host) before the host opens `d/passwd` by its path;
    # or an entry listed a moment ago is gone when the host stats it.
    host_secret = pathlib.Path("/etc/passwd").read_text()
    swap = ("import os, time\nos.mkdir('real')\nopen('real/passwd', 'w').write('decoy')\n"
            "end = time.monotonic() + 3\nwhile time.monotonic() < end:\n"
            "  os.rename('real', 'd')\n  os.rename('d', 'real')\n  os.symlink('/etc', 'd')\n  os.unlink('d')\n")
    box = self.box({"swap.py": swap}, TIGHT)
    leaks, errors, listed, rounds = [], [], [], [0]
    done = threading.Event()

    def read_while_swapping():
      while not done.is_set():
        try:
          files = box.files()
        except Exception as e:  # noqa: BLE001
          errors.append(repr(e))
          return
        rounds[0] += 1
        listed.extend(path for path in files if path == "d/passwd")
        leaks.extend(path for path, text in files.items() if text == host_secret)

    reader = threading.Thread(target=read_while_swapping)
    reader.start()
    try:
      r = box.run(f"python3 swap.py # {self.marker}")
    finally:
      done.set()
      reader.join()
    self.assertTrue(r.ok, r)
    self.assertEqual(errors, [])  # the host's walk survives entries vanishing under it
    self.assertGreater(rounds[0], 100)
    self.assertTrue(listed, "the reader never caught `d` as a directory: the race was never run")
    self.assertEqual(leaks, [])

  def test_many_entries_cost_the_host_little(self):
    limits = SandboxLimits(wall_s=30.0, cpu_s=20, memory_mb=256, max_procs=32, output_bytes=4096, file_size_mb=8,
                           workdir_entries=20000)
    box = self.box(limits=limits)
    r = box.run("python3 -c \"import os\nfor i in range(200):\n  os.mkdir(f'd{i}')\n"
                "  for j in range(99):\n    open(f'd{i}/f{j}', 'w').close()\"")
    self.assertTrue(r.ok, r)
    start = time.monotonic()
    self.assertLen(box.list_files(), 19800)
    self.assertEqual(box.usage(), (0, 20000))
    self.assertLess(time.monotonic() - start, 10.0)


class WorkdirAttackTest(SandboxTestCase):

  def setUp(self):
    super().setUp()
    self.require_tmpfs()

  def test_fallocate_sparse_and_inode_floods_stop_at_the_workdir_caps(self):
    limits = SandboxLimits(wall_s=20.0, cpu_s=10, memory_mb=256, max_procs=32, output_bytes=4096, file_size_mb=8,
                           workdir_mb=4, workdir_entries=200)
    box = self.box(limits=limits)
    r = box.run("fallocate -l 100M big; truncate -s 1G sparse; for i in $(seq 7); do fallocate -l 7M f$i || break;"
                " done; mkdir many; for i in $(seq 300); do : > many/$i 2>/dev/null || break; done; echo $i")
    self.assertIn("File size limit exceeded", r.stderr)
    size, entries = box.usage()
    self.assertLessEqual(size, limits.workdir_mb << 20)
    self.assertLessEqual(entries, limits.workdir_entries)
    stats = os.statvfs(box.workdir)
    self.assertLessEqual((stats.f_blocks - stats.f_bfree) * stats.f_frsize, limits.workdir_mb << 20)

  def test_a_file_held_open_across_close_keeps_no_mount(self):
    box = Sandbox({"a.txt": "x"}, FAST)
    workdir = str(box.workdir)
    self.assertTrue(box.run(f"python3 -c {shlex.quote(_NEST)} && mkfifo p && chmod 000 d").ok)
    held = os.open(os.path.join(workdir, "a.txt"), os.O_RDONLY)  # a host reader still in the tmpfs
    try:
      box.close()
    finally:
      os.close(held)
    self.assertNotIn(workdir, _workdir_mounts())
    self.assertFalse(os.path.exists(os.path.dirname(workdir)))
    root = os.path.dirname(workdir)
    self.assertFalse([p for p in os.listdir(os.path.dirname(root)) if p == os.path.basename(root)])


if __name__ == "__main__":
  absltest.main()
