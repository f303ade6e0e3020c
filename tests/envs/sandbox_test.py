"""The bubblewrap sandbox: what runs inside, and adversarial commands that must stay contained.

Every adversarial test asserts containment inside the call AND that the host is unchanged afterwards: marker files
it tried to create do not exist, host files it tried to touch keep their hashes, and no process it started (found
by a unique marker in its command line, scanning /proc) outlives the call. Tests skip with the sandbox's own
sentence where bubblewrap cannot run; the refusal itself is tested everywhere.
"""

import hashlib
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs import sandbox as sandbox_lib
from c2jax.envs.sandbox import RunResult, Sandbox, SandboxLimits, SandboxPathError, SandboxPool

PROJECT = pathlib.Path(__file__).resolve().parents[2]  # the checkout under test, wherever it lives
FAST = SandboxLimits(wall_s=5.0, cpu_s=5, memory_mb=256, max_procs=32, output_bytes=4096, file_size_mb=8)


_unavailable_reason = sandbox_lib.unavailable_reason


def _processes_with(marker: str) -> list[str]:
  """Command lines of live host processes that mention `marker` (a /proc scan, no psutil)."""
  found = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
      continue
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      continue  # exited while we looked
    if marker in cmdline:
      found.append(f"{pid}: {cmdline}")
  return found


def _sha(path: str) -> str | None:
  try:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()
  except OSError:
    return None


class SandboxRequiredTest(absltest.TestCase):

  def test_sandbox_runs_where_it_is_required(self):
    # CI (.ci/run) sets C2JAX_REQUIRE_SANDBOX=1: there the containment tests must run, not skip.
    if os.environ.get("C2JAX_REQUIRE_SANDBOX") != "1":
      self.skipTest("C2JAX_REQUIRE_SANDBOX is not set (only CI requires bubblewrap).")
    self.assertIsNone(_unavailable_reason())


