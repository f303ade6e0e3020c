"""Throughput of the tensorstore rollout buffer against the raw write speed of the same disk, and the weight store's
bytes per update with and without delta compression after real RL update steps.

  .venv/bin/python tools/bench_buffer.py                                   # 64 groups x 3 repeats, system temp dir
  .venv/bin/python tools/bench_buffer.py --groups=16 --repeats=2 --skip_weights   # quick look at the buffer
  .venv/bin/python tools/bench_buffer.py --dir=/mnt/fast/tmp --keep        # another disk; keep the last buffer
  .venv/bin/python tools/inspect_buffer.py --buffer=<dir printed>/buffer   # then look inside it

Buffer. A realistic group (report section 4: G rollouts of one task): --rows=8 rows of T=--seq_len=1024 tokens,
Lm=2 MoE layers of K=4 routed experts recorded per token, random tokens (which compress poorly) over the first half
of each row and padding over the second half (which compresses to nearly nothing), random behaviour log-probs.
Groups are committed in batches: 1 (`commit`) and --batch=8 (`commit_many`: an actor commits the groups of one
sampler call together, e.g. 8 groups of 8 rows).

Each repeat runs, in this order and on fresh files in --dir (repeats interleave the phases, so that a slow moment
of a shared machine hurts all alike; medians are reported):
1. for each batch size: raw, the batches' bytes appended to one plain file with an os.fsync after every batch, then
   fsync, a RolloutWriter in Durability.FSYNC (the default: every commit durable when it returns) committing every
   group in batches of that size: the same bytes under the same fsync policy. Opening the new writer (creating the
   shard's arrays, once per actor lifetime) is timed apart (`open_ms`), not in the throughput;
2. raw_buffered and buffered: the same at --batch in Durability.BUFFERED, no fsync on either side (what the page
   cache takes: the CPU and per-object cost of a commit);
3. read: a RolloutReader takes the groups of the FSYNC --batch buffer, --read_batch at a time (the trainer's view).

"Logical" bytes are the groups' in-memory arrays (int32/float32, what the actors hand over and the trainer gets);
"stored" bytes are what lands on disk (compressed, plus metadata and commit records) or is read back from it.
`ratio` = buffer write MB/s (logical bytes) / raw MB/s, Durability.FSYNC, commit batches of --batch groups;
`ratio_batch1` the same with one group per commit; `ratio_buffered` the BUFFERED pair.

Weights (skip with --skip_weights). The tiny RL model of configs/rl_char_class.py runs --weight_steps real
`update_step`s on random on-policy batches (byte-vocabulary tokens, behaviour log-probs from the current params), and
every version (0 = the init, then one per update) is published to two WeightStores: full_every=8 (a delta on the
previous version between full snapshots) and full_every=1 (every version a full snapshot). Reported: mean stored
bytes per update of the delta versions and of the full snapshots, and `delta_ratio` = their quotient, at the
config's learning rate (1e-2, a tiny model trained from scratch) and at an RL-scale 1e-5 (`delta_ratio_lr1e-5`).
An update that leaves the params bit-identical (a warmup's step 0 runs at rate 0) writes an all-zero delta; such
updates are left out of the means (the output says so).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from c2jax.rollouts import schema
from c2jax.rollouts.buffer import Durability, RolloutReader, RolloutWriter

MB = 1e6


def make_groups(spec: schema.BufferSpec, n: int, rows: int, seed: int = 0) -> list[dict]:
  """`n` groups of `rows` rows: random tokens and log-probs over the first half of each row, padding after."""
  rng = np.random.default_rng(seed)
  t = spec.seq_len
  half = t // 2
  groups = []
  for i in range(n):
    mask = np.zeros((rows, t), np.float32)
    mask[:, 16:half] = 1.0  # a 16-token prompt, then the generation
    live = np.arange(t) < half
    g = {
        "tokens": (rng.integers(0, 150_000, (rows, t)) * live).astype(np.int32),
        "loss_mask": mask,
        "behaviour_logprobs": (np.log(rng.random((rows, t), np.float32) + 1e-6) * mask).astype(np.float32),
        "policy_version": np.full((rows, t), i // 8, np.int32),
        "reward_terms": {name: rng.random(rows).astype(np.float32) for name in spec.reward_terms},
        "truncated": np.zeros(rows, np.float32),
        "chain_id": np.arange(rows, dtype=np.int32),
        "segment": np.zeros(rows, np.int32),
        "prompt_length": np.full(rows, 16, np.int32),
        "length": np.full(rows, half - 16, np.int32),
    }
    if spec.n_moe_layers:
      g["expert_ids"] = (rng.integers(0, 64, (spec.n_moe_layers, rows, t, spec.experts_per_tok))
                         * live[:, None]).astype(np.int32)
    groups.append(g)
  return groups


def group_arrays(group: dict) -> list[np.ndarray]:
  """The group's arrays, reward terms included, in a fixed order."""
  return [group[k] for k in sorted(group) if k != "reward_terms"] + [
      group["reward_terms"][k] for k in sorted(group["reward_terms"])]


