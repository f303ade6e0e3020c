"""What a rollout buffer holds: counts, staleness, a few decoded samples, and a schema/integrity check.

  .venv/bin/python tools/inspect_buffer.py --buffer=runs/rl/buffer
  .venv/bin/python tools/inspect_buffer.py --buffer=s3://bucket/run1/buffer --samples=3
  .venv/bin/python tools/inspect_buffer.py --buffer=runs/rl/buffer --check     # exit code 1 on any problem

Reports, per shard and in total: committed groups and rows (head.json), pending tickets, the trainer's consumed
groups and version (trainer.json, when the trainer has published), and the groups the scan skipped (corrupt data
or commit records) or shards it skipped (schema), the first of them named with why. Then a histogram of per-token
staleness over the action tokens (loss_mask 1) of the groups not yet consumed: lag = trainer version (trainer.json;
0 before the trainer starts) - the token's policy version.
Samples are decoded with the byte tokenizer (c2jax/data/byte_tokenizer.py) when every id fits its vocabulary, else
shown as ids; `--tokenizer=run` decodes with the run's own (the task suite's tokenizer in the buffer's
run_config.json), `--tokenizer=<path>` with a tokenizer.json. Multi-turn rows (buffers with a token ledger) are
shown turn by turn: each run of one source and turn on its own line, marked [prompt], [model t], [observation t]
or [notice t]. The scan reads every committed group (up to --max_groups), which also verifies every chunk checksum.

The last line printed is one JSON object with every figure and the list of problems found.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.services import collate
from c2jax.rollouts import records
from c2jax.rollouts import schema
from c2jax.rollouts.buffer import RolloutReader, commit_key, shard_ids
from c2jax.rollouts.storage import Store, join


ROWS_SHOWN = 2  # rows shown per sample group


def shard_report(url: str, sid: str) -> tuple[dict, list[str]]:
  """One shard's counts from its head.json and listings, and the problems seen there."""
  store = Store(join(url, "shards", sid))
  problems = []
  spec = None
  try:
    spec = schema.BufferSpec.from_json(store.read_json("schema.json"))
    spec_json = spec.to_json()
  except Exception as e:  # noqa: BLE001  (report, never crash)
    spec_json = None
    problems.append(f"shard {sid}: schema.json is unreadable ({e})")
  try:
    head = store.read_json("head.json") or {}
  except ValueError as e:
    head = {}
    problems.append(f"shard {sid}: head.json is unreadable ({e})")
  # One record per commit call, named by its first seq: walk them to find the seqs no record holds.
  starts = sorted(int(k[len("commits/"):-len(".json")]) for k in store.list("commits/")
                  if k.endswith(".json") and k[len("commits/"):-len(".json")].isdigit())
  end, missing = 0, []
  for s in starts:
    missing += range(end, s)
    try:
      if spec is None:
        raise records.RecordError("the shard's schema is unreadable")
      end = records.decode(store.read(commit_key(s)) or b"null", s, sid, spec).end_seq
    except records.RecordError as e:
      problems.append(f"shard {sid}: commit record {s} is rejected ({e})")
      end = s + 1
  if missing:
    problems.append(f"shard {sid}: the commit records of seqs {missing[:10]} are missing")
  committed = int(head.get("committed", end))
  if starts and committed != end:
    problems.append(f"shard {sid}: head.json counts {committed} commits, the records end at {end}")
  pending = len([k for k in store.list("pending/") if k.endswith(".json")])
  return {"shard": sid, "committed": committed, "rows": int(head.get("rows", 0)), "pending": pending,
          "spec": spec_json}, problems


def histogram_lines(hist: collections.Counter, width: int = 40) -> list[str]:
  if not hist:
    return ["  (no action tokens)"]
  total = sum(hist.values())
  peak = max(hist.values())
  return [f"  lag {lag:>4} | {'#' * max(1, round(width * n / peak)):<{width}} {n:>10} ({100 * n / total:5.1f}%)"
          for lag, n in sorted(hist.items())]


_TOKENIZER = [None]  # what decode() uses; set by main


def decode(ids: np.ndarray) -> str:
  tok = _TOKENIZER[0] or ByteTokenizer()
  if ids.size and 0 <= ids.min() and ids.max() < tok.vocab_size:
    return repr(tok.decode(ids))
  shown = " ".join(str(int(i)) for i in ids[:32])
  return f"ids [{shown}{' ...' if ids.size > 32 else ''}]"


