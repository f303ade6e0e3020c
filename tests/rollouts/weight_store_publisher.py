"""A publisher that stops mid-publish and waits to be killed (weight_store_test's SIGKILL test).

  python tests/rollouts/weight_store_publisher.py --url=/tmp/w --version=2 --mb=20 --stop_at=manifest

Publishes --mb megabytes of float32 params as --version with its object writes made synchronous, and at the
chosen point prints "STOPPED" and sleeps: --stop_at=arrays after the first array object is on storage,
--stop_at=manifest after every array object is, just before the manifest. The store itself has no such hook.
"""

import argparse
import os
import sys
import time


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--url", required=True)
  parser.add_argument("--version", type=int, required=True)
  parser.add_argument("--mb", type=float, default=20)
  parser.add_argument("--stop_at", choices=("arrays", "manifest"), required=True)
  args = parser.parse_args()
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

  import numpy as np
  from c2jax.rollouts import weight_store

  store = weight_store.WeightStore(args.url)
  put = store._put
  written = []

  def stopping_put(key, data):
    stop = key.endswith("manifest.json") if args.stop_at == "manifest" else len(written) == 1
    if stop:
      print("STOPPED", flush=True)
      time.sleep(600)
    future = put(key, data)
    future.result()  # synchronous, so that what was written before the stop is on storage
    written.append(key)
    return future

  store._put = stopping_put
  n = int(args.mb * (1 << 20)) // 4
  rng = np.random.default_rng(0)
  # Four tensors, so that several array objects exist before the stop.
  params = {f"layer{i}": {"w": rng.standard_normal(n // 4, dtype=np.float32)} for i in range(4)}
  store.publish(args.version, params)
  print("PUBLISHED", flush=True)


if __name__ == "__main__":
  main()
