"""The code sandbox: untrusted code under bubblewrap, a seccomp filter and per-call cgroups (OS isolation, no ML).

  sandbox.py   `Sandbox`, `SandboxPool`, `SandboxLimits`: the containers, their limits, host-side file access
  cgroup.py    one cgroup per call: memory and process count of all of a call's processes together
  seccomp.py   the syscalls untrusted code is refused
  host_ast.py  parsing untrusted Python on the host: one process-wide lock, one error for every way it fails

A leaf: it imports nothing of c2jax (tests/layering_test.py holds it to that), so the security boundary depends on
no other code of the project.
"""
