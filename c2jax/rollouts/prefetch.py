"""Reading the trainer's next batch while it trains on this one (report section 6: the trainer should never wait
on the rollout buffer while groups are there).

  prefetch = Prefetcher(reader, n=groups_per_step)
  groups, cursor = prefetch.take(timeout_s=1.0)   # ([], None) while the batch is not complete yet
  prefetch.start()                                # reads the next batch in the background ...
  state = update(state, groups)                   # ... during the update
  reader.publish_progress(version, n, cursor=cursor)
  prefetch.close()

Reading a batch (its commit records, then zarr chunks through tensorstore and zstd) takes milliseconds to tens of
milliseconds; on the critical path of every step it counts as waiting even when the actors are far ahead.

Each result carries the reader's cursor just after its groups were handed out, which is the cursor to checkpoint
once they are trained (`RolloutReader.cursor` itself already counts the batch read ahead). A batch read ahead and
never trained (the run stopped) is not in any saved cursor, so a restart reads it again.

While a read is in flight the reader belongs to the background thread: call nothing else on it except
`publish_progress` with an explicit cursor (which only writes trainer.json).
"""

from __future__ import annotations

import concurrent.futures
from typing import Sequence

from c2jax.rollouts.buffer import Group, RolloutReader


class Prefetcher:
  """One background read of `n` groups at a time from a RolloutReader (all or nothing, as `RolloutReader.take`)."""

  def __init__(self, reader: RolloutReader, n: int, *, read_timeout_s: float = 1.0, poll_interval_s: float = 0.05):
    """Args:
      reader: the reader the groups come from (owned by this object's thread while a read runs).
      n: groups per batch.
      read_timeout_s: how long one background read waits for a complete batch before it returns none (and
        `take` starts another).
      poll_interval_s: the reader's poll interval while it waits.
    """
    if n < 1:
      raise ValueError(f"Prefetcher needs n >= 1 groups per batch, got {n}.")
    self.reader, self.n = reader, n
    self._read_timeout_s, self._poll_interval_s = read_timeout_s, poll_interval_s
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prefetch")
    self._future: concurrent.futures.Future | None = None

  def _read(self) -> tuple[list[Group], dict | None]:
    groups = self.reader.take(self.n, timeout_s=self._read_timeout_s, poll_interval_s=self._poll_interval_s)
    return groups, (self.reader.cursor if groups else None)

  def start(self) -> None:
    """Starts reading the next batch in the background (nothing if a read is already running or done)."""
    if self._future is None:
      self._future = self._pool.submit(self._read)

  def take(self, timeout_s: float | None = None) -> tuple[Sequence[Group], dict | None]:
    """The next batch and the reader's cursor after it; ([], None) when none is complete within `timeout_s` (the
    read goes on; call again). A read's exception is raised here."""
    self.start()
    try:
      groups, cursor = self._future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
      return [], None
    self._future = None  # done: with a batch, or empty after read_timeout_s (the next call starts another read)
    return groups, cursor

  def close(self) -> None:
    """Waits for a running read to end (at most read_timeout_s) and stops the thread. Idempotent."""
    self._pool.shutdown(wait=True)

  def __enter__(self) -> Prefetcher:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