class SandboxTestCase(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    reason = _unavailable_reason()
    if reason:
      self.skipTest(reason)
    self.marker = f"c2jaxprobe{uuid.uuid4().hex[:12]}"
    # Host files an escape would most likely target; tearDown holds them unchanged.
    self._watched = {p: _sha(p) for p in ("/etc/passwd", "/etc/hosts", str(PROJECT / "setup.py"), __file__)}

  def tearDown(self):
    self.assertEqual({p: _sha(p) for p in self._watched}, self._watched, "a host file changed")
    self.assertEqual(_processes_with(self.marker), [], "a sandboxed process outlived its call")
    super().tearDown()

  def box(self, files=None, limits=FAST) -> Sandbox:
    box = Sandbox(files or {}, limits)
    self.addCleanup(box.close)
    return box


class BasicsTest(SandboxTestCase):

  def test_runs_python_in_the_workdir_copy(self):
    box = self.box({"pkg/mod.py": "def f(x):\n  return 2 * x\n", "data.bin": b"\x00\xff"})
    r = box.run("python -c 'from pkg import mod; print(mod.f(21))' && python3 -c 'import sys; print(sys.prefix)'"
                " && pwd && echo made > out.txt")
    self.assertTrue(r.ok, r)
    self.assertEqual(r.stdout.split(), ["42", "/usr", "/work"])  # Debian's python, not the host's venv
    self.assertEqual(box.read_file("out.txt"), "made\n")
    self.assertEqual(box.list_files(), ["data.bin", "out.txt", "pkg/mod.py"])
    self.assertEqual(set(box.files()), {"out.txt", "pkg/mod.py"})  # text files only
    self.assertFalse((box.workdir / "pkg" / "__pycache__").exists())

  def test_exit_codes_stdin_stderr(self):
    box = self.box()
    self.assertEqual(box.run("exit 3").exit_code, 3)
    self.assertEqual(box.run("kill -9 $$").exit_code, 137)
    r = box.run("tr a-z A-Z; echo oops >&2", stdin="hello")
    self.assertEqual((r.stdout, r.stderr, r.ok, r.truncated), ("HELLO", "oops\n", True, False))

  def test_host_side_file_operations(self):
    box = self.box({"a.txt": "one"})
    box.write_file("sub/dir/b.txt", "two")
    self.assertEqual(box.run("cat a.txt sub/dir/b.txt && echo three > sub/dir/b.txt").stdout, "onetwo")
    self.assertEqual(box.read_file("sub/dir/b.txt"), "three\n")
    box.write_file("sub/dir/b.txt", "four")  # a file the sandbox created stays writable from both sides
    self.assertTrue(box.run("echo five >> sub/dir/b.txt").ok)
    box.delete_file("a.txt")
    self.assertEqual(box.files(), {"sub/dir/b.txt": "fourfive\n"})
    with self.assertRaises(FileNotFoundError):
      box.read_file("a.txt")

  @parameterized.parameters("/etc/passwd", "../x", "a/../../x", "", ".")
  def test_bad_paths_are_refused(self, path):
    box = self.box()
    for op in (lambda: box.read_file(path), lambda: box.write_file(path, "x"), lambda: box.delete_file(path)):
      with self.assertRaises(SandboxPathError):
        op()
    with self.assertRaises(SandboxPathError):
      Sandbox({path: "x"})

  def test_close_removes_the_workdir(self):
    box = Sandbox({"a.txt": "x"}, FAST)
    box.run("mkdir -p locked/deep && touch locked/deep/f && chmod 0555 locked/deep locked")
    workdir = box.workdir
    box.close()
    box.close()
    self.assertFalse(workdir.parent.exists())
    with self.assertRaises(RuntimeError):
      box.run("true")

  def test_close_removes_directories_without_permissions(self):
    host_dir = tempfile.mkdtemp()  # reached through a symlink: the cleanup's chmod must not follow it
    self.addCleanup(shutil.rmtree, host_dir, ignore_errors=True)
    os.chmod(host_dir, 0o751)
    box = Sandbox({"a.txt": "x"}, FAST)
    os.symlink(host_dir, box.workdir / "host_link")
    r = box.run("mkdir -p d/e && touch d/e/f && chmod 000 d/e d && mkdir g && chmod 000 g")
    self.assertTrue(r.ok, r)
    root = box.workdir.parent
    box.close()
    self.assertFalse(root.exists())
    self.assertEqual(stat.S_IMODE(os.stat(host_dir).st_mode), 0o751)

  def test_host_environment_is_not_inherited(self):
    with mock.patch.dict(os.environ, {"C2JAX_HOST_SECRET": self.marker}):
      r = self.box().run("env")
    self.assertTrue(r.ok, r)
    self.assertNotIn(self.marker, r.stdout)


class HostSideFileTypesTest(SandboxTestCase):

  def test_fifos_and_sockets_are_refused_at_once(self):
    box = self.box({"a.txt": "x"})
    made = box.run("mkfifo fifo && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\" && mkdir d")
    self.assertTrue(made.ok, made)
    for path in ("fifo", "sock"):
      for op in (lambda: box.read_file(path), lambda: box.write_file(path, "x")):
        start = time.monotonic()  # a blocking open would hang here for good
        with self.assertRaisesRegex(SandboxPathError, "not a regular file", msg=path):
          op()
        self.assertLess(time.monotonic() - start, 1.0)
    self.assertEqual(box.files(), {"a.txt": "x"})
    with self.assertRaises(IsADirectoryError):
      box.read_file("d")

  def test_usage_counts_bytes_and_entries_and_stops_past_a_cap(self):
    box = self.box({"a.txt": "x" * 10})
    self.assertTrue(box.run("mkdir -p d/e && head -c 1000 /dev/zero > d/e/z && ln -s a.txt link && "
                            "for i in $(seq 50); do : > d/f$i; done && chmod 000 d").ok)
    self.assertEqual(box.usage(), (1010, 55))  # a.txt, d, d/e, d/e/z, link, 50 files
    size, entries = box.usage(max_entries=10)
    self.assertEqual(entries, 11)
    self.assertGreater(box.usage(max_bytes=100)[0], 100)


class ContainmentTest(SandboxTestCase):

  def test_no_network_to_the_internet(self):
    r = self.box().run("python3 -c \"import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)\"")
    self.assertNotEqual(r.exit_code, 0)
    self.assertIn("Network is unreachable", r.stderr)

  def test_no_network_to_a_host_server(self):
    server = socket.socket()
    self.addCleanup(server.close)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    r = self.box().run(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3)\"")
    self.assertNotEqual(r.exit_code, 0)
    self.assertIn("ConnectionRefusedError", r.stderr)  # the sandbox's own loopback, where nothing listens
    server.settimeout(0.2)
    with self.assertRaises(socket.timeout):
      server.accept()  # the host's server saw no connection

  def test_cannot_write_outside_the_workdir(self):
    targets = ["/", "/tmp", "/usr", "/etc", "/root", str(PROJECT), str(PROJECT / "c2jax")]
    box = self.box()
    lines = [f"echo x > {t}/{self.marker} && echo WROTE {t}" for t in targets]
    r = box.run("; ".join(lines) + "; true")
    self.assertEqual([line for line in r.stdout.splitlines() if line.startswith("WROTE")], ["WROTE /tmp"])
    self.assertIn("Read-only file system", r.stderr)
    self.assertFalse(box.run(f"test -e /tmp/{self.marker}").ok)  # /tmp is private to each call
    for t in targets:
      self.assertFalse(os.path.lexists(os.path.join(t, self.marker)), t)

  def test_cannot_read_host_home_or_project(self):
    secret_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, secret_dir, ignore_errors=True)
    secret = pathlib.Path(secret_dir) / "secret.txt"
    secret.write_text(self.marker)
    project_text = (PROJECT / "setup.py").read_text()
    box = self.box()
    r = box.run(f"ls -A /root; cat {secret} {PROJECT}/setup.py {__file__} /root/.bashrc; ls {PROJECT}; "
                "ls /home /proc/1/root/root; true")
    self.assertNotIn(self.marker, r.stdout)
    self.assertNotIn(project_text[:200], r.stdout)
    self.assertEqual(r.stdout, "")  # /root and /home do not exist inside; /proc/1/root is the sandbox's own root
    self.assertIn("No such file or directory", r.stderr)

  def test_fork_bomb_is_bounded_and_leaves_nothing(self):
    box = self.box({f"{self.marker}.sh": "bomb() { bomb | bomb & }; bomb; sleep 2\n"})
    start = time.monotonic()
    r = box.run(f"sh {self.marker}.sh", timeout_s=4)
    self.assertLess(time.monotonic() - start, 4 + sandbox_lib._KILL_GRACE_S)
    self.assertIn("fork", r.stderr.lower())  # forks failed at max_procs: the limit, not the machine, stopped it

  def test_process_count_limit(self):
    r = self.box().run("python3 -c \"\nimport subprocess\nps = []\ntry:\n  for _ in range(100):\n"
                       "    ps.append(subprocess.Popen(['sleep', '30']))\nexcept OSError:\n  pass\nprint(len(ps))\"")
    self.assertTrue(r.ok, r)
    self.assertLess(int(r.stdout), FAST.max_procs)
    self.assertGreater(int(r.stdout), FAST.max_procs // 2)

  def test_memory_bomb_is_bounded(self):
    r = self.box().run("python3 -c \"\nblocks = []\nwhile True:\n  blocks.append(bytearray(32 << 20))\"")
    self.assertEqual(r.exit_code, 1)
    self.assertIn("MemoryError", r.stderr)
    self.assertFalse(r.timed_out)

  def test_infinite_loop_hits_the_wall_clock(self):
    start = time.monotonic()
    r = self.box().run(f"python3 -c 'while True: pass' {self.marker}", timeout_s=1.0)
    self.assertTrue(r.timed_out)
    self.assertIsNone(r.exit_code)
    self.assertFalse(r.ok)
    self.assertLess(time.monotonic() - start, 1.0 + sandbox_lib._KILL_GRACE_S)

  def test_cpu_limit_kills_before_the_wall_clock(self):
    limits = SandboxLimits(wall_s=20.0, cpu_s=1, memory_mb=256, max_procs=32, output_bytes=4096, file_size_mb=8)
    r = self.box(limits=limits).run(f"python3 -c 'while True: pass' {self.marker}")
    self.assertFalse(r.timed_out)
    self.assertEqual(r.exit_code, 137)  # SIGKILL at the CPU limit
    self.assertLess(r.wall_s, 10.0)

  def test_huge_output_is_truncated(self):
    r = self.box().run("head -c 30000000 /dev/zero | tr '\\0' a; echo; echo END")
    self.assertTrue(r.ok, r.stderr)
    self.assertTrue(r.truncated)
    self.assertLessEqual(len(r.stdout), FAST.output_bytes + 64)
    self.assertTrue(r.stdout.startswith("aaaa"))
    self.assertTrue(r.stdout.endswith("a\nEND\n"))  # the tail is kept: summaries come last
    self.assertIn("bytes truncated", r.stdout)

  def test_endless_output_is_truncated_and_stopped(self):
    r = self.box().run(f"yes {self.marker}", timeout_s=1.0)
    self.assertTrue(r.timed_out and r.truncated)
    self.assertLessEqual(len(r.stdout), FAST.output_bytes + 64)

  def test_file_size_limit(self):
    box = self.box()
    r = box.run(f"head -c {(FAST.file_size_mb + 1) << 20} /dev/zero > big.bin")
    self.assertNotEqual(r.exit_code, 0)
    self.assertLessEqual((box.workdir / "big.bin").stat().st_size, FAST.file_size_mb << 20)

  @parameterized.named_parameters(("background", "{sleeper} & sleep 0.3"), ("foreground_timeout", "{sleeper}"))
  def test_no_process_outlives_the_call(self, how):
    daemon = ("import os, time\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\n"
              "time.sleep(1000)\n")
    box = self.box({f"{self.marker}.py": daemon})
    sleeper = f"sh -c 'sleep 1000' {self.marker}"
    # A double-forked daemon in its own session, a background sleeper, then the case's own ending.
    command = f"python3 {self.marker}.py; {sleeper} & " + how.format(sleeper=sleeper)
    seen = []

    def watch():  # proves that the /proc scan does find these processes while the call runs
      deadline = time.monotonic() + 1.0
      while not seen and time.monotonic() < deadline:
        seen.extend(_processes_with(self.marker))
        time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    r = box.run(command, timeout_s=1.5)
    watcher.join()
    self.assertTrue(seen, "the scan never saw the sandboxed processes: it would prove nothing")
    self.assertEqual(r.timed_out, how == "{sleeper}", r)
    self.assertEqual(_processes_with(self.marker), [])  # checked right away, not after a grace period

  def test_symlink_escapes_are_refused_host_side(self):
    secret_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, secret_dir, ignore_errors=True)
    secret = pathlib.Path(secret_dir) / "secret.txt"
    secret.write_text(self.marker)
    box = self.box({"keep.txt": "kept"})
    self.assertTrue(box.run("ln -s /etc/passwd passwd_link && ln -s /root root_link && ln -s / rootfs "
                            "&& ln -s keep.txt inner_link").ok)
    os.symlink(secret, box.workdir / "secret_link")  # as if planted by an earlier run through another path
    for path in ("passwd_link", "root_link/.bashrc", "rootfs/etc/passwd", "secret_link"):
      with self.assertRaises(SandboxPathError, msg=path):
        box.read_file(path)
      with self.assertRaises(SandboxPathError, msg=path):
        box.write_file(path, "pwned")
    with self.assertRaises(SandboxPathError):
      box.write_file(f"root_link/{self.marker}", "pwned")
    self.assertFalse(os.path.lexists(f"/root/{self.marker}"))
    self.assertEqual(secret.read_text(), self.marker)
    self.assertEqual(box.read_file("inner_link"), "kept")  # links that stay inside are fine
    self.assertEqual(box.list_files(), ["keep.txt"])
    self.assertEqual(box.files(), {"keep.txt": "kept"})
    box.delete_file("passwd_link")  # removes the link, never its target
    self.assertFalse(os.path.lexists(box.workdir / "passwd_link"))
    self.assertTrue(os.path.exists("/etc/passwd"))

  def test_private_dirs_under_bound_paths_are_empty_inside(self):
    # As if c2jax (with the tasks' hidden tests and solutions) were installed into /usr: a directory under a path
    # the sandbox binds stands in for it.
    if os.access("/usr/local", os.W_OK):
      private = tempfile.mkdtemp(prefix=f"{self.marker}-", dir="/usr/local")
      self.addCleanup(shutil.rmtree, private, ignore_errors=True)
      os.chmod(private, 0o755)
      os.makedirs(os.path.join(private, "hidden_tests"))
      pathlib.Path(private, "hidden_tests", "test_secret.py").write_text("HIDDEN-TEST-TEXT")
      os.chmod(os.path.join(private, "hidden_tests"), 0o755)
      os.chmod(os.path.join(private, "hidden_tests", "test_secret.py"), 0o644)
    else:
      private = "/usr/share"  # not writable here: any non-empty bound directory proves the mask
    command = f"ls -A {private}; cat {private}/hidden_tests/test_secret.py; echo x > {private}/new; true"
    self.assertNotEqual(self.box().run(command).stdout, "")  # visible without the mask: the test proves something
    outside = tempfile.mkdtemp()  # not under a bound path: nothing to mask (it does not exist inside anyway)
    self.addCleanup(shutil.rmtree, outside, ignore_errors=True)
    with mock.patch.object(sandbox_lib, "PRIVATE_DIRS", (private, outside)):
      self.assertEqual(sandbox_lib._masked_dirs(), [os.path.realpath(private)])
      r = self.box().run(command)
    self.assertEqual(r.stdout, "")
    self.assertNotIn("HIDDEN-TEST-TEXT", r.stderr)
    self.assertIn("Read-only file system", r.stderr)
    self.assertFalse(os.path.exists(os.path.join(private, "new")))

  def test_this_checkout_is_masked_when_it_is_under_a_bound_path(self):
    self.assertIn(str(PROJECT / "c2jax"), sandbox_lib.PRIVATE_DIRS)
    bound = str(PROJECT).startswith("/usr/")
    self.assertEqual(str(PROJECT / "c2jax") in sandbox_lib._masked_dirs(), bound)

  def test_symlinks_inside_see_only_the_sandbox(self):
    secret_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, secret_dir, ignore_errors=True)
    secret = pathlib.Path(secret_dir) / "secret.txt"
    secret.write_text(self.marker)
    box = self.box()
    os.symlink(secret, box.workdir / "secret_link")
    r = box.run("ln -s /etc/passwd passwd_link; cat passwd_link; cat secret_link; echo x > passwd_link; true")
    self.assertIn("sandbox:x:1000", r.stdout)  # the sandbox's own /etc/passwd
    self.assertNotIn("root:x:0", r.stdout)
    self.assertNotIn(self.marker, r.stdout)
    self.assertIn("Read-only file system", r.stderr)