def sample_lines(group) -> list[str]:
  d, m = group.data, group.meta
  extra = {k: v for k, v in m.items() if k not in ("task_id", "shard", "seq", "rows", "row0", "time")}
  lines = [f"group {m['shard']}/{m['seq']}: task {m['task_id']!r}, {m['rows']} rows, meta {json.dumps(extra)}"]
  rows = d["tokens"].shape[0]
  for r in range(min(rows, ROWS_SHOWN)):
    p, n = int(d["prompt_length"][r]), int(d["length"][r])
    terms = ", ".join(f"{k}={float(v[r]):.3g}" for k, v in sorted(d["reward_terms"].items()))
    versions = d["policy_version"][r][d["loss_mask"][r] > 0]
    vrange = f"{versions.min()}..{versions.max()}" if versions.size else "-"
    lines.append(f"  row {r} chain {int(d['chain_id'][r])} segment {int(d['segment'][r])}: {p} prompt + {n} "
                 f"generated tokens, {terms}, truncated={bool(d['truncated'][r])}, versions {vrange}")
    if "source" in d:
      lines += turn_lines(d["tokens"][r, :p + n], d["source"][r, :p + n], d["turn"][r, :p + n])
      continue
    lines.append(f"    prompt: {decode(d['tokens'][r, :p])[:300]}")
    lines.append(f"    output: {decode(d['tokens'][r, p:p + n])[:300]}")
  if rows > ROWS_SHOWN:
    lines.append(f"  ... {rows - ROWS_SHOWN} more rows")
  return lines


_SOURCES = {0: "prompt", 1: "model", 2: "observation", 3: "notice"}  # c2jax.actors.ledger.Source


def turn_lines(tokens: np.ndarray, source: np.ndarray, turn: np.ndarray, width: int = 300) -> list[str]:
  """A multi-turn row run by run: one line per stretch of one source and turn."""
  lines, start = [], 0
  for i in range(1, len(tokens) + 1):
    if i == len(tokens) or source[i] != source[start] or turn[i] != turn[start]:
      kind = _SOURCES.get(int(source[start]), f"source {int(source[start])}")
      label = kind if kind == "prompt" else f"{kind} t{int(turn[start])}"
      lines.append(f"    [{label}] {i - start} tokens: {decode(tokens[start:i])[:width]}")
      start = i
  return lines


def make_tokenizer(spec: str, url: str):
  """--tokenizer: None for "byte", the run's suite tokenizer for "run", else a tokenizer.json path."""
  if spec == "byte":
    return None
  if spec == "run":
    from c2jax.actors.actor import text_tokenizer
    from c2jax.services import rl_run_config
    raw = Store(url).read(rl_run_config.RUN_CONFIG_KEY)
    if raw is None:
      raise SystemExit(f"--tokenizer=run: the buffer {url} has no {rl_run_config.RUN_CONFIG_KEY}.")
    return text_tokenizer(rl_run_config.from_json(raw.decode()).task_suite())
  from c2jax.data.tokenizer import make_tokenizer as make
  return make(spec)


