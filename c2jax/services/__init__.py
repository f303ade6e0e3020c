"""The services of the report's RL infrastructure (section 6) and the jobs that wire the library together: the only
library code that imports rollouts, actors, evaluation and the pure updates at once.

  rl_run_config.py        the RL run config as typed sections (one converter: c2jax.typed_config)
  pretrain_run_config.py  the pretraining run config and its phases
  cli.py                  entry points' command lines: bad keys and values refused in one sentence
  run_log.py              a run's jsonl logs and TensorBoard events, consistent across restarts
  pretrain_loop.py        continued pretraining: the phases, held-out perplexity, exact resume
  warm_start.py           the cached SFT before RL
  collate.py              buffer groups -> the RL batch
  rl_loop.py              the RL trainer service: take, update, publish, log, checkpoint
  pool.py                 the local pool of actor processes
  actor_process.py        an actor or the evaluator (python -m c2jax.services.actor_process)
  rl_job.py               the RL job: SFT warm start, pool, trainer
  held_out.py             the RL run's held-out evaluation, built from its run config (c2jax.eval does the work)
  rl_report.py            the before/after table and the training plot
  loglinear.py            the log-linear fit of held-out perplexity (report section 3's finding)
"""