class UnavailableTest(absltest.TestCase):

  def test_missing_bwrap_refuses_with_one_sentence(self):
    with mock.patch.object(sandbox_lib, "BWRAP", "/nonexistent/bwrap"), \
        mock.patch.object(tempfile, "mkdtemp", side_effect=AssertionError("no workdir may be created")):
      with self.assertRaisesRegex(sandbox_lib.SandboxUnavailable, r"bubblewrap.*install"):
        sandbox_lib.check_available()
      with self.assertRaisesRegex(sandbox_lib.SandboxUnavailable, r"/nonexistent/bwrap"):
        Sandbox({"a.py": "print(1)"})

  def test_probe_runs_the_real_command_line(self):
    if _unavailable_reason():
      self.skipTest(_unavailable_reason())
    with mock.patch.object(sandbox_lib, "_probed", set()), \
        mock.patch.object(sandbox_lib, "_PROBE_COMMAND", "/nonexistent/python3 -I -c pass"):
      with self.assertRaisesRegex(sandbox_lib.SandboxUnavailable, r"install Python 3"):
        sandbox_lib.check_available()
      with self.assertRaises(sandbox_lib.SandboxUnavailable):
        Sandbox({"a.py": "print(1)"})
      self.assertEqual(sandbox_lib._probed, set())  # a failed probe is retried, not remembered as a success
    sandbox_lib.check_available()

  def test_probe_failing_to_build_the_container_names_the_fix(self):
    if _unavailable_reason():
      self.skipTest(_unavailable_reason())
    real_argv = Sandbox._argv

    def broken_argv(box, command, status_fd):  # as an older bubblewrap would answer
      argv = real_argv(box, command, status_fd)
      return argv[:1] + ["--no-such-option"] + argv[1:]

    with mock.patch.object(sandbox_lib, "_probed", set()), mock.patch.object(Sandbox, "_argv", broken_argv):
      with self.assertRaisesRegex(sandbox_lib.SandboxUnavailable, r"bubblewrap 0\.8 or newer"):
        sandbox_lib.check_available()

  def test_a_container_that_cannot_be_built_raises_instead_of_failing_the_command(self):
    if _unavailable_reason():
      self.skipTest(_unavailable_reason())
    box = Sandbox({}, FAST)
    self.addCleanup(box.close)
    self.assertEqual(box.run("exit 1").exit_code, 1)  # the command's own failure is a result
    (box.workdir.parent / "etc" / "passwd").unlink()  # bubblewrap cannot bind it: the setup fails
    with self.assertRaisesRegex(sandbox_lib.SandboxUnavailable, r"could not build this sandbox"):
      box.run("true")

  def test_existing_sandbox_refuses_to_run_without_bwrap(self):
    if _unavailable_reason():
      self.skipTest(_unavailable_reason())
    box = Sandbox({}, FAST)
    self.addCleanup(box.close)
    with mock.patch.object(sandbox_lib, "BWRAP", "/nonexistent/bwrap"):
      with self.assertRaises(sandbox_lib.SandboxUnavailable):
        box.run("true")


