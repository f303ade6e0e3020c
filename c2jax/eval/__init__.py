"""Evaluation, one home (report section 5).

  metrics.py       the pass@k and best-of-K estimators (numpy), and the figures of an outcome matrix
  policy_eval.py   held-out evaluation of a policy on a token task suite: the sampler, or the agent loop
  harness.py       a policy on a coding-task suite in sandboxes: episodes, reports (Markdown, JSON, plot)
  suite_eval.py    the evaluation service: the harness as a job, its run config, the weight-store watcher

The RL run's held-out evaluation, built from its run config, stays with the run config in
`c2jax.services.held_out` (the services import it, and it reads their `RLRunConfig`).
"""
