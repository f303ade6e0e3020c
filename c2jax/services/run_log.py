"""A run's logs: jsonl files and TensorBoard events kept consistent with its checkpoints across restarts.

  log = RunLog(workdir, resumed_at=step_or_None, step_logs=("metrics.jsonl",))
  log.write("metrics.jsonl", {"step": 10, "loss": 2.3}, tb_prefix="train")   # a jsonl line + TensorBoard scalars
  log.close()
  history = read_history(workdir / "metrics.jsonl")    # one record per step (tools/sweep.py, the reports)

Used by both trainer loops (`c2jax.services.pretrain_loop`, `c2jax.services.rl_loop`), the evaluator process, the
reports and the sweeps. A run that resumes from the checkpoint of step s first drops what a killed run logged past
s: the `step_logs` records with step > s (and lines cut short by the kill), and, through TensorBoard's purge_step,
the events past s. A fresh run (no checkpoint) starts its step logs empty. Only process 0 of a multi-host job
writes (`primary`); the others' writes are no-ops.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any, Iterable

from absl import logging


def read_records(path: str | os.PathLike) -> list[dict]:
  """Every JSON object of a jsonl file, in order; a line cut short by a kill is skipped."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  records = []
  for line in path.read_text().splitlines():
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict):
      records.append(record)
  return records


def read_history(path: str | os.PathLike, upto: int | None = None) -> list[dict]:
  """A step log (metrics.jsonl), one record per step up to `upto` (all when None), in step order: where a step was
  logged twice the last record counts."""
  by_step = {}
  for m in read_records(path):
    if isinstance(m.get("step"), int) and (upto is None or m["step"] <= upto):
      by_step[m["step"]] = m
  return [by_step[k] for k in sorted(by_step)]


def trim(path: pathlib.Path, upto: int) -> None:
  """Keeps the records of step <= `upto` (and drops lines cut by a kill), rewriting the file atomically."""
  if not path.exists():
    return
  keep = [r for r in read_records(path) if isinstance(r.get("step"), int) and r["step"] <= upto]
  tmp = path.with_name(f".{path.name}.tmp")
  tmp.write_text("".join(json.dumps(r) + "\n" for r in keep))
  os.replace(tmp, path)


class RunLog:
  """The jsonl logs and TensorBoard writer of one run directory (see the module docstring).

  Args:
    workdir: the run directory.
    resumed_at: the step of the checkpoint the run resumed from; None for a fresh run.
    step_logs: jsonl files of per-step records (each has an int "step") that restarts trim and fresh runs clear.
    tb_dir: TensorBoard's directory under `workdir`.
    primary: whether this process writes (process 0 of a multi-host job).
  """

  def __init__(self, workdir: str | os.PathLike, *, resumed_at: int | None, step_logs: Iterable[str] = (),
               tb_dir: str = "tb", primary: bool = True):
    self.workdir = pathlib.Path(workdir)
    self.primary = primary
    self._tb = None
    if not primary:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    for name in step_logs:
      if resumed_at is None:
        (self.workdir / name).unlink(missing_ok=True)
      else:
        trim(self.workdir / name, resumed_at)
    try:
      from tensorboardX import SummaryWriter
      # tensorboardX names its file by the second and the host only: a writer started in the same second as the last
      # one (a quick resume) would truncate that file and lose its events. A nanosecond suffix keeps each file, in
      # the order TensorBoard reads them (by name).
      self._tb = SummaryWriter(str(self.workdir / tb_dir), purge_step=None if resumed_at is None else resumed_at + 1,
                               filename_suffix=f".{time.time_ns():020d}")
    except ImportError:  # TensorBoard is optional; the jsonl files have everything.
      logging.warning("tensorboardX is not installed: no TensorBoard events (the jsonl logs have everything).")

  def write(self, name: str, record: dict, *, tb_prefix: str | None = None, tb_step: int | None = None) -> None:
    """Appends `record` as one line of `<workdir>/<name>`; with `tb_prefix`, also its numbers as TensorBoard scalars
    `<tb_prefix>/<key>` at `tb_step` (default: the record's "step")."""
    if not self.primary:
      return
    with open(self.workdir / name, "a") as f:
      f.write(json.dumps(record) + "\n")
    if tb_prefix is not None:
      self.scalars(tb_prefix, record, record["step"] if tb_step is None else tb_step)

  def scalars(self, prefix: str, values: dict[str, Any], step: int) -> None:
    """TensorBoard scalars `<prefix>/<key>` for the int and float values (bools and the step itself left out)."""
    if self._tb is None:
      return
    for k, v in values.items():
      if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step":
        self._tb.add_scalar(f"{prefix}/{k}", v, step)

  def flush(self) -> None:
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None

  def __enter__(self) -> RunLog:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