class PoolTest(SandboxTestCase):

  def test_pool_runs_in_order_with_bounded_concurrency(self):
    lock = threading.Lock()
    live, peak = [0], [0]

    def job(i: int) -> RunResult:
      with lock:
        live[0] += 1
        peak[0] = max(peak[0], live[0])
      try:
        with Sandbox({"n.txt": str(i)}, FAST) as box:
          return box.run("python3 -c 'print(int(open(\"n.txt\").read()) ** 2)'")
      finally:
        with lock:
          live[0] -= 1

    with SandboxPool(3) as pool:
      results = pool.map(job, range(7))
      future = pool.submit(job, 9)
      self.assertEqual(future.result().stdout, "81\n")
    self.assertEqual([r.stdout for r in results], [f"{i * i}\n" for i in range(7)])
    self.assertLessEqual(peak[0], 3)
    with self.assertRaises(ValueError):
      SandboxPool(0)

  def test_an_error_drops_the_queue(self):
    started = []
    gate = threading.Event()

    def job(i: int) -> int:
      started.append(i)
      gate.wait(5)
      return i

    with self.assertRaises(KeyboardInterrupt):
      with SandboxPool(1) as pool:
        futures = [pool.submit(job, i) for i in range(20)]
        gate.set()
        raise KeyboardInterrupt
    self.assertLess(len(started), 20)
    self.assertTrue(any(f.cancelled() for f in futures))