def inspect(url: str, samples: int, max_groups: int) -> tuple[dict, list[str]]:
  """(the JSON summary, the readable report lines)."""
  root = Store(url)
  ids = shard_ids(root)
  shards, problems = [], []
  for sid in ids:
    report, found = shard_report(url, sid)
    shards.append(report)
    problems += found
  trainer = root.read_json("trainer.json")
  version = int((trainer or {}).get("version", 0))
  consumed_cursor = {k: int(v) for k, v in ((trainer or {}).get("cursor") or {}).items()}
  reader = RolloutReader(url)
  hist: collections.Counter = collections.Counter()
  shown: list = []
  scanned = 0
  while scanned < max_groups:
    groups = reader.poll(max_groups=min(64, max_groups - scanned))
    if not groups:
      break
    scanned += len(groups)
    # Groups the trainer has already consumed were trained at older versions: only the waiting ones are measured
    # against the current version (all of them when trainer.json predates the per-shard cursor).
    waiting = [g for g in groups if g.meta["seq"] >= consumed_cursor.get(g.meta["shard"], -1)]
    if waiting:
      hist.update(collections.Counter(collate.staleness(waiting, version).tolist()))
    shown += groups[:samples - len(shown)]
  stats = reader.stats
  if stats["corrupt_groups"]:
    problems.append(f"{stats['corrupt_groups']} groups have corrupt data or commit records (skipped by readers)")
  if stats["rejected_records"]:
    problems.append(f"{stats['rejected_records']} commit records failed their checksum or checks (their groups are "
                    "among the corrupt ones)")
  if stats["lost_groups"]:
    problems.append(f"{stats['lost_groups']} groups lost their commit records after they were written (skipped by "
                    "readers)")
  if stats["skipped_shards"]:
    problems.append(f"{stats['skipped_shards']} shards have an unreadable or different schema (skipped by readers)")
  tokens = sum(hist.values())
  summary = {
      "buffer": url, "shards": len(ids), "committed_groups": sum(s["committed"] for s in shards),
      "committed_rows": sum(s["rows"] for s in shards), "pending": sum(s["pending"] for s in shards),
      "consumed": None if trainer is None else int(trainer.get("groups_consumed", 0)),
      "trainer_version": None if trainer is None else version,
      "groups_per_step": None if trainer is None else trainer.get("groups_per_step"),
      "scanned_groups": scanned, "scanned_rows": stats["rows_read"], "stored_bytes_read": stats["bytes_read"],
      "corrupt_groups": stats["corrupt_groups"], "lost_groups": stats["lost_groups"],
      "rejected_records": stats["rejected_records"], "skipped_shards": stats["skipped_shards"],
      "spec": None if reader.spec is None else reader.spec.to_json(),
      "staleness": {"trainer_version": version, "tokens": tokens,
                    "mean": (sum(k * n for k, n in hist.items()) / tokens) if tokens else None,
                    "max": max(hist) if hist else None, "histogram": {str(k): n for k, n in sorted(hist.items())}},
      "skipped": reader.skipped,  # the first ones, named with why
      "problems": problems, "ok": not problems,
  }
  lines = [f"buffer {url}: {len(ids)} shards, {summary['committed_groups']} committed groups "
           f"({summary['committed_rows']} rows), {summary['pending']} pending"]
  if trainer is None:
    lines.append("trainer: not started (no trainer.json); staleness measured against version 0")
  else:
    lines.append(f"trainer: version {version}, {summary['consumed']} groups consumed, "
                 f"{summary['groups_per_step']} per step")
  for s in shards:
    lines.append(f"  shard {s['shard']:<24} {s['committed']:>8} groups {s['rows']:>9} rows {s['pending']:>4} pending")
  lines.append(f"scanned {scanned} groups ({stats['rows_read']} rows, {stats['bytes_read'] / 1e6:.2f} MB stored): "
               f"{stats['corrupt_groups']} corrupt, {stats['lost_groups']} lost, {stats['skipped_shards']} shards "
               "skipped" + (":" if reader.skipped else ""))
  skipped_count = stats["corrupt_groups"] + stats["lost_groups"] + stats["skipped_shards"]
  lines += [f"  skipped {what}" for what in reader.skipped]
  if skipped_count > len(reader.skipped):
    lines.append(f"  ... and {skipped_count - len(reader.skipped)} more (the readers' warnings name each)")
  lines.append(f"staleness of the {tokens} action tokens waiting for the trainer (trainer version - token version; "
               "training-time staleness is metrics.jsonl's staleness/*):")
  lines += histogram_lines(hist)
  for g in shown:
    lines += sample_lines(g)
  lines += [f"PROBLEM: {p}" for p in problems] or ["no problems found"]
  return summary, lines


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--buffer", required=True, help="the buffer's URL (directory, s3://, gs://)")
  parser.add_argument("--samples", type=int, default=1, help="groups to decode and show")
  parser.add_argument("--max_groups", type=int, default=100_000, help="groups to scan at most")
  parser.add_argument("--check", action="store_true", help="exit with code 1 when any problem is found")
  parser.add_argument("--tokenizer", default="byte", help="byte, run (the run config's) or a tokenizer.json path")
  args = parser.parse_args(argv)
  _TOKENIZER[0] = make_tokenizer(args.tokenizer, args.buffer)
  summary, lines = inspect(args.buffer, args.samples, args.max_groups)
  print("\n".join(lines))
  print(json.dumps(summary))
  return 1 if args.check and not summary["ok"] else 0


if __name__ == "__main__":
  sys.exit(main())
