"""What an RL run shows at its end: the before/after table and the training plot (report section 5: RL should raise
both the mean, pass@1, and the best-of-K on held-out tasks).

  print(summary_table(result))             # result: what c2jax.services.rl_loop.run returns
  plot_training(workdir)                   # -> <workdir>/training.png

The plot reads the run's own logs: the trainer's metrics.jsonl (reward per step), eval.jsonl (the trainer's
held-out evaluation before and after training) and eval_during.jsonl (the evaluator process's held-out evaluations
of published versions during training). Versions are the weight store's counter; a run started fresh has
version = step.
"""

from __future__ import annotations

import math
import os
import pathlib

from c2jax.services.run_log import read_history, read_records


def _fmt(v, digits: int = 3) -> str:
  if v is None or (isinstance(v, float) and math.isnan(v)):
    return "-"
  if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) >= 1000):
    return f"{int(v):,}"
  return f"{v:.{digits}f}"


# The agent's held-out behaviour (c2jax/actors/behaviour.py; result.json's "behaviour_<name>_before/_after"), with
# the digits each is printed with.
BEHAVIOUR_ROWS = (("turns / episode", "behaviour_turns_per_episode", 2),
                  ("episodes with an edit", "behaviour_edit_fraction", 3),
                  ("read before edit", "behaviour_read_before_edit", 3),
                  ("tests before finish", "behaviour_tests_before_finish", 3),
                  ("recovery after failing tests", "behaviour_recovery_after_failing_tests", 3),
                  ("malformed-call rate", "behaviour_malformed_call_rate", 3),
                  ("tokens / episode", "behaviour_tokens_per_episode", 1))


# The behaviour curves of training.png's third panel (rates in [0, 1], from the held-out evaluations' records), each
# with its marker style.
PLOTTED_BEHAVIOUR = (("episodes with an edit", "behaviour/edit_fraction", "D-"),
                     ("tests before finish", "behaviour/tests_before_finish", "o-"),
                     ("recovery after failing tests", "behaviour/recovery_after_failing_tests", "s-"),
                     ("read before edit", "behaviour/read_before_edit", "^-"),
                     ("malformed-call rate", "behaviour/malformed_call_rate", "v-"))


def _finite(v) -> bool:
  return isinstance(v, (int, float)) and not math.isnan(v)


def summary_table(result: dict) -> str:
  """A plain-text table of a finished run's result: held-out pass@1, best-of-K and mean reward before / after, the
  agent's held-out behaviour (multi-turn runs; "-" where no episode applied), then the run's throughput and
  off-policy figures."""
  k = result.get("k", 8)
  rows = [("held-out", "before", "after", "change")]

  def row(name: str, key: str, digits: int = 3) -> tuple[str, str, str, str]:
    before, after = result.get(f"{key}_before"), result.get(f"{key}_after")
    change = None if before is None or after is None else after - before
    return name, _fmt(before, digits), _fmt(after, digits), "-" if change is None else f"{change:+.{digits}f}"

  for name, key in (("pass@1", "pass_at_1"), (f"best-of-{k}", "best_of_k"), ("mean reward", "reward_heldout")):
    rows.append(row(name, key))
  rows += [row(name, key, digits) for name, key, digits in BEHAVIOUR_ROWS
           if f"{key}_before" in result or f"{key}_after" in result]
  width = [max(len(r[i]) for r in rows) for i in range(4)]
  line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, width)))
  out = [line(rows[0]), line(tuple("-" * w for w in width))] + [line(r) for r in rows[1:]]
  run = [("steps", _fmt(result.get("steps"))),
         ("tokens trained", _fmt(result.get("tokens_trained"))),
         ("samples/s (trainer)", _fmt(result.get("samples_per_s"), 2)),
         ("trained tokens/s", _fmt(result.get("tokens_per_s"), 1)),
         ("mean staleness (versions)", _fmt(result.get("staleness_mean"), 2)),
         ("filtered-token fraction", _fmt(result.get("filtered_fraction"), 4)),
         ("trainer wait fraction", _fmt(result.get("wait_fraction"), 3)),
         ("train reward first 5 -> last 5", f"{_fmt(result.get('reward_first'))} -> {_fmt(result.get('reward_last'))}")]
  w = max(len(n) for n, _ in run)
  return "\n".join(out + [""] + [f"{n.ljust(w)}  {v}" for n, v in run])