class RemoveTreeTest(absltest.TestCase):

  def test_a_non_root_owner_removes_directories_without_permissions(self):
    # Root ignores permissions, so the case that leaked temp dirs (a non-root host) is played as nobody.
    if os.geteuid() != 0:
      self.skipTest("runs the cleanup as nobody, which needs root to set up")
    base = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, base, ignore_errors=True)
    os.chmod(base, 0o755)
    os.chown(base, 65534, 65534)  # nobody owns the tree's parent too, as the host user owns the sandbox's root
    tree = os.path.join(base, "tree")
    # sandbox.py alone (stdlib only), loaded by path: nobody may not reach this venv's interpreter or packages.
    script = ("import importlib.util, os, pathlib, sys\n"
              "spec = importlib.util.spec_from_file_location('sandbox', sys.argv[2])\n"
              "mod = sys.modules['sandbox'] = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(mod)\n"
              "t = sys.argv[1]\n"
              "os.makedirs(t + '/d/e'); open(t + '/d/e/f', 'w').close(); os.makedirs(t + '/g')\n"
              "for d in ('/d/e', '/d', '/g'): os.chmod(t + d, 0)\nfds = len(os.listdir('/proc/self/fd'))\n"
              "mod._remove_tree(pathlib.Path(t))\nprint(os.path.exists(t), len(os.listdir('/proc/self/fd')) - fds)\n")
    os.makedirs(tree)
    os.chown(tree, 65534, 65534)
    source = os.path.join(base, "sandbox.py")
    shutil.copy(sandbox_lib.__file__, source)
    os.chmod(source, 0o644)
    try:
      r = subprocess.run(["/usr/bin/python3", "-I", "-c", script, tree, source], capture_output=True, text=True,
                         timeout=60, cwd=base, env={"PATH": "/usr/bin:/bin"}, user=65534, group=65534,
                         extra_groups=[])
    except (OSError, subprocess.SubprocessError) as e:
      self.skipTest(f"cannot run /usr/bin/python3 as nobody here: {e}")
    self.assertEqual(r.returncode, 0, r.stderr)
    self.assertEqual(r.stdout.split(), ["False", "0"])  # removed, and no fd left open


if __name__ == "__main__":
  absltest.main()
