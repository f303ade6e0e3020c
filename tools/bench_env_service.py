"""What the environment service costs (docs/design/env_service.md): the round trip of a call that does nothing,
through a server vs in-process, and a scripted multi-turn workload in-process vs on 1 and 2 local servers.

  .venv/bin/python tools/bench_env_service.py                         # 500 no-op calls; 8 episodes x 4 workers
  .venv/bin/python tools/bench_env_service.py --calls=100 --episodes=4 --repeats=1     # a quick look

No-op call: `reset` of a one-turn environment (char_class; nothing to prepare), called `--calls` times on one episode,
in-process and as a Reset of a `RemoteEnv` on a local server (loopback, plaintext): the difference is the per-call
overhead of the service (gRPC, the JSON payload, the secret and token checks, the server's thread).

Workload: tiny_spec's scripted `spec_reader` (read SPEC.md, write, run the tests, finish: real sandboxes, three tool
turns and a grading) on `--episodes` episodes of the train split, `--workers` at a time (the agent loop's tool
workers), no model: every episode's reset, steps, reward and close through `env_factory`'s environments. Figures:
episodes/s (wall), the median and 90th percentile of a step's latency (a tool call as the agent loop waits for it),
and the episodes' mean outcome (1.0: every episode solved, so the three placements ran the same work).

Agent loop (`--agent_episodes`, 0: skipped): the multi-turn agent workload of tools/bench_agent.py (the `explorer`
script on tiny_functions, forced through the engine step by step on a tiny random MoE, 8 slots, real sandboxes)
with its environments in-process and on 1 and 2 local servers, after one untimed in-process round that compiles:
episodes/s and model tokens/s, the fraction of tool time hidden behind decoding (`tool_overlap`) and of slot time
spent holding a cache while episodes queued (`slot_wait_fraction`); the mean step latency as the agent loop's tool
workers saw it (`tool_ms_mean`: reset, steps and grading).

Servers are `python -m c2jax.envs.service.server` processes on this machine, started once (their start-up is not
timed). Medians over `--repeats`, the placements interleaved. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import secrets
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import numpy as np

from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.service.client import EnvServerPool
from c2jax.envs.service.config import EnvServiceConfig
from c2jax.envs.service.factory import InProcessEnvs, RemoteEnvs
from c2jax.envs.service.suites import suite_spec
from c2jax.envs.teachers.scripted_policies import POLICIES
from c2jax.envs.token_tasks.char_class import CharClassSuite
from c2jax.envs.core.agent_env import agent_env

_ROOT = pathlib.Path(__file__).resolve().parents[1]
SECRET_ENV = "C2JAX_BENCH_ENV_SECRET"
WORKLOAD = CodingTaskSuite(coding_suite="tiny_spec", instructions="none", max_turns=8, tokenizer="byte")
NOOP = CharClassSuite(seed=0)
CONFIG = EnvServiceConfig(secret_env=SECRET_ENV, call_timeout_s=60.0, env_timeout_s=300.0, open_wait_s=120.0)


class Server:
  """A local server process; `address` from its first line."""

  def __init__(self, max_episodes: int):
    env = {**os.environ, "PYTHONPATH": str(_ROOT), "JAX_PLATFORMS": "cpu"}
    self.proc = subprocess.Popen([sys.executable, "-m", "c2jax.envs.service.server", "--address=127.0.0.1:0",
                                  f"--secret_env={SECRET_ENV}", f"--max_episodes={max_episodes}",
                                  f"--exit_with_parent={os.getpid()}"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=_ROOT)

  def ready(self) -> str:
    line = self.proc.stdout.readline()
    if not line.startswith("env server listening on "):
      raise RuntimeError(f"The environment server did not start: {line!r}")
    self.address = line.split()[-1]
    return self.address

  def stop(self) -> None:
    self.proc.terminate()
    self.proc.wait(timeout=30)


def noop_us(make_env, calls: int) -> float:
  """Median microseconds of a `reset` of one episode's environment (the first, which opens it, not counted)."""
  env = make_env()
  env.reset()
  times = []
  for _ in range(calls):
    t0 = time.perf_counter()
    env.reset()
    times.append(time.perf_counter() - t0)
  env.close()
  return statistics.median(times) * 1e6


def _episode(make_env, task, act) -> tuple[float, list[float]]:
  """One scripted episode: (its outcome, each step's seconds)."""
  env = make_env()
  steps = []
  try:
    env.reset()
    observations = [task.text]
    coding = WORKLOAD.coding_task(task)
    for _ in range(WORKLOAD.max_turns):
      text = act.act(coding, observations)
      t0 = time.perf_counter()
      result = env.step(np.zeros(0, np.int32), text)
      steps.append(time.perf_counter() - t0)
      observations.append(result.observation)
      if result.done:
        break
    return float(env.reward()["outcome"]), steps
  finally:
    env.close()


def workload(envs, episodes: int, workers: int) -> dict:
  """episodes/s, step latency (median, p90, ms) and the mean outcome of `episodes` scripted episodes."""
  act = POLICIES.get("spec_reader")()
  n = WORKLOAD.size("train")
  jobs = [(WORKLOAD.task("train", i % n), i % n) for i in range(episodes)]
  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    done = list(pool.map(lambda job: _episode(envs(job[0], "train", job[1]), job[0], act), jobs))
  wall = time.perf_counter() - t0
  steps = [s for _, ss in done for s in ss]
  return {"episodes_per_s": episodes / wall, "step_ms_median": float(np.median(steps)) * 1e3,
          "step_ms_p90": float(np.percentile(steps, 90)) * 1e3, "outcome_mean": float(np.mean([o for o, _ in done])),
          "steps": len(steps)}


