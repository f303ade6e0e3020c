"""Multi-turn agent rollouts: the agent loop's engine (slot-resident KV, continuous batching, tools overlapping
generation) against two schedules a peer would use, on one workload in one invocation (report sections 4 and 6).

  .venv/bin/python tools/bench_agent.py                           # tiny_functions, 24 episodes, 8 slots, 3 repeats
  .venv/bin/python tools/bench_agent.py --episodes=8 --slots=4 --repeats=1    # a quick look
  .venv/bin/python tools/bench_agent.py --placement=shared        # engine and sandboxes on every core

Workload: episodes of `CodingEnv` on a coding suite with real sandboxed tools. The policy is the `explorer` script
(c2jax/envs/teachers/scripted_policies.py: read the repository, write the solution, run a listing and a syntax check,
finish: 5 tool calls in 4 turns) forced through the engine on a tiny random MoE: every turn is decoded step by
step as sampled turns are (`ForcedTurns.DECODE`, not the agent loop's default prefill), taking the script's tokens
instead of drawing (`EngineConfig.max_forced`), so the device work and the tool work are those of a real agent
while the episodes stay identical across schedules and repeats.

Schedules, all on the same engine kernels (`c2jax.actors.engine`) and the same tool workers:
  engine          the agent loop: S slots, a finished episode's slot refilled from the queue at once, an ended
                  turn's tools run while the other slots decode, each observation appended at its slot's offset.
  static_append   the same appends, but episodes in static waves of S (a wave ends when its last episode does):
                  no refilling of finished slots.
  reprefill       lockstep static waves of S that re-prefill the whole conversation every turn (what a peer without a
                  prefix cache does): every slot's turn, then every slot's tools, then every slot re-prefilled.
The three run interleaved (engine, static_append, reprefill, engine, ...) `--repeats` times after one untimed
warm-up round (compiles); reported are medians: episodes/s, model tokens/s, and the engine's fraction of cross-turn
positions prefilled twice (`reprefill_fraction`: (positions fed - positions) / positions), the fraction of tool
wall time hidden behind decoding (`tool_overlap`), and the slot-seconds its slots only held a cache while their
tools ran and episodes were queued (`slot_wait_fraction`, what offloading waiting caches to host memory could give
back).

Tools (`--tools`). `sandbox` (the default) runs every tool call in a real sandbox on this machine. `replay` first
records one run of the workload with real sandboxes (each reset, call and grading: its result and wall time), then
times the schedules against environments that return the recorded results after sleeping the recorded times:
tools with their real latencies that take no CPU here, as sandboxes on other machines (the report's environments
run apart from inference) would be. On a small machine real sandboxes are CPU-bound and share the cores with the
model, which caps what any schedule can gain; replay shows what the scheduling itself buys.

Placement (`--placement`). `split` (the default) pins the model to the first half of this process's CPUs and the
tool workers, with the sandboxes they start, to the rest (`AgentConfig.tool_cpus`): in a cluster the model runs
on an accelerator and the sandboxes on other machines, so generation and tools do not take each other's cores.
`shared` leaves both on every core; on a machine with few cores, overlapping tools with decoding then mostly
trades one's CPU time for the other's.

The last line printed is one JSON object with `ratio` (engine / reprefill episodes/s), `ratio_vs_static_append`,
`reprefill_fraction` and `tool_overlap`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

import jax
import numpy as np

from c2jax.actors import engine as engine_lib
from c2jax.actors import placement
from c2jax.actors.agent_loop import AgentConfig, AgentRunner, Episode, ForcedTurns
from c2jax.actors.engine import EngineConfig
from c2jax.actors.sampling import SamplingConfig
from c2jax.envs.coding_rl import CodingTaskSuite
from c2jax.envs.teachers.scripted_policies import ExplorerPolicy
from c2jax.model import presets
from c2jax.model.params import init_params

SCHEDULES = ("engine", "static_append", "reprefill")


def workload(suite: CodingTaskSuite, n: int, make_env=None) -> list[Episode]:
  """n explorer episodes over the suite's train tasks (task i mod size); make_env(i, task) overrides the
  environment (the replay)."""
  policy = ExplorerPolicy()
  episodes = []
  for i in range(n):
    task = suite.task("train", i % suite.size("train"))
    coding = suite.coding_task(task)
    env = functools.partial(suite.agent_env, task) if make_env is None else functools.partial(make_env, i, task)
    episodes.append(Episode(prompt=task.prompt, make_env=env, key=i,
                            script=lambda turn, obs, coding=coding: policy.act(coding, obs)))
  return episodes


class Recorder:
  """A real environment that records what each call returned and how long it took."""

  def __init__(self, env, record: dict):
    self.env, self.record = env, record
    record.update(steps=[])

  def _timed(self, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0

  def reset(self):
    _, self.record["reset_s"] = self._timed(self.env.reset)

  def step(self, ids, text):
    result, seconds = self._timed(self.env.step, ids, text)
    self.record["steps"].append((result, seconds))
    return result

  def reward(self):
    terms, self.record["reward_s"] = self._timed(self.env.reward)
    self.record["terms"] = terms
    return terms

  def close(self):
    self.env.close()


class Replay:
  """The recorded environment: the same results after the same wall times, no CPU."""

  def __init__(self, record: dict):
    self.record, self.turn = record, 0

  def reset(self):
    time.sleep(self.record["reset_s"])

  def step(self, ids, text):
    result, seconds = self.record["steps"][self.turn]
    self.turn += 1
    time.sleep(seconds)
    return result

  def reward(self):
    time.sleep(self.record["reward_s"])
    return self.record["terms"]

  def close(self):
    pass


def run_engine(runner: AgentRunner, episodes, params, waves: bool) -> dict:
  """The agent loop over all episodes (waves=False), or over static waves of S episodes (waves=True)."""
  runner.stats = type(runner.stats)()
  t0 = time.perf_counter()
  s = runner.engine.slots
  batches = [episodes[i:i + s] for i in range(0, len(episodes), s)] if waves else [episodes]
  out = [traj for batch in batches for traj in runner.run(batch, weights=lambda: (params, 0))]
  wall = time.perf_counter() - t0
  st = runner.stats
  return {"wall_s": wall, "episodes": len(out), "model_tokens": sum(t.model_tokens for t in out),
          "outcome": float(np.mean([t.reward_terms["outcome"] for t in out])),
          "reprefill_fraction": st.reprefill_fraction, "tool_overlap": st.tool_overlap,
          "slot_wait_fraction": st.slot_wait_fraction, "turns": float(np.mean([t.turns for t in out]))}


def run_reprefill(runner: AgentRunner, episodes, params) -> dict:
  """Lockstep static waves that re-prefill each whole conversation every turn (see the module docstring)."""
  eng, tok, agent, kw = runner.engine, runner.tokenizer, runner.agent, runner._kw
  s, piece = eng.slots, eng.chunk_sizes[-1] - 1
  t0 = time.perf_counter()
  fed = positions = model_tokens = 0
  outcomes, turns_taken = [], []
  state = engine_lib.init_state(runner.model, eng, runner.sampling)
  keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(0), np.arange(s))
  pin = functools.partial(placement.pin_thread, placement.parse_cpus(agent.tool_cpus))
  with concurrent.futures.ThreadPoolExecutor(agent.tool_workers, initializer=pin) as pool:
    for w in range(0, len(episodes), s):
      wave = episodes[w:w + s]
      envs = [ep.make_env() for ep in wave]
      list(pool.map(lambda e: e.reset(), envs))
      conv = [[int(t) for t in ep.prompt] for ep in wave]
      texts = [[tok.decode(ep.prompt)] for ep in wave]
      live = [True] * len(wave)
      turns = [0] * len(wave)
      while any(live):
        # Every live conversation from position 0, in chunks; the last chunk starts the forced turn.
        starts = {i: 0 for i in range(len(wave)) if live[i]}
        while starts:
          chunk = np.zeros((s, eng.chunk_sizes[-1]), np.int32)
          lengths, reset, draw = np.zeros(s, np.int32), np.zeros(s, bool), np.zeros(s, bool)
          turn_end, forced = np.zeros(s, np.int32), np.zeros((s, eng.max_forced), np.int32)
          forced_len, take = np.zeros(s, np.int32), np.zeros(s, bool)
          sent = dict(starts)
          for i, at in list(starts.items()):
            ids = conv[i][at:at + piece]
            chunk[i, :len(ids)], lengths[i], take[i], reset[i] = ids, len(ids), True, at == 0
            fed += len(ids)
            if at + piece >= len(conv[i]):
              draw[i] = True
              script = wave[i].script(turns[i], texts[i])
              f = tok.encode(script, bos=False, eos=True)[:eng.max_forced]
              forced[i, :len(f)], forced_len[i] = f, len(f)
              turn_end[i] = min(len(conv[i]) + agent.max_turn_tokens, eng.context)
              del starts[i]
            else:
              starts[i] = at + piece
          c = eng.bucket(int(lengths.max()) + 1)
          window = eng.window(max(min(len(conv[i]), at + piece) for i, at in sent.items()))
          state = engine_lib.append(params, state, chunk[:, :c], lengths, take_part=take, reset=reset, draw=draw,
                                    turn_end=turn_end, keys=keys, version=0, forced=forced, forced_len=forced_len,
                                    window=window, **kw)
        while True:  # the same attention windows as the engine's
          length, running = jax.device_get((state.length, state.decoding))
          if not running.any():
            break
          window = eng.window(int(length[running].max()) + agent.chunk_steps)
          state = engine_lib.decode(params, state, steps=agent.chunk_steps, version=0, window=window, **kw)
        tokens, length, start = jax.device_get((state.tokens, state.length, state.turn_start))
        jobs = {}
        for i in range(len(wave)):
          if live[i]:
            ids = tokens[i, start[i]:length[i]]
            fed += max(len(ids) - 1, 0)
            model_tokens += len(ids)
            conv[i] += [int(t) for t in ids]
            turns[i] += 1
            jobs[i] = pool.submit(envs[i].step, ids, tok.decode(ids))
        for i, job in jobs.items():  # lockstep: every slot's tools before any slot goes on
          result = job.result()
          obs = result.observation + result.notice
          ids = tok.encode(obs, bos=False, eos=False) if obs else []
          if result.done or turns[i] >= agent.max_turns or len(conv[i]) + len(ids) + 1 > eng.context:
            live[i] = False
            continue
          conv[i] += [int(t) for t in ids]
          texts[i].append(obs)
      outcomes += [t["outcome"] for t in pool.map(lambda e: e.reward(), envs)]
      for e in envs:
        e.close()
      positions += sum(len(c) for c in conv)
      turns_taken += turns
  return {"wall_s": time.perf_counter() - t0, "episodes": len(episodes), "model_tokens": model_tokens,
          "outcome": float(np.mean(outcomes)), "reprefill_fraction": (fed - positions) / max(positions, 1),
          "turns": float(np.mean(turns_taken))}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--suite", default="tiny_functions", help="a coding suite (CODING_SUITES)")
  parser.add_argument("--episodes", type=int, default=24)
  parser.add_argument("--slots", type=int, default=8)
  parser.add_argument("--context", type=int, default=2048)
  parser.add_argument("--tool_workers", type=int, default=4)
  parser.add_argument("--chunk_steps", type=int, default=16)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--model", default="tiny", help="a model preset; byte vocabulary, 2 layers")
  parser.add_argument("--tools", choices=("sandbox", "replay"), default="sandbox",
                      help="sandbox: real sandboxes here; replay: recorded results and latencies (remote sandboxes)")
  parser.add_argument("--placement", choices=("split", "shared"), default="split",
                      help="split: model and tools on disjoint CPUs; shared: both everywhere")
  args = parser.parse_args(argv)
  tool_cpus = ""
  if args.placement == "split":
    model_cpus, tools = placement.split_cpus()
    placement.pin(model_cpus)  # before the first computation, so XLA's threads start there
    tool_cpus = placement.format_cpus(tools)

  model = presets.model_config(args.model, {"vocab_size": 259, "n_layers": 2, "num_mtp_layers": 0, "scan_unroll": 1})
  params = jax.jit(init_params, static_argnums=0)(model, jax.random.key(0))
  suite = CodingTaskSuite(coding_suite=args.suite, instructions="none", max_turns=8)
  tok = suite.text_tokenizer()
  sampling = SamplingConfig(max_new_tokens=1, temperature=1.0, stop_tokens=(tok.eos_id,))
  agent = AgentConfig(max_turns=8, max_turn_tokens=512, max_episode_tokens=args.context,
                      chunk_steps=args.chunk_steps, tool_workers=args.tool_workers, tool_cpus=tool_cpus,
                      forced_turns=ForcedTurns.DECODE)  # the scripted turns stand for sampled ones
  engine = EngineConfig(slots=args.slots, context=args.context, chunk_sizes=(16, 64, 256), max_forced=512)
  runner = AgentRunner(model, engine, sampling, agent, tok)
  episodes = workload(suite, args.episodes)
  if args.tools == "replay":
    print("warm-up (compiles), then one recorded run with real sandboxes ...", flush=True)
    run_engine(runner, episodes, params, waves=False)
    records = [{} for _ in episodes]
    recorded = workload(suite, args.episodes, lambda i, task: Recorder(suite.agent_env(task), records[i]))
    run_engine(runner, recorded, params, waves=False)
    episodes = workload(suite, args.episodes, lambda i, task: Replay(records[i]))
    tool_s = sum(r["reset_s"] + r["reward_s"] + sum(s for _, s in r["steps"]) for r in records)
    print(f"recorded {sum(len(r['steps']) for r in records)} turns, {tool_s:.1f} s of tool wall time", flush=True)
  fns = {"engine": lambda: run_engine(runner, episodes, params, waves=False),
         "static_append": lambda: run_engine(runner, episodes, params, waves=True),
         "reprefill": lambda: run_reprefill(runner, episodes, params)}
  print(f"warm-up (compiles): {args.episodes} episodes per schedule ...", flush=True)
  for name in SCHEDULES:
    fns[name]()
  runs = {name: [] for name in SCHEDULES}
  for r in range(args.repeats):
    for name in SCHEDULES:
      got = fns[name]()
      got["episodes_per_s"] = got["episodes"] / got["wall_s"]
      got["model_tokens_per_s"] = got["model_tokens"] / got["wall_s"]
      runs[name].append(got)
      print(f"repeat {r} {name:<14} {got['wall_s']:7.2f} s  {got['episodes_per_s']:6.3f} episodes/s  "
            f"{got['model_tokens_per_s']:8.1f} model tok/s  outcome {got['outcome']:.2f}  turns {got['turns']:.1f}  "
            f"reprefill {got['reprefill_fraction']:.3f}", flush=True)
  med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
  out = {
      "ratio": med["engine"]["episodes_per_s"] / med["reprefill"]["episodes_per_s"],
      "ratio_vs_static_append": med["engine"]["episodes_per_s"] / med["static_append"]["episodes_per_s"],
      "reprefill_fraction": med["engine"]["reprefill_fraction"],
      "tool_overlap": med["engine"]["tool_overlap"],
      "slot_wait_fraction": med["engine"]["slot_wait_fraction"],
      "baseline_reprefill_fraction": med["reprefill"]["reprefill_fraction"],
      "episodes_per_s": {n: med[n]["episodes_per_s"] for n in SCHEDULES},
      "model_tokens_per_s": {n: med[n]["model_tokens_per_s"] for n in SCHEDULES},
      "outcome": {n: med[n]["outcome"] for n in SCHEDULES},
      "episodes": args.episodes, "slots": args.slots, "repeats": args.repeats, "suite": args.suite,
      "tool_workers": args.tool_workers, "placement": args.placement, "tool_cpus": tool_cpus, "tools": args.tools,
  }
  print(json.dumps(out))


if __name__ == "__main__":
  main()
