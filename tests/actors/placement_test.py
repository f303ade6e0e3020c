"""c2jax/actors/placement.py: cpu-lists, pinning every thread of a process, the trainer / actors split."""

import os
import subprocess
import sys
import textwrap
import unittest

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.actors import placement


class CpuListTest(parameterized.TestCase):

  @parameterized.parameters(("", set()), ("3", {3}), ("0-3,6", {0, 1, 2, 3, 6}), (" 1 , 4-5 ", {1, 4, 5}),
                            ("2-2", {2}), ("0,0,1", {0, 1}))
  def test_parse(self, spec, want):
    self.assertEqual(placement.parse_cpus(spec), frozenset(want))

  @parameterized.parameters("a", "1-", "-1", "3-1", "1.5", "0-x")
  def test_parse_rejects_malformed_lists(self, spec):
    with self.assertRaisesRegex(ValueError, "CPU list"):
      placement.parse_cpus(spec)

  @parameterized.parameters(({0, 1, 2, 6}, "0-2,6"), ({5}, "5"), (set(), ""), ({1, 3, 4, 5, 9, 10}, "1,3-5,9-10"))
  def test_format_round_trips(self, cpus, want):
    self.assertEqual(placement.format_cpus(cpus), want)
    self.assertEqual(placement.parse_cpus(want), frozenset(cpus))


@unittest.skipUnless(hasattr(os, "sched_setaffinity"), "CPU pinning is Linux-only (sched_setaffinity)")
class PinTest(absltest.TestCase):

  def _run(self, code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=False,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    self.assertEqual(out.returncode, 0, out.stderr)
    return out.stdout.strip()

  def test_pin_moves_every_existing_and_later_thread(self):
    cpu = min(os.sched_getaffinity(0))
    got = self._run(f"""
        import os, threading
        from c2jax.actors import placement
        ready, done = threading.Event(), threading.Event()
        early = threading.Thread(target=lambda: (ready.set(), done.wait()))
        early.start(); ready.wait()                  # a thread that exists before the pin (as XLA's pools do)
        placement.pin({{{cpu}}})
        late = []
        t = threading.Thread(target=lambda: late.append(os.sched_getaffinity(0))); t.start(); t.join()
        masks = {{int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir("/proc/self/task")}}
        done.set(); early.join()
        print(all(m == {{{cpu}}} for m in masks.values()) and late == [{{{cpu}}}] and len(masks) >= 2)
        """)
    self.assertEqual(got, "True")

  def test_a_child_of_a_pinned_process_can_move_to_other_cpus(self):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
      self.skipTest("needs 2 CPUs to pin parent and child apart")
    got = self._run(f"""
        import os, subprocess, sys
        from c2jax.actors import placement
        placement.pin({{{cpus[0]}}})
        child = ("from c2jax.actors import placement; import os; placement.pin({{{cpus[1]}}}); "
                 "print(sorted(os.sched_getaffinity(0)))")
        print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
        """)
    self.assertEqual(got, f"[{cpus[1]}]")

  def test_empty_set_is_no_pinning_and_a_missing_cpu_is_an_error(self):
    before = os.sched_getaffinity(0)
    placement.pin(frozenset())
    self.assertEqual(os.sched_getaffinity(0), before)
    with self.assertRaisesRegex(ValueError, "do not exist"):
      placement.pin({os.cpu_count() + 7})
    self.assertEqual(os.sched_getaffinity(0), before)

  def test_split_halves_the_available_cpus(self):
    ids = sorted(os.sched_getaffinity(0))
    if len(ids) < 2:
      with self.assertRaisesRegex(ValueError, "at least 2"):
        placement.split_cpus()
      return
    trainer, actors = placement.split_cpus()
    self.assertEqual(sorted(trainer | actors), ids)
    self.assertEmpty(trainer & actors)
    self.assertEqual(len(trainer), (len(ids) + 1) // 2)
    self.assertLess(max(trainer), min(actors))


if __name__ == "__main__":
  absltest.main()
