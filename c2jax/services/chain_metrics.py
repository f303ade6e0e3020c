"""What self-summaries did in a batch of multi-turn groups, and over a run (report section 4: self-summaries keep
context on long-horizon tasks; these are the figures that show whether they are used and whether they pay).

  m = batch_metrics(groups)          # per step, into metrics.jsonl and TensorBoard ("summary/...")
  r = run_metrics(history, 3)        # over the run, into result.json (episodes of 0 .. 3 compactions)

Per episode (a chain: the rows of a group sharing a `chain_id`): compactions = its segments - 1; summary tokens =
its SUMMARY tokens (the ledger's `source`, an overrun summary in the last segment included); outcome = its task
reward term "outcome" (the hidden tests' pass fraction of a coding suite; the first reward term of a suite without
one), the same on each of its rows.

  summary/episodes                          chains in the batch
  summary/compactions_per_episode           mean compactions
  summary/needed_fraction                   share of chains with at least one compaction
  summary/tokens_per_episode                mean summary tokens
  summary/episodes_by_compactions/<k>       chains with k compactions
  summary/outcome_by_compactions/<k>        their mean outcome
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from c2jax.actors.ledger import Source
from c2jax.rollouts.buffer import Group

PREFIX = "summary/"


def _outcome_term(terms: Mapping[str, np.ndarray]) -> str:
  return "outcome" if "outcome" in terms else sorted(terms)[0]


def batch_metrics(groups: Sequence[Group]) -> dict[str, float]:
  """The per-step figures of the module docstring over `groups` (multi-turn groups: with the ledger's `source`);
  {} for groups without a ledger (single-turn rows have no summaries)."""
  if not groups or "source" not in groups[0].data:
    return {}
  compactions, tokens, outcome = [], [], []
  for g in groups:
    d = g.data
    chain = np.asarray(d["chain_id"])
    summary = np.sum(np.asarray(d["source"]) == int(Source.SUMMARY), axis=1)
    term = np.asarray(d["reward_terms"][_outcome_term(d["reward_terms"])])
    for c in np.unique(chain):
      rows = chain == c
      compactions.append(int(rows.sum()) - 1)
      tokens.append(int(summary[rows].sum()))
      outcome.append(float(term[rows][0]))
  compactions, outcome = np.asarray(compactions), np.asarray(outcome)
  m = {f"{PREFIX}episodes": float(len(compactions)),
       f"{PREFIX}compactions_per_episode": float(compactions.mean()),
       f"{PREFIX}needed_fraction": float(np.mean(compactions > 0)),
       f"{PREFIX}tokens_per_episode": float(np.mean(tokens))}
  for k in np.unique(compactions):
    m[f"{PREFIX}episodes_by_compactions/{k}"] = float(np.sum(compactions == k))
    m[f"{PREFIX}outcome_by_compactions/{k}"] = float(outcome[compactions == k].mean())
  return m


def run_metrics(history: Sequence[Mapping[str, float]], max_compactions: int) -> dict:
  """The run's figures from its steps' metrics, each step weighted by its episodes: compactions_per_episode,
  needed_summary_fraction, summary_tokens_per_episode, and for k = 0 .. max_compactions episodes_with_<k>_compactions
  (a count) and outcome_with_<k>_compactions (their mean outcome, None without such episodes); {} when no step
  logged them (single-turn rows)."""
  steps = [h for h in history if f"{PREFIX}episodes" in h]
  if not steps:
    return {}
  n = np.asarray([h[f"{PREFIX}episodes"] for h in steps])
  mean = lambda key: float(np.sum(n * np.asarray([h[f"{PREFIX}{key}"] for h in steps])) / n.sum())
  out = {"compactions_per_episode": mean("compactions_per_episode"),
         "needed_summary_fraction": mean("needed_fraction"),
         "summary_tokens_per_episode": mean("tokens_per_episode")}
  for k in range(max_compactions + 1):
    count = sum(h.get(f"{PREFIX}episodes_by_compactions/{k}", 0.0) for h in steps)
    total = sum(h.get(f"{PREFIX}episodes_by_compactions/{k}", 0.0) * h.get(f"{PREFIX}outcome_by_compactions/{k}", 0.0)
                for h in steps)
    out[f"episodes_with_{k}_compactions"] = int(count)
    out[f"outcome_with_{k}_compactions"] = total / count if count else None
  return out