def logical_bytes(group: dict) -> int:
  return sum(a.nbytes for a in group_arrays(group))


def dir_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def batches(groups: list[dict], batch: int) -> list[list[dict]]:
  return [groups[i:i + batch] for i in range(0, len(groups), batch)]


def bench_raw(path: str, groups: list[dict], batch: int, fsync: bool) -> float:
  """Seconds to append the groups' bytes to one file, one write per batch of `batch` groups, each followed by an
  fsync when `fsync` (the plain-file equivalent of a commit that is durable when it returns)."""
  blobs = [b"".join(np.ascontiguousarray(a).tobytes() for g in b for a in group_arrays(g))
           for b in batches(groups, batch)]
  t0 = time.perf_counter()
  with open(path, "wb") as f:
    for blob in blobs:
      f.write(blob)
      if fsync:
        f.flush()
        os.fsync(f.fileno())
  seconds = time.perf_counter() - t0
  os.remove(path)
  return seconds


def bench_write(url: str, spec: schema.BufferSpec, groups: list[dict], batch: int,
                durability: Durability) -> tuple[float, float]:
  """(seconds to open a new writer, seconds to commit every group in `batch` groups per commit_many).

  Opening creates the shard's arrays once per actor lifetime: timed apart from the steady state."""
  t0 = time.perf_counter()
  writer = RolloutWriter(url, "bench", spec, durability=durability)
  t1 = time.perf_counter()
  for i, b in enumerate(batches(groups, batch)):
    writer.commit_many(b, [{"task_id": f"task{i * batch + j}"} for j in range(len(b))])
  writer.close()
  return t1 - t0, time.perf_counter() - t1


def bench_read(url: str, spec: schema.BufferSpec, n: int, batch: int) -> tuple[float, list[float], int]:
  """(total seconds, seconds per take of `batch` groups, stored bytes read)."""
  reader = RolloutReader(url, spec)
  latencies = []
  got = 0
  t0 = time.perf_counter()
  while got < n:
    t = time.perf_counter()
    out = reader.take(min(batch, n - got), timeout_s=30)
    latencies.append(time.perf_counter() - t)
    if not out:
      raise RuntimeError(f"Read only {got} of {n} groups back from {url}.")
    got += len(out)
  return time.perf_counter() - t0, latencies, reader.stats["bytes_read"]


