"""The window shuffle: a permutation within each window, seeded, and exact restores from any position."""

import json

from absl.testing import absltest
import grain

from c2jax.data.window_shuffle import WindowShuffleIterDataset


class WindowShuffleTest(absltest.TestCase):

  def test_permutes_within_windows_and_restores_anywhere(self):
    ds = WindowShuffleIterDataset(grain.MapDataset.range(37).to_iter_dataset(), window_size=8, seed=5)
    out = list(ds)
    self.assertEqual(sorted(out), list(range(37)))
    for w in range(0, 37, 8):
      self.assertEqual(sorted(out[w:w + 8]), list(range(w, min(w + 8, 37))))
    self.assertNotEqual(out, list(range(37)))
    self.assertEqual(out, list(ds))
    self.assertNotEqual(out, list(WindowShuffleIterDataset(grain.MapDataset.range(37).to_iter_dataset(),
                                                           window_size=8, seed=6)))
    for k in range(38):
      it = iter(ds)
      for _ in range(k):
        next(it)
      state = json.loads(json.dumps(it.get_state()))
      fresh = iter(ds)
      fresh.set_state(state)
      self.assertEqual(list(fresh), out[k:], f"restored after {k}")


if __name__ == "__main__":
  absltest.main()