def plot_training(workdir: str | os.PathLike, k: int = 8) -> str | None:
  """Writes <workdir>/training.png: train reward per step, held-out pass@1 and best-of-K per version, and (multi-turn
  runs) held-out behaviour rates per version (`PLOTTED_BEHAVIOUR`).

  Returns the PNG's path, or None when the run has no metrics yet.
  """
  work = pathlib.Path(workdir)
  history = read_history(work / "metrics.jsonl")
  if not history:
    return None
  # The object API, not pyplot: drawing must not switch the backend of the process that calls it (a notebook).
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  evals = {}  # version -> record; the trainer's before/after win over the evaluator's at the same version
  for r in read_records(work / "eval_during.jsonl"):
    evals[int(r["version"])] = r
  for r in read_records(work / "eval.jsonl"):
    evals[int(r["version"])] = r
  # Behaviour curves where the evaluations measured them (multi-turn runs: c2jax/actors/behaviour.py).
  shown = [(name, key, style) for name, key, style in PLOTTED_BEHAVIOUR
           if any(_finite(r.get(key)) for r in evals.values())]
  fig = Figure(figsize=(7, 8.5 if shown else 6))
  FigureCanvasAgg(fig)
  panels = fig.subplots(3 if shown else 2, 1, sharex=True)
  top, bottom = panels[0], panels[1]
  versions = [h["version"] for h in history]
  top.plot(versions, [h["reward/mean"] for h in history], color="tab:gray", alpha=0.5, lw=1, label="per step")
  window = 5
  smooth = [sum(h["reward/mean"] for h in history[max(0, i - window + 1):i + 1]) / min(window, i + 1)
            for i in range(len(history))]
  top.plot(versions, smooth, color="tab:blue", lw=2, label=f"mean of last {window}")
  top.set_ylabel("train reward")
  top.legend(loc="upper left", fontsize=8)
  top.grid(alpha=0.3)
  if evals:
    xs = sorted(evals)
    bottom.plot(xs, [evals[v]["pass@1"] for v in xs], "o-", color="tab:green", label="pass@1")
    key = f"best_of_{k}"
    if all(key in evals[v] for v in xs):
      bottom.plot(xs, [evals[v][key] for v in xs], "s-", color="tab:orange", label=f"best-of-{k}")
    bottom.plot(xs, [evals[v]["reward/mean"] for v in xs], "^--", color="tab:purple", alpha=0.6,
                label="mean outcome")
    bottom.legend(loc="lower right", fontsize=8)  # the curves start low and rise; best-of-K sits near 1
  bottom.set_ylabel("held-out")
  bottom.set_ylim(-0.02, 1.02)
  bottom.grid(alpha=0.3)
  if shown:
    panel = panels[2]
    xs = sorted(evals)
    for name, key, style in shown:
      points = [(v, evals[v][key]) for v in xs if _finite(evals[v].get(key))]
      panel.plot([v for v, _ in points], [y for _, y in points], style, label=name)
    panel.set_ylabel("held-out behaviour")
    panel.set_ylim(-0.02, 1.02)
    panel.legend(loc="best", fontsize=8)  # rates rise (tests) and fall (malformed calls): no corner is always free
    panel.grid(alpha=0.3)
  panels[-1].set_xlabel("weights version (trainer step)")
  fig.suptitle(f"RL: {work.parent.name}/{work.name}")
  fig.tight_layout()
  path = work / "training.png"
  fig.savefig(path, dpi=110)
  return str(path)
