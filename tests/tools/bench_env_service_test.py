"""tools/bench_env_service.py at its smallest size: real servers and sandboxes, every placement runs the same solved
episodes, the service's no-op call costs more than the in-process one, and the last line is the JSON result."""

import contextlib
import io
import json

from absl.testing import absltest
import pytest

from c2jax.sandbox import sandbox as sandbox_lib
from tools import bench_env_service


@pytest.mark.e2e  # 2 server processes (~4 s on 2 cores)
class BenchEnvServiceTest(absltest.TestCase):

  def test_smallest_run(self):
    reason = sandbox_lib.unavailable_reason()
    if reason:
      self.skipTest(reason)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      result = bench_env_service.main(["--calls=20", "--episodes=2", "--workers=2", "--repeats=1",
                                       "--agent_episodes=0"])  # the agent loop's workload compiles a model
    self.assertEqual(json.loads(out.getvalue().strip().splitlines()[-1]), result)
    for name in ("in_process", "servers_1", "servers_2"):
      self.assertEqual(result[name]["outcome_mean"], 1.0, name)  # the same solved episodes everywhere
      self.assertEqual(result[name]["steps"], result["in_process"]["steps"], name)
      self.assertGreater(result[name]["episodes_per_s"], 0)
    self.assertGreater(result["noop_us_service"], result["noop_us_in_process"])
    self.assertAlmostEqual(result["overhead_us_per_call"],
                           result["noop_us_service"] - result["noop_us_in_process"])


if __name__ == "__main__":
  absltest.main()
