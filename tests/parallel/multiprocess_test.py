"""Two processes on localhost (jax.distributed, CPU collectives), four devices each, one mesh across both: the
losses of a few train steps equal the single-process 8-device run (this process's 8 fake devices)."""

import json
import os
import socket
import subprocess
import sys
import tempfile

from absl.testing import absltest
import numpy as np
import pytest

from tests.parallel.multiprocess_worker import run_steps

pytestmark = pytest.mark.e2e  # two jax.distributed processes (`make test-unit` leaves them out)

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multiprocess_worker.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env():
  return dict(os.environ)  # the worker replaces the device count of XLA_FLAGS and keeps the rest


class MultiProcessTest(absltest.TestCase):

  def test_two_processes_match_one(self):
    with tempfile.TemporaryDirectory() as tmp:
      multi = os.path.join(tmp, "multi.json")
      port = _free_port()
      procs = [subprocess.Popen([sys.executable, _WORKER, "--num_processes=2", f"--process_id={i}", f"--port={port}",
                                 f"--out={multi}"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for i in range(2)]
      try:
        # The single-process reference: the worker's steps on this process's 8 devices (a third interpreter
        # would only add its start-up), while the two workers run.
        want = run_steps()
        outs = [p.communicate(timeout=600)[0].decode() for p in procs]
      finally:  # a worker whose peer died would wait in a collective forever
        for p in procs:
          p.kill()
      for p, out in zip(procs, outs):
        self.assertEqual(p.returncode, 0, out[-3000:])
      with open(multi) as f:
        got = json.load(f)
    self.assertEqual(want["process_count"], 1)
    self.assertEqual(want["local_devices"], 8)
    self.assertEqual(got["process_count"], 2)
    self.assertEqual(got["local_devices"], 4)
    self.assertLen(got["losses"], 3)
    # Same program, same data; only the collectives' implementation differs (gloo across processes).
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=1e-5, atol=1e-5)
    self.assertLess(got["losses"][-1], got["losses"][0])


if __name__ == "__main__":
  absltest.main()
