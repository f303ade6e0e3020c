"""Multi-host start-up shared by the entry points (report section 5: one program on every host)."""

from __future__ import annotations

import os

import jax


def initialize_from_env() -> bool:
  """Calls `jax.distributed.initialize` when C2JAX_DISTRIBUTED=1; returns whether it did.

  Slurm (and GKE with the kubernetes package) are auto-detected by JAX; elsewhere set JAX_COORDINATOR_ADDRESS,
  JAX_NUM_PROCESSES and JAX_PROCESS_ID (tools/launch/README.md).
  """
  if os.environ.get("C2JAX_DISTRIBUTED") != "1":
    return False
  count, index = os.environ.get("JAX_NUM_PROCESSES"), os.environ.get("JAX_PROCESS_ID")
  jax.distributed.initialize(num_processes=int(count) if count else None, process_id=int(index) if index else None)
  return True
