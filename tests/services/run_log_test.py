"""A run's TensorBoard events are what TensorBoard's own reader shows (`tensorboard --logdir=<workdir>/tb`, the
viewer of the `tensorboard` extra): the scalars by tag and step, and a resumed run's events past its checkpoint
purged. The step logs a restart trims beside them."""

import shutil
import tempfile

from absl.testing import absltest
from tensorboard.backend.event_processing import event_accumulator

from c2jax.services.run_log import RunLog, read_history


def _scalars(directory: str) -> dict[str, list[tuple[int, float]]]:
  acc = event_accumulator.EventAccumulator(directory).Reload()
  return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


class RunLogTest(absltest.TestCase):

  def test_tensorboard_reads_the_events_and_a_resume_purges_what_followed_its_checkpoint(self):
    work = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, work, ignore_errors=True)
    with RunLog(work, resumed_at=None, step_logs=("metrics.jsonl",)) as log:
      for step in (1, 2, 3):
        log.write("metrics.jsonl", {"step": step, "loss": 1.0 / 2 ** step, "done": True}, tb_prefix="train")
    got = _scalars(f"{work}/tb")
    self.assertEqual(set(got), {"train/loss"})  # bools and the step itself are no scalars
    self.assertEqual(got["train/loss"], [(1, 0.5), (2, 0.25), (3, 0.125)])
    # A run killed after step 3 resumes from its checkpoint of step 2 and logs step 3 again.
    with RunLog(work, resumed_at=2, step_logs=("metrics.jsonl",)) as log:
      log.write("metrics.jsonl", {"step": 3, "loss": 0.0625}, tb_prefix="train")
    self.assertEqual(_scalars(f"{work}/tb")["train/loss"], [(1, 0.5), (2, 0.25), (3, 0.0625)])
    self.assertEqual([m["loss"] for m in read_history(f"{work}/metrics.jsonl")], [0.5, 0.25, 0.0625])


if __name__ == "__main__":
  absltest.main()
