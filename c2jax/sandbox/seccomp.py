"""The sandbox's seccomp filter: the syscalls untrusted code is refused, as a classic-BPF program for bubblewrap.

bubblewrap installs the program (`--seccomp FD`) on the sandboxed command just before it starts it; every process
the command starts inherits it and cannot remove it (filters only stack, and no_new_privs is set). What holds:

  * On x86_64 and aarch64 every syscall in `DENIED` returns EPERM (programs see an ordinary refusal, as they would
    without the privilege): nothing in the container can debug, read or write another process (ptrace,
    process_vm_*, pidfd_getfd, ...; the attack this closes made the container's unlimited init run commands),
    load kernel code (modules, kexec, bpf), mount, enter or make namespaces, or reach the kernel surfaces that
    container runtimes close for the same reason (userfaultfd, perf_event_open, io_uring, keyrings).
  * personality() is allowed only to query (0xffffffff) or to set the default persona (0): the other flags turn
    off address-space randomization or make data executable.
  * Any other architecture (a 32-bit binary entering through the compat syscall table, whose numbers differ) is
    killed at its first syscall, and x32 syscalls on x86_64 (numbers with bit 30 set) are refused: the table
    below speaks only native numbers.

Only the sandboxed command is filtered, not bubblewrap's own init (PID 1 inside), which the sandbox hides and
limits instead (see sandbox.py). This is a denylist on top of the sandbox's other walls (no capabilities, no
nested user namespaces, no network): a syscall not listed is allowed.
"""

from __future__ import annotations

import errno
import platform
import struct

# <linux/audit.h>: EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE, EM_AARCH64 | the same.
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
_X32_SYSCALL_BIT = 0x40000000

# Syscall numbers per architecture (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h; the tests compare
# them with the host's headers where installed). Each line says why it is refused.
_ALWAYS = {  # name: (x86_64, aarch64), or None where the architecture lacks the call
    # Reaching into another process: debuggers, memory reads and writes, fd theft, comparisons of its objects.
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "process_madvise": (440, 440),
    "kcmp": (312, 272),
    "move_pages": (279, 239),  # takes another process's pid
    "migrate_pages": (256, 238),  # likewise
    # Kernel code and kernel attack surface that ordinary programs (tests, compilers, interpreters) never need.
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),  # stalls kernel page faults at will: the classic race amplifier of exploits
    "io_uring_setup": (425, 425),  # io_uring runs file and socket operations this filter would never see
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    # Kernel keyrings are not namespaced: keys would be shared with the host's users.
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    # The filesystem layout is bubblewrap's and stays so: no mounts (old and new mount API), no namespace changes.
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    # Opens any inode by handle, bypassing the mount layout (needs a capability the sandbox lacks; refused anyway).
    "open_by_handle_at": (304, 265),
    # Machine-wide state: the kernel log, reboot (which would kill a PID namespace's init), swap, accounting.
    "syslog": (103, 116),
    "reboot": (169, 142),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "acct": (163, 89),
    # Raw I/O ports (x86 only).
    "iopl": (172, None),
    "ioperm": (173, None),
}
_PERSONALITY = (135, 92)
_PERSONALITY_ALLOWED = (0x0, 0xFFFFFFFF)  # PER_LINUX, and the query that changes nothing
_ARCHES = (("x86_64", AUDIT_ARCH_X86_64, 0), ("aarch64", AUDIT_ARCH_AARCH64, 1))

DENIED: dict[str, tuple[int, ...]] = {
    arch: tuple(sorted(nums[i] for nums in _ALWAYS.values() if nums[i] is not None)) for arch, _, i in _ARCHES}

# <linux/filter.h>, <linux/seccomp.h>.
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian: an argument's low word first)


def _stmt(code: int, k: int) -> tuple[int, int, int, int]:
  return code, 0, 0, k


def _jump(code: int, k: int, jt: int, jf: int) -> tuple[int, int, int, int]:
  if not (0 <= jt < 256 and 0 <= jf < 256):
    raise ValueError("A seccomp jump exceeds 255 instructions: split the syscall table.")
  return code, jt, jf, k


def _arch_block(arch: str, nums: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
  """The checks of one architecture, entered with the syscall number not yet loaded; every path returns."""
  deny = _stmt(_RET_K, _RET_ERRNO | errno.EPERM)
  block = [_stmt(_LD_W_ABS, _NR)]
  if arch == "x86_64":
    block += [_jump(_JGE_K, _X32_SYSCALL_BIT, 0, 1), deny]  # x32 (and anything above): refused
  first = len(block)
  deny_at = first + len(nums) + 5  # the last instruction: after the personality check and the allow
  # A jump's target is its own index + 1 + the offset.
  block += [_jump(_JEQ_K, nr, deny_at - (first + i) - 1, 0) for i, nr in enumerate(nums)]
  block += [
      _jump(_JEQ_K, _PERSONALITY[0 if arch == "x86_64" else 1], 0, 3),  # not personality: to the allow
      _stmt(_LD_W_ABS, _ARG0_LOW),
      _jump(_JEQ_K, _PERSONALITY_ALLOWED[0], 1, 0),
      _jump(_JEQ_K, _PERSONALITY_ALLOWED[1], 0, 1),
      _stmt(_RET_K, _RET_ALLOW),
      deny,
  ]
  return block


def program(machine: str | None = None) -> bytes:
  """The filter as bubblewrap reads it: struct sock_filter records (u16 code, u8 jt, u8 jf, u32 k), native order.

  Args:
    machine: `platform.machine()` of the host by default; only x86_64 and aarch64 are known. The program checks
      the architecture of every syscall, so it is the same whichever of the two the host is.

  Raises:
    ValueError: the host is another architecture (the sandbox cannot filter its syscalls).
  """
  machine = platform.machine() if machine is None else machine
  if machine not in ("x86_64", "aarch64"):
    raise ValueError(f"The sandbox's seccomp filter knows x86_64 and aarch64, not {machine}: extend "
                     "c2jax/sandbox/seccomp.py with that architecture's syscall numbers.")
  blocks = {arch: _arch_block(arch, DENIED[arch]) for arch, _, _ in _ARCHES}
  x86, arm = blocks["x86_64"], blocks["aarch64"]
  head = [
      _stmt(_LD_W_ABS, _ARCH),
      _jump(_JEQ_K, AUDIT_ARCH_X86_64, 2, 0),  # to the x86_64 block
      _jump(_JEQ_K, AUDIT_ARCH_AARCH64, 1 + len(x86), 0),  # past it, to the aarch64 block
      _stmt(_RET_K, _RET_KILL_PROCESS),  # any other architecture
  ]
  return b"".join(struct.pack("=HBBI", *insn) for insn in head + x86 + arm)