def agent_loop(placements: dict, episodes: int, repeats: int) -> dict:
  """{placement: medians of the agent loop's figures} for the explorer workload (see the module docstring)."""
  import jax  # the model: imported here, so the calls' benchmark above never loads it
  from c2jax.actors.agent_loop import AgentConfig, AgentRunner, ForcedTurns
  from c2jax.actors.engine import EngineConfig
  from c2jax.actors.sampling import SamplingConfig
  from c2jax.model import presets
  from c2jax.model.params import init_params
  from tools import bench_agent

  suite = CodingTaskSuite(coding_suite="tiny_functions", instructions="none", max_turns=8)
  tok = suite.text_tokenizer()
  model = presets.model_config("tiny", {"vocab_size": 259, "n_layers": 2, "num_mtp_layers": 0, "scan_unroll": 1})
  params = jax.jit(init_params, static_argnums=0)(model, jax.random.key(0))
  agent = AgentConfig(max_turns=8, max_turn_tokens=512, max_episode_tokens=2048, chunk_steps=16, tool_workers=4,
                      forced_turns=ForcedTurns.DECODE)  # the scripted turns stand for sampled ones
  runner = AgentRunner(model, EngineConfig(slots=8, context=2048, chunk_sizes=(16, 64, 256), max_forced=512),
                       SamplingConfig(max_new_tokens=1, temperature=1.0, stop_tokens=(tok.eos_id,)), agent, tok)
  n = suite.size("train")
  work = {name: bench_agent.workload(suite, episodes, lambda i, task, envs=envs: envs(task, "train", i % n)())
          for name, envs in placements.items()}
  bench_agent.run_engine(runner, work["in_process"], params, waves=False)  # compiles
  runs: dict[str, list] = {name: [] for name in work}
  for _ in range(repeats):
    for name, eps in work.items():
      got = bench_agent.run_engine(runner, eps, params, waves=False)
      intervals = runner.stats.tool_intervals
      got.update(episodes_per_s=got["episodes"] / got["wall_s"], model_tokens_per_s=got["model_tokens"] / got["wall_s"],
                 tool_ms_mean=1e3 * float(np.mean([b - a for a, b in intervals])))
      runs[name].append(got)
      print(f"agent loop {name:<11} {got['episodes_per_s']:6.3f} episodes/s  {got['model_tokens_per_s']:7.1f} "
            f"model tok/s  tool {got['tool_ms_mean']:6.1f} ms  overlap {got['tool_overlap']:.2f}  slot wait "
            f"{got['slot_wait_fraction']:.2f}  outcome {got['outcome']:.2f}", flush=True)
  keys = ("episodes_per_s", "model_tokens_per_s", "tool_ms_mean", "tool_overlap", "slot_wait_fraction", "outcome")
  return {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--calls", type=int, default=500)
  parser.add_argument("--episodes", type=int, default=8)
  parser.add_argument("--workers", type=int, default=4)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--agent_episodes", type=int, default=16, help="the agent-loop workload's episodes (0: skip)")
  args = parser.parse_args(argv)
  os.environ.setdefault(SECRET_ENV, secrets.token_hex(32))
  # Seats for every episode a run holds open at once: the agent loop's 8 slots (a full server makes an opening tool
  # worker wait, and 4 of them waiting on 4 seats held by episodes that need those workers would stall).
  servers = [Server(max_episodes=max(args.workers, 8 if args.agent_episodes else 2)) for _ in range(2)]
  try:
    addresses = [s.ready() for s in servers]
    pools = {k: EnvServerPool.from_config(CONFIG, addresses[:k]) for k in (1, 2)}
    noop_task = NOOP.task("train", 0)
    placements = {"in_process": InProcessEnvs(WORKLOAD), "servers_1": RemoteEnvs(pools[1], WORKLOAD),
                  "servers_2": RemoteEnvs(pools[2], WORKLOAD)}
    runs: dict[str, list] = {"noop_us_in_process": [], "noop_us_service": [], **{k: [] for k in placements}}
    for _ in range(args.repeats):
      runs["noop_us_in_process"].append(noop_us(lambda: agent_env(NOOP, noop_task), args.calls))
      runs["noop_us_service"].append(noop_us(lambda: pools[1].env(suite_spec(NOOP), "train", 0), args.calls))
      for name, envs in placements.items():  # interleaved: a slow moment of the machine hurts each alike
        runs[name].append(workload(envs, args.episodes, args.workers))
        print(name, json.dumps(runs[name][-1]), flush=True)
    result = {"noop_us_in_process": statistics.median(runs["noop_us_in_process"]),
              "noop_us_service": statistics.median(runs["noop_us_service"])}
    result["overhead_us_per_call"] = result["noop_us_service"] - result["noop_us_in_process"]
    for name in placements:
      result[name] = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
    if args.agent_episodes:
      agent_suite = CodingTaskSuite(coding_suite="tiny_functions", instructions="none", max_turns=8)
      result["agent_loop"] = agent_loop({"in_process": InProcessEnvs(agent_suite),
                                         "servers_1": RemoteEnvs(pools[1], agent_suite),
                                         "servers_2": RemoteEnvs(pools[2], agent_suite)},
                                        args.agent_episodes, args.repeats)
    result.update(calls=args.calls, episodes=args.episodes, workers=args.workers, repeats=args.repeats,
                  agent_episodes=args.agent_episodes, load_avg=os.getloadavg()[0])
    for pool in pools.values():
      pool.close()
  finally:
    for s in servers:
      s.stop()
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
