"""MaxText's training step, timed on request: the maxtext peer of tools/bench_model.py (run in .venv-maxtext).

  .venv-maxtext/bin/python tools/maxtext_step.py per_device_batch_size=8 max_target_length=256 ...
  (`make peer-maxtext` creates .venv-maxtext)

The arguments are MaxText config overrides (key=value, on top of the installed package's configs/base.yml);
bench_model.py builds them from the c2jax config it benchmarks (`maxtext_overrides` there). This script does not
import c2jax: it runs in the peer venv (Python >= 3.12, MaxText's own jax).

It builds MaxText's model, optimizer and jitted `train_step` the way MaxText's `train_loop` does
(`train_utils.setup_train_loop` + `jit_train_and_eval_step`, MaxText's synthetic data), takes one synthetic batch
and reuses it (c2jax's side also times a fixed batch), compiles, runs warm-up steps, then prints one JSON line
{"ready": true, ...} to stdout and serves requests from stdin, one per line:

  <n>    run n training steps; reply {"wall_s": per-step wall seconds, "cpu_s": per-step CPU seconds of this
         process (all threads)}
  quit   exit

MaxText's own prints go to stderr, so that stdout carries only this protocol.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
  proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol; everything else printed goes to stderr
  os.dup2(2, 1)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu is installed (maxtext[tpu]) but there is no TPU here

  def reply(obj):
    proto.write(json.dumps(obj) + "\n")
    proto.flush()

  try:
    import jax
    from flax import nnx
    import maxtext
    from maxtext.trainers.pre_train import train
    from maxtext.utils import sharding
    from maxtext.utils import train_utils
    from flax.core.spmd import logical_axis_rules

    base_yml = os.path.join(os.path.dirname(maxtext.__file__), "configs", "base.yml")
    t0 = time.perf_counter()
    config, recorder = train.initialize([sys.argv[0], base_yml, *argv])
    (_, _, state_mesh_shardings, _, mesh, _, _, data_loader, rampup_manager, eval_it,
     state) = train_utils.setup_train_loop(config, recorder)
    jit_model, state = nnx.split(state)
    params_shardings, state_mesh_shardings = sharding.maybe_update_params_sharding_with_opt(
        config, state_mesh_shardings)
    p_train_step, _ = train_utils.jit_train_and_eval_step(
        config, jit_model, mesh, state, state_mesh_shardings, train.train_step, train.eval_step, None,
        params_shardings)
    batch = data_loader.load_next_batch(rampup_manager=rampup_manager)
    # Parameters: the model's nnx.Param leaves (MaxText's own figure, printed in its log, counts the same).
    _, params, _ = nnx.split(nnx.merge(jit_model, state).model, nnx.Param, ...)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    del eval_it
    setup_s = time.perf_counter() - t0

    def steps(n):
      nonlocal state
      metrics = None
      with jax.set_mesh(mesh), logical_axis_rules(config.logical_axis_rules):
        for _ in range(n):
          state, metrics = p_train_step(state, batch)
      jax.block_until_ready((state, metrics))
      return metrics

    t0 = time.perf_counter()
    metrics = steps(1)
    compile_s = time.perf_counter() - t0
    loss = float(metrics["scalar"]["learning/loss"])
    steps(2)  # the first steps after compiling are slower (allocation), as on c2jax's side
    reply({"ready": True, "params": int(n_params), "compile_s": round(compile_s, 2), "setup_s": round(setup_s, 2),
           "first_loss": loss, "maxtext_version": getattr(maxtext, "__version__", None) or _dist_version(),
           "jax_version": jax.__version__, "backend": jax.default_backend(),
           "devices": len(jax.devices()), "global_batch": int(config.global_batch_size_to_train_on),
           "seq_len": int(config.max_target_length)})
  except Exception as e:
    reply({"ready": False, "error": f"{type(e).__name__}: {e}"})
    raise

  for line in sys.stdin:
    line = line.strip()
    if line == "quit" or not line:
      break
    n = int(line)
    c0, t0 = time.process_time(), time.perf_counter()
    steps(n)
    reply({"wall_s": (time.perf_counter() - t0) / n, "cpu_s": (time.process_time() - c0) / n})
  return 0


def _dist_version() -> str | None:
  from importlib import metadata
  try:
    return metadata.version("maxtext")
  except metadata.PackageNotFoundError:
    return None


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
