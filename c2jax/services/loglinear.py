"""The report's pretraining finding (section 3): held-out code perplexity falls log-linearly with training.

`fit` regresses log-perplexity (the held-out CE in nats) on log(x), x = steps, tokens or training FLOPs:

    ce = a + b * ln(x)        i.e.  perplexity = e^a * x^b,

a straight line on log-log axes. b < 0 is the rate at which perplexity falls per e-fold of compute; R^2 says how
straight the line is. `plot` draws the points, the fit, and (optionally) where each phase starts.
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
  y = np.array([p[1] for p in pts])
  slope, intercept = np.polyfit(lx, y, 1)
  residual = y - (intercept + slope * lx)
  total = np.sum((y - y.mean()) ** 2)
  r2 = 1.0 - float(np.sum(residual ** 2) / total) if total > 0 else 1.0
  return Fit(x=x, intercept=float(intercept), slope=float(slope), r2=r2, points=len(pts),
             x_range=(float(np.exp(lx.min())), float(np.exp(lx.max()))))


def plot(records: Sequence[dict], result: Fit | None, path: str, x: str = "flops") -> None:
  """PNG of held-out perplexity against x on log-log axes, coloured by phase, with the fitted line."""
  import matplotlib
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

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
