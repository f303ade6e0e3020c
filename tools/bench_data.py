"""Tokens/s of the language-model data pipeline alone (c2jax/data/pipeline.py), to hold against what a training step
consumes (the pipeline must not be the bottleneck: issue "continued pretraining", >= 10x the tiny step).

  .venv/bin/python tools/bench_data.py                                        # stdlib, byte tokens, T=128 and 512
  .venv/bin/python tools/bench_data.py --seq_lens=128 --batches=100 --repeats=5
  .venv/bin/python tools/bench_data.py --sources='[{"kind": "code_dir", "root": "~/src", "extensions": [".py"]}]'
  .venv/bin/python tools/bench_data.py --tokenizer=/path/to/tokenizer.json

Each repeat builds a fresh `lm_dataset` (seed = repeat), takes --warmup batches (start-up: the first window of the
piece shuffle is read before the first batch comes out; timed apart as `first_batch_s`), then times --batches
batches. Reported per T: the median over repeats of tokens/s counting every slot of a batch (B x T, what a training
step consumes), the share of padding slots and of slots with loss weight (`target_fraction`), and the time a
`set_state` restore takes before its first batch. Repeats for the different T interleave, so a busy moment of a
shared machine hurts all alike.

The last line printed is one JSON object; its top-level `tokens_per_s`, `seq_len` etc. are those of the first T.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from c2jax.data.pipeline import lm_dataset
from c2jax.data.tokenizer import make_tokenizer

_DEFAULT_SOURCES = '[{"kind": "stdlib", "split": "train", "max_files": 400}]'


def _run(sources, tokenizer, seq_len: int, batch_size: int, batches: int, warmup: int, seed: int) -> dict:
  ds = lm_dataset(sources, tokenizer, seq_len=seq_len, batch_size=batch_size, seed=seed)
  t0 = time.perf_counter()
  it = iter(ds)
  for _ in range(warmup):
    next(it)
  t1 = time.perf_counter()
  slots = padding = targets = 0
  for _ in range(batches):
    batch = next(it)
    slots += batch["tokens"].size
    padding += int((batch["segment_ids"] == 0).sum())
    targets += float(batch["loss_mask"].sum())
  t2 = time.perf_counter()
  state = json.loads(json.dumps(it.get_state()))
  restored = iter(lm_dataset(sources, tokenizer, seq_len=seq_len, batch_size=batch_size, seed=seed))
  t3 = time.perf_counter()
  restored.set_state(state)
  next(restored)
  t4 = time.perf_counter()
  return {"tokens_per_s": slots / (t2 - t1), "first_batch_s": t1 - t0, "padding_fraction": padding / slots,
          "target_fraction": targets / slots, "restore_s": t4 - t3}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sources", default=_DEFAULT_SOURCES, help="JSON list of source dicts (c2jax/data/sources.py)")
  parser.add_argument("--tokenizer", default="byte", help="'byte' or the path of a tokenizer.json")
  parser.add_argument("--seq_lens", default="128,512", help="comma-separated T values")
  parser.add_argument("--batch_size", type=int, default=8)
  parser.add_argument("--batches", type=int, default=1200,
                      help="timed batches per repeat (at T=128 more than one 1M-token shuffle window)")
  parser.add_argument("--warmup", type=int, default=2, help="untimed batches per repeat")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  sources = json.loads(args.sources)
  tokenizer = make_tokenizer(args.tokenizer)
  seq_lens = [int(t) for t in args.seq_lens.split(",")]
  runs = {t: [] for t in seq_lens}
  for repeat in range(args.repeats):
    for t in seq_lens:
      r = _run(sources, tokenizer, t, args.batch_size, args.batches, args.warmup, seed=repeat)
      runs[t].append(r)
      print(f"repeat {repeat} T={t}: {r['tokens_per_s']:,.0f} tokens/s, first batch {r['first_batch_s']:.2f} s, "
            f"padding {r['padding_fraction']:.3f}, restore {r['restore_s']:.2f} s", flush=True)
  per_t = {str(t): {k: statistics.median(r[k] for r in rs) for k in rs[0]} for t, rs in runs.items()}
  first = per_t[str(seq_lens[0])]
  print(json.dumps({"tokens_per_s": round(first["tokens_per_s"]), "batches": args.batches, "seq_len": seq_lens[0],
                    "batch_size": args.batch_size, "repeats": args.repeats, "tokenizer": args.tokenizer,
                    "per_seq_len": {t: {k: round(v, 4) for k, v in m.items()} for t, m in per_t.items()}}))


if __name__ == "__main__":
  main()
