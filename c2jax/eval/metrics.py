"""The pass@k and best-of-K estimators, the one home of both (numpy, on the host): every evaluation reports them from
n samples per task (report section 5: RL should raise both the mean and the best-of-K; a policy that only sharpens
raises pass@1 and lowers best-of-K).

  pass_at_k(n=16, c=5, k=8)             # one task: n samples, c solved
  best_of_k(outcomes, k=8)              # one task: its n outcomes (pass fractions: partial credit counts)
  summary(outcome)                      # outcome [tasks, samples] -> {"pass@1": ..., "best_of_16": ..., ...}

pass@k is the unbiased estimator 1 - C(n - c, k) / C(n, k) per task (n samples, c solved), averaged over tasks;
best_of_k the expected highest outcome among k of a task's n samples drawn without replacement, averaged over tasks:
with n > k samples both are far less noisy than one draw of k. The keys are spelled "pass@k" and "best_of_k" here, in
the harness's reports (`harness.py`) and in the RL update's metrics (the same estimators on a batch's prompt groups,
on device: `c2jax.rl.group_metrics`, jnp with static shapes).
"""

from __future__ import annotations

import math

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k of one task from n samples of which c are solved (Chen et al. 2021); 1 <= k <= n."""
  if not 1 <= k <= n:
    raise ValueError(f"pass@{k} needs 1 <= k <= samples per task ({n}).")
  return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def best_of_k(outcomes, k: int) -> float:
  """Unbiased E[max of k of the n outcomes drawn without replacement]: with the outcomes sorted ascending,
  sum_i o_(i) C(i - 1, k - 1) / C(n, k) (the i-th smallest is the maximum of C(i - 1, k - 1) of the k-subsets);
  1 <= k <= n. k = n is the plain maximum."""
  o = np.sort(np.asarray(outcomes, np.float64))
  n = len(o)
  if not 1 <= k <= n:
    raise ValueError(f"best_of_{k} needs 1 <= k <= samples per task ({n}).")
  weights = np.array([math.comb(i, k - 1) for i in range(n)], np.float64) / math.comb(n, k)
  return float(np.dot(weights, o))


def summary(outcome: np.ndarray, success_threshold: float = 1.0, pass_k: tuple[int, ...] = (1,)) -> dict:
  """The figures of outcomes [tasks, samples]: "pass@k" and "best_of_k" for k in pass_k (k <= samples),
  f"best_of_{samples}", "reward/mean", "tasks", "samples"."""
  tasks, samples = outcome.shape
  solved = (outcome >= success_threshold).sum(1)
  result = {f"pass@{k}": float(np.mean([pass_at_k(samples, int(c), k) for c in solved]))
            for k in pass_k if k <= samples}
  for k in sorted({k for k in pass_k if k <= samples} | {samples}):
    result[f"best_of_{k}"] = float(np.mean([best_of_k(row, k) for row in outcome]))
  result["reward/mean"] = float(outcome.mean())
  result["tasks"], result["samples"] = tasks, samples
  return result
