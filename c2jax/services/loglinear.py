"""The report's pretraining finding (section 3): held-out code perplexity falls log-linearly with training.

`fit` regresses log-perplexity (the held-out CE in nats) on log(x), x = steps, tokens or training FLOPs:

    ce = a + b * ln(x)        i.e.  perplexity = e^a * x^b,

a straight line on log-log axes. b < 0 is the rate at which perplexity falls per e-fold of compute; R^2 says how
straight the line is. `plot` draws the points, the fit, and (optionally) where each phase starts.

The report's second finding of that section, that a base model's code perplexity predicts the reward RL reaches from
it, is the same regression the other way round: `fit_reward` fits

    reward = a + b * ln(perplexity)        (b < 0: lower perplexity, more reward)

over (perplexity, reward) points, one per RL run (tools/perplexity_vs_reward.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

X_KEYS = ("step", "tokens", "flops")


@dataclasses.dataclass(frozen=True)
class Fit:
  """ce = intercept + slope * ln(x) over `points` evaluations with x > 0.

  Attributes:
    x: which record field x is ("step", "tokens" or "flops").
    intercept, slope: a and b above (nats; nats per e-fold of x).
    r2: coefficient of determination of the regression.
    points: how many evaluations were fitted.
    x_range: (smallest, largest) fitted x.
  """

  x: str
  intercept: float
  slope: float
  r2: float
  points: int
  x_range: tuple[float, float]

  def predict_ppl(self, x: float) -> float:
    return math.exp(self.intercept + self.slope * math.log(x))

  @property
  def ppl_ratio_per_10x(self) -> float:
    """Perplexity multiplier for 10x more x (e.g. 0.8: 10x the compute gives 20% lower perplexity)."""
    return math.exp(self.slope * math.log(10.0))

  def to_dict(self) -> dict:
    return {**dataclasses.asdict(self), "ppl_ratio_per_10x": self.ppl_ratio_per_10x}


def fit(records: Sequence[dict], x: str = "flops", phases: Sequence[str] | None = None,
        min_x: float = 0.0) -> Fit | None:
  """Least-squares fit of held-out CE on ln(x) over eval records ({x, heldout_ce, phase}).

  Args:
    records: eval.jsonl records of `c2jax.services.pretrain_loop`.
    x: "step", "tokens" or "flops".
    phases: only records of these phases (None: all). Fitting one phase avoids the jumps a data-mix change puts
      in the curve.
    min_x: only records with x > min_x (the first steps of a run are rarely on the line yet).

  Returns:
    The fit, or None with fewer than 3 usable points.
  """
  if x not in X_KEYS:
    raise ValueError(f"x={x!r}: use one of {X_KEYS}.")
  pts = [(float(r[x]), float(r["heldout_ce"])) for r in records
         if float(r.get(x, 0)) > max(min_x, 0.0) and (phases is None or r.get("phase") in phases)
         and math.isfinite(float(r["heldout_ce"]))]
  if len(pts) < 3:
    return None
  lx = np.log(np.array([p[0] for p in pts]))
  intercept, slope, r2 = _line(lx, np.array([p[1] for p in pts]))
  return Fit(x=x, intercept=intercept, slope=slope, r2=r2, points=len(pts),
             x_range=(float(np.exp(lx.min())), float(np.exp(lx.max()))))


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
  """Least squares y = intercept + slope * x: (intercept, slope, R^2); R^2 is 1 when y is constant."""
  slope, intercept = np.polyfit(x, y, 1)
  residual = y - (intercept + slope * x)
  total = np.sum((y - y.mean()) ** 2)
  r2 = 1.0 - float(np.sum(residual ** 2) / total) if total > 0 else 1.0
  return float(intercept), float(slope), r2


@dataclasses.dataclass(frozen=True)
class RewardFit:
  """reward = intercept + slope * ln(perplexity) over `points` runs.

  Attributes:
    intercept, slope: a and b (reward units; reward per e-fold of perplexity).
    r2: coefficient of determination (NaN when every reward is the same).
    points: runs fitted.
    ppl_range: (lowest, highest) perplexity fitted.
  """

  intercept: float
  slope: float
  r2: float
  points: int
  ppl_range: tuple[float, float]

  def predict(self, ppl: float) -> float:
    return self.intercept + self.slope * math.log(ppl)

  @property
  def per_halving(self) -> float:
    """Reward gained when perplexity halves (positive when lower perplexity predicts more reward)."""
    return -self.slope * math.log(2.0)

  def to_dict(self) -> dict:
    return {**dataclasses.asdict(self), "per_halving": self.per_halving}


def fit_reward(points: Sequence[tuple[float, float]]) -> RewardFit | None:
  """Least-squares fit of reward on ln(perplexity) over (perplexity, reward) points; None with fewer than 3 finite
  points or a single perplexity."""
  pts = [(float(p), float(r)) for p, r in points if p > 0 and math.isfinite(p) and math.isfinite(r)]
  if len(pts) < 3 or len({p for p, _ in pts}) < 2:
    return None
  lx, y = np.log(np.array([p for p, _ in pts])), np.array([r for _, r in pts])
  intercept, slope, r2 = _line(lx, y)
  if np.all(y == y[0]):
    r2 = math.nan  # a flat reward explains nothing; R^2 = 1 would read as a perfect prediction
  return RewardFit(intercept=intercept, slope=slope, r2=r2, points=len(pts),
                   ppl_range=(min(p for p, _ in pts), max(p for p, _ in pts)))


def plot(records: Sequence[dict], result: Fit | None, path: str, x: str = "flops") -> None:
  """PNG of held-out perplexity against x on log-log axes, coloured by phase, with the fitted line."""
  import matplotlib
  import matplotlib.ticker
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  phases = list(dict.fromkeys(r.get("phase", "") for r in records))
  for name in phases:
    pts = [(r[x], r["heldout_ppl"]) for r in records if r.get("phase", "") == name and r[x] > 0]
    if pts:
      ax.plot(*zip(*pts), "o-", ms=4, label=f"{name}")
  if result is not None:
    xs = np.geomspace(*result.x_range, 50)
    ax.plot(xs, [result.predict_ppl(v) for v in xs], "k--", lw=1,
            label=f"fit: ppl ∝ {x}^{result.slope:.3f} (R²={result.r2:.3f})")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels of a short decade overlap
  ax.set_xlabel({"flops": "training FLOPs (6 x active params x tokens)", "tokens": "tokens", "step": "step"}[x])
  ax.set_ylabel("held-out code perplexity")
  ax.set_title("Held-out perplexity during continued pretraining")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
