"""A windowed shuffle of a stream: read `window_size` elements, emit them in a seeded random order, repeat.

Breaks up consecutive pieces of one long document before packing (c2jax/data/pipeline.py). grain ships
`WindowShuffleIterDataset` with the same contract, but it draws each position with a separate `index_shuffle`
call that costs ~2.5 ms on windows of a few dozen elements and ~10 us on windows of thousands; one numpy
permutation per window costs microseconds in all.

The iterator state is {"parent": the parent's state where the current window began, "window_index",
"pos_in_window"}: a restore re-reads that window and skips what was emitted, so it continues exactly.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np


class WindowShuffleIterDataset(grain.IterDataset):
  """The parent's elements shuffled within consecutive windows of `window_size` (window w uses (seed, w))."""

  def __init__(self, parent: grain.IterDataset, *, window_size: int, seed: int):
    super().__init__(parent)
    if window_size < 1:
      raise ValueError(f"window_size={window_size}: use a positive window.")
    self._window_size = int(window_size)
    self._seed = int(seed)

  def __iter__(self) -> grain.DatasetIterator:
    return _WindowShuffleIterator(self._parent.__iter__(), self._window_size, self._seed)

  def __str__(self) -> str:
    return f"WindowShuffleIterDataset(window_size={self._window_size})"


class _WindowShuffleIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, window_size: int, seed: int):
    super().__init__(parent)
    self._window_size, self._seed = window_size, seed
    self._window: list = []
    self._window_index = -1  # no window read yet
    self._pos = 0
    self._start_state = self._parent.get_state()
    self._exhausted = False

  def _fill(self) -> None:
    """Reads window `self._window_index` from the parent's current position and shuffles it."""
    window = []
    for _ in range(self._window_size):
      try:
        window.append(next(self._parent))
      except StopIteration:
        self._exhausted = True
        break
    order = np.random.default_rng([self._seed, self._window_index]).permutation(len(window))
    self._window = [window[i] for i in order]

  def __next__(self) -> Any:
    if self._pos >= len(self._window):
      if self._exhausted:
        raise StopIteration
      self._start_state = self._parent.get_state()
      self._window_index += 1
      self._pos = 0
      self._fill()
      if not self._window:
        raise StopIteration
    element = self._window[self._pos]
    self._window[self._pos] = None  # emitted: let it go
    self._pos += 1
    return element

  def get_state(self) -> dict[str, Any]:
    return {"parent": self._start_state, "window_index": self._window_index, "pos_in_window": self._pos}

  def set_state(self, state: dict[str, Any]) -> None:
    self._start_state = state["parent"]
    self._parent.set_state(self._start_state)
    self._window_index = state["window_index"]
    self._pos = state["pos_in_window"]
    self._exhausted = False
    self._window = []
    if self._window_index >= 0:
      self._fill()
      for i in range(min(self._pos, len(self._window))):
        self._window[i] = None