def run_buffer(args: argparse.Namespace) -> dict:
  """The buffer's part of the result: write/read throughput, raw disk speed under the same fsync policy, ratios."""
  spec = schema.BufferSpec(seq_len=args.seq_len, n_moe_layers=args.moe_layers, experts_per_tok=args.k)
  groups = make_groups(spec, args.groups, args.rows)
  logical = sum(logical_bytes(g) for g in groups)
  n = len(groups)
  sizes = sorted({1, args.batch})
  base = tempfile.mkdtemp(prefix="bench_buffer_", dir=args.dir)
  times: dict[str, list[float]] = {}
  latencies, stored, read_stored = [], [], []

  def timed(name: str, seconds: float) -> float:
    times.setdefault(name, []).append(seconds)
    return seconds

  try:
    for r in range(args.repeats):
      line = [f"repeat {r}:"]
      for b in sizes:
        raw = timed(f"raw_b{b}", bench_raw(os.path.join(base, "raw.bin"), groups, b, fsync=True))
        url = os.path.join(base, f"fsync_b{b}_{r}")
        opened, write = bench_write(url, spec, groups, b, Durability.FSYNC)
        timed("open", opened)
        timed(f"fsync_b{b}", write)
        line.append(f"batch {b}: raw {raw:.3f}s fsync {write:.3f}s;")
        if b == args.batch:
          stored.append(dir_bytes(url))
          seconds, lat, nbytes = bench_read(url, spec, n, args.read_batch)
          timed("read", seconds)
          latencies += lat
          read_stored.append(nbytes)
          line.append(f"read {seconds:.3f}s;")
        if not (args.keep and r == args.repeats - 1 and b == args.batch):
          shutil.rmtree(url)
      raw = timed("raw_buffered", bench_raw(os.path.join(base, "raw.bin"), groups, args.batch, fsync=False))
      url = os.path.join(base, f"buffered_{r}")
      write = timed("buffered", bench_write(url, spec, groups, args.batch, Durability.BUFFERED)[1])
      shutil.rmtree(url)
      line.append(f"batch {args.batch} buffered: raw {raw:.3f}s write {write:.3f}s")
      print(" ".join(line), file=sys.stderr)
  finally:
    if not args.keep:
      shutil.rmtree(base, ignore_errors=True)
  med = {k: statistics.median(v) for k, v in times.items()}
  mb = logical / MB
  stored_bytes, read_bytes = statistics.median(stored), statistics.median(read_stored)
  result = {
      "groups": n, "rows_per_group": args.rows, "seq_len": args.seq_len, "moe_layers": args.moe_layers,
      "experts_per_tok": args.k, "repeats": args.repeats, "dir": args.dir or tempfile.gettempdir(),
      "batch": args.batch, "durability": Durability.FSYNC.value,
      "logical_mb": mb, "stored_mb": stored_bytes / MB, "compression": logical / stored_bytes,
      "open_ms": 1e3 * med["open"],
  }
  for b in sizes:
    result.update({f"raw_b{b}_mb_s": mb / med[f"raw_b{b}"], f"write_b{b}_groups_s": n / med[f"fsync_b{b}"],
                   f"write_b{b}_mb_s_logical": mb / med[f"fsync_b{b}"],
                   f"write_b{b}_mb_s_stored": stored_bytes / MB / med[f"fsync_b{b}"]})
  result.update({
      "raw_buffered_mb_s": mb / med["raw_buffered"], "write_buffered_groups_s": n / med["buffered"],
      "write_buffered_mb_s_logical": mb / med["buffered"],
      "read_groups_s": n / med["read"], "read_mb_s_logical": mb / med["read"],
      "read_mb_s_stored": read_bytes / MB / med["read"], "read_batch": args.read_batch,
      "read_batch_ms_median": 1e3 * statistics.median(latencies), "read_batch_ms_max": 1e3 * max(latencies),
      "ratio": med[f"raw_b{args.batch}"] / med[f"fsync_b{args.batch}"],
      "ratio_batch1": med["raw_b1"] / med["fsync_b1"],
      "ratio_buffered": med["raw_buffered"] / med["buffered"],
  })
  if args.keep:
    result["kept_buffer"] = os.path.join(base, f"fsync_b{args.batch}_{args.repeats - 1}")
  return result


