"""One process of the multi-process check: a few sharded train steps of the tiny model on a global 8-device mesh.

  python tests/parallel/multiprocess_worker.py --num_processes=2 --process_id=0 --port=12345 --out=losses.json

With --num_processes=1 it runs the same mesh on 8 local devices (the single-process reference; the test runs that
one in its own process through `run_steps`, which has 8 fake devices already). Devices per process =
8 / num_processes; every process feeds the same global batch and contributes its own shards.
"""

import argparse
import json
import os
import re
import sys


def run_steps(mesh: str = "fsdp:2,expert:2,context:2", steps: int = 3) -> dict:
  """Sharded train steps on the global mesh of this process's jax (jax.distributed already initialized where there
  are several processes): {"losses", "process_count", "local_devices"}."""
  import dataclasses
  import jax
  import numpy as np

  from c2jax.parallel.mesh import MeshConfig, make_mesh
  from c2jax.pretrain.sharded import make_trainer
  from c2jax.optim import OptimizerConfig
  from c2jax.pretrain.step import StepConfig
  from c2jax.model import presets

  assert jax.device_count() == 8, jax.device_count()
  cfg = dataclasses.replace(presets.tiny(), n_layers=2, scan_unroll=1, num_mtp_layers=0)
  hp = StepConfig(optim=OptimizerConfig(learning_rate=1e-2, warmup_steps=1, total_steps=10), mtp_weight=0.0)
  b, t = 8, 32
  trainer = make_trainer(cfg, hp, make_mesh(MeshConfig.parse(mesh)), batch_size=b, seq_len=t)
  state = trainer.init(jax.random.key(0))
  # One batch, repeated: the loss must fall, which shows the steps really update the sharded state.
  batch = {"tokens": np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t)).astype(np.int32)}
  losses = []
  for _ in range(steps):
    state, metrics = trainer.step(state, trainer.put_batch(batch))
    losses.append(float(metrics["loss"]))
  return {"losses": losses, "process_count": jax.process_count(), "local_devices": jax.local_device_count()}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--num_processes", type=int, default=1)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--port", type=int, default=0)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--mesh", default="fsdp:2,expert:2,context:2")
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  # This process's device count replaces the inherited one; the other flags (the test suite's -O0 backend) stay.
  flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", ""))
  os.environ["XLA_FLAGS"] = f"{flags.strip()} --xla_force_host_platform_device_count={8 // args.num_processes}".strip()
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

  import jax

  if args.num_processes > 1:
    jax.distributed.initialize(coordinator_address=f"localhost:{args.port}", num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=120)
  result = run_steps(args.mesh, args.steps)
  if args.process_id == 0:
    with open(args.out, "w") as f:
      json.dump(result, f)


if __name__ == "__main__":
  main()
