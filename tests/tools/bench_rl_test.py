"""tools/bench_rl.py: the interleaved plan and the steady-state figures, from fake per-step logs (a real sync + async
pair costs ~1-2 min of start-up and compiles on 2 cores; the tool was run by hand at its smallest size)."""

import json
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest

from c2jax.actors import placement
from configs import rl_char_class
from tools import bench_rl


def _history(step_s, wait_s, tokens=256.0, staleness=0.0, steps=4):
  return [{"step": s, "time/step_s": step_s, "buffer/wait_s": wait_s, "tokens": tokens, "staleness/mean": staleness}
          for s in range(1, steps + 1)]


class BenchRlTest(absltest.TestCase):

  def test_plan_interleaves_the_schedules_with_shared_overrides(self):
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    runs = bench_rl.plan(rl_char_class.get_config(), tmp, steps=5, repeats=2, overrides={"actors.num": 1})
    self.assertEqual([r.name for r in runs], ["sync/seed_0", "async/seed_0", "sync/seed_1", "async/seed_1"])
    configs = [json.loads(r.config) for r in runs]
    self.assertEqual([c["schedule"] for c in configs], ["sync", "async"] * 2)
    self.assertEqual(configs[1]["actors"]["weight_updates"], "in_flight")
    for c in configs:
      self.assertEqual((c["trainer"]["steps"], c["actors"]["num"], c["eval"]["process"]), (5, 1, False))

  def test_split_placement_pins_trainer_and_actors_to_disjoint_cpus(self):
    self.assertEqual(bench_rl.placement_overrides(bench_rl.Placement.SHARED), {})
    with mock.patch.object(placement.os, "sched_getaffinity", return_value={0, 1, 2, 3, 4}, create=True):
      got = bench_rl.placement_overrides(bench_rl.Placement.SPLIT)
    self.assertEqual(got, {"trainer.cpus": "0-2", "actors.cpus": "3-4"})
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    runs = bench_rl.plan(rl_char_class.get_config(), tmp, steps=5, repeats=1, overrides=got)
    for r in runs:  # both schedules get the same placement
      c = json.loads(r.config)
      self.assertEqual((c["trainer"]["cpus"], c["actors"]["cpus"]), ("0-2", "3-4"))

  def test_steady_state_leaves_out_the_warmup_and_the_ratio_is_async_over_sync(self):
    slow_first = _history(step_s=0.5, wait_s=0.25)
    slow_first[0].update({"time/step_s": 30.0, "buffer/wait_s": 29.0})  # the compile step
    sync = bench_rl.steady_state(slow_first, rows_per_step=32, warmup=1)
    self.assertEqual(sync, {"samples_per_s": 64.0, "tokens_per_s": 512.0, "wait_fraction": 0.5,
                            "staleness_mean": 0.0, "steps_timed": 3})
    fast = bench_rl.steady_state(_history(step_s=0.25, wait_s=0.0125, staleness=1.0), rows_per_step=32, warmup=1)
    out = bench_rl.summarize({"sync": [sync], "async": [fast]})
    self.assertAlmostEqual(out["ratio"], 2.0)
    self.assertAlmostEqual(out["tokens_ratio"], 2.0)
    self.assertAlmostEqual(out["trainer_wait_fraction"], 0.05)
    self.assertAlmostEqual(out["sync_wait_fraction"], 0.5)
    with self.assertRaisesRegex(ValueError, "raise --steps"):
      bench_rl.steady_state(slow_first, rows_per_step=32, warmup=4)


if __name__ == "__main__":
  absltest.main()