def run_weights(args: argparse.Namespace) -> dict:
  """The weight store's part: stored bytes per update, delta versions vs full snapshots, at two learning rates."""
  import jax

  from c2jax.model.params import init_params
  from c2jax.rl import batch as batch_lib
  from c2jax.services import rl_run_config
  from c2jax.rl.update import init_state, policy_log_probs, update_step
  from c2jax.rollouts.weight_store import WeightStore
  from configs import rl_char_class

  cfg = rl_run_config.parse(rl_char_class.get_config()).rl
  out = {"weight_steps": args.weight_steps}
  for name, lr in (("", cfg.optim.learning_rate), ("_lr1e-5", 1e-5)):
    run_cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, learning_rate=lr))
    m = run_cfg.model
    params = jax.jit(init_params, static_argnums=0)(m, jax.random.key(0))
    state = init_state(run_cfg, jax.random.key(0), params=params)
    step = jax.jit(functools.partial(update_step, cfg=run_cfg), donate_argnums=0)
    logp = jax.jit(lambda p, b, c=run_cfg: policy_log_probs(p, b, c).logp)
    base = tempfile.mkdtemp(prefix="bench_weights_", dir=args.dir)
    try:
      stores = {"delta": WeightStore(os.path.join(base, "delta"), full_every=8),
                "full": WeightStore(os.path.join(base, "full"), full_every=1)}
      prev = jax.device_get(state.params)
      for s in stores.values():
        s.publish(0, prev)
      stats = {k: [] for k in stores}
      unchanged, grad_norms = [], []
      for i in range(args.weight_steps):
        batch = batch_lib.example_batch(b=16, t=24, n_moe_layers=m.n_moe_layers, k=m.num_experts_per_tok, seed=i)
        if batch["tokens"].max() >= m.vocab_size:
          raise ValueError(f"example_batch tokens reach {batch['tokens'].max()}; the model's vocab is {m.vocab_size}.")
        # On-policy rollouts: random behaviour log-probs would make every importance ratio leave the trust region,
        # and the masked loss would have no gradient at all.
        batch["behaviour_logprobs"] = np.asarray(logp(state.params, batch)) * batch["loss_mask"]
        batch["policy_version"][:] = i
        state, metrics = step(state, batch)
        grad_norms.append(float(metrics["grad_norm"]))
        params = jax.device_get(state.params)
        unchanged.append(all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(prev), jax.tree.leaves(params))))
        prev = params
        for k, s in stores.items():
          stats[k].append(s.publish(i + 1, params))
    finally:
      shutil.rmtree(base, ignore_errors=True)
    # A first update at learning rate 0 (a warmup) leaves the params unchanged: its all-zero delta would flatter.
    skip = 1 if unchanged and unchanged[0] else 0
    deltas = [p.stored_bytes for p in stats["delta"][skip:] if p.kind == "delta"]
    fulls = [p.stored_bytes for p in stats["full"][skip:]]
    out.update({
        f"learning_rate{name}": lr, f"skipped_first_update{name}": bool(skip),
        f"params_mb{name}": stats["full"][0].full_bytes / MB,
        f"delta_updates{name}": len(deltas),
        f"delta_mb_per_update{name}": statistics.mean(deltas) / MB,
        f"full_mb_per_update{name}": statistics.mean(fulls) / MB,
        f"delta_ratio{name}": statistics.mean(deltas) / statistics.mean(fulls),
        f"unchanged_updates{name}": int(sum(unchanged)),
        f"grad_norm_mean{name}": statistics.mean(grad_norms),
    })
  return out


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
  parser.add_argument("--groups", type=int, default=64, help="groups written and read per repeat")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--rows", type=int, default=8, help="rows per group (G)")
  parser.add_argument("--seq_len", type=int, default=1024, help="T")
  parser.add_argument("--moe_layers", type=int, default=2, help="Lm")
  parser.add_argument("--k", type=int, default=4, help="experts per token")
  parser.add_argument("--batch", type=int, default=8, help="groups per commit_many (besides 1)")
  parser.add_argument("--read_batch", type=int, default=8, help="groups per trainer take()")
  parser.add_argument("--keep", action="store_true", help="keep the last repeat's buffer (path in the JSON)")
  parser.add_argument("--skip_weights", action="store_true", help="skip the weight-store part (no JAX)")
  parser.add_argument("--weight_steps", type=int, default=10, help="update steps of the weight-store part")
  args = parser.parse_args(argv)
  result = run_buffer(args)
  b = args.batch
  print(f"{result['groups']} groups of {args.rows} x {args.seq_len} tokens, {result['logical_mb']:.1f} MB logical, "
        f"{result['stored_mb']:.1f} MB stored (x{result['compression']:.1f} compression)")
  for size, key in ((1, "ratio_batch1"), (b, "ratio")):
    print(f"commits of {size} group(s), fsync each: raw {result[f'raw_b{size}_mb_s']:7.1f} MB/s   buffer "
          f"{result[f'write_b{size}_mb_s_logical']:7.1f} MB/s logical {result[f'write_b{size}_mb_s_stored']:6.1f} "
          f"MB/s stored {result[f'write_b{size}_groups_s']:7.1f} groups/s   {key} {result[key]:.3f}")
  print(f"commits of {b} groups, no fsync:     raw {result['raw_buffered_mb_s']:7.1f} MB/s   buffer "
        f"{result['write_buffered_mb_s_logical']:7.1f} MB/s logical {'':18}{result['write_buffered_groups_s']:7.1f} "
        f"groups/s   ratio_buffered {result['ratio_buffered']:.3f}")
  print(f"buffer read     {result['read_mb_s_logical']:9.1f} MB/s logical  {result['read_mb_s_stored']:7.1f} MB/s "
        f"stored  {result['read_groups_s']:7.1f} groups/s")
  print(f"trainer take({args.read_batch})  median {result['read_batch_ms_median']:.1f} ms, "
        f"max {result['read_batch_ms_max']:.1f} ms")
  if not args.skip_weights:
    result.update(run_weights(args))
    for name in ("", "_lr1e-5"):
      note = " (first update skipped: params unchanged)" if result[
          f"skipped_first_update{name}"] else ""
      print(f"weights at lr {result[f'learning_rate{name}']:g}: {result[f'params_mb{name}']:.2f} MB of params; per "
            f"update {result[f'delta_mb_per_update{name}']:.3f} MB as a delta ({result[f'delta_updates{name}']} "
            f"updates) vs {result[f'full_mb_per_update{name}']:.3f} MB as a full snapshot: "
            f"delta_ratio{name} {result[f'delta_ratio{name}']:.3f}{note}")
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
