"""The seconds-scale variant of configs/rl_tiny.py: asynchronous RL of the tiny MoE from a random init on the
built-in toy task char_class (report sections 4 and 6), for tests, quick ablation sweeps and the quickstart notebook.

  python experiments/rl_main.py --config=configs/rl_char_class.py --workdir=runs/rl_char_class
  python experiments/rl_main.py --config=configs/rl_char_class.py --workdir=runs/rl_sync --config.schedule=sync
  python tools/sweep.py --config=configs/rl_char_class.py --sweep=configs/sweeps/dr_grpo_vs_grpo.py

A task names a character class after a random prefix (`qzk|digits>`); 8 sampled bytes earn the fraction in the
class (c2jax/envs/char_class.py). The RL, actor, trainer and eval fields are configs/rl_tiny.py's (the coding main
job), so a sweep file over them applies to both; task fields differ by suite (answer_tokens here).
"""

import ml_collections

from c2jax.model.config import ModelConfig  # noqa: F401  (documents where model_overrides' fields live)
from c2jax.rl.config import RLConfig, to_config_dict
from configs.model import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = ml_collections.ConfigDict()
  c.model = "tiny"  # a module under configs/model
  # Byte tokens (256 bytes + 3 specials); 2 layers (1 dense + 1 MoE) keep each compile to seconds on a CPU.
  c.model_overrides = ml_collections.ConfigDict(
      {"vocab_size": 259, "n_layers": 2, "num_mtp_layers": 0, "scan_unroll": 1})
  c.init_checkpoint = ""  # a c2jax model checkpoint (pretraining / SFT) to start from; empty: random init
  c.seed = 0
  c.mesh = ""  # the trainer's device mesh, e.g. "fsdp:2,expert:2" (c2jax.parallel.mesh); empty: one device
  c.compilation_cache = ""  # directory of compiled programs (empty: <workdir>/jax_cache), reused on restart
  c.schedule = "async"  # async | sync (c2jax.rl.run_config.Schedule)

  # The RL recipe: every field of c2jax.rl.config.RLConfig, defaults from the report.
  rl = to_config_dict(RLConfig(model=tiny.get_model_config()))
  rl.optim.learning_rate = 1e-2  # a tiny model from scratch on a toy task; the report's scale uses ~1e-6
  c.rl = rl

  # answer_tokens > 0: only the first n bytes are graded, free text follows (c2jax/envs/char_class.py).
  c.task = ml_collections.ConfigDict({"suite": "char_class", "seed": 0, "answer_tokens": 0})
  # With task.suite="coding" (c2jax/envs/coding_rl.py: coding_suite, instructions, max_turns, max_tokens), an SFT
  # warm start on the suite's demonstrations can precede RL: a one-phase run of the pretraining loop, cached by its
  # settings under cache_dir ($C2JAX_CACHE_DIR or ~/.cache/c2jax when empty; c2jax/rl/warm_start.py).
  c.sft = ml_collections.ConfigDict(dict(enabled=False, cache_dir="", steps=300, seq_len=768, batch_size=8,
                                         learning_rate=3e-3, warmup_steps=20, mtp_weight=0.0))

  c.actors = ml_collections.ConfigDict(dict(
      num=2,  # local actor processes started by rl_main
      external=False,  # True: start none; actors run elsewhere against the same URLs
      group_size=8, groups_per_call=2, prompt_len=16, max_new_tokens=8, temperature=1.0, stop_tokens=[],
      chunk_steps=2,  # decode steps between checks for newer weights
      max_lag=1,  # admission: a group starts at most this many versions before the update that trains on it
      weight_updates="in_flight",  # in_flight | between_calls
      poll_interval_s=0.05,
      pending_lease_s=120.0,  # admission forgets the begun groups of an actor silent this long
  ))

  c.trainer = ml_collections.ConfigDict(dict(
      steps=80, groups_per_step=4, checkpoint_every=10, keep_checkpoints=2,
      take_timeout_s=900.0,  # fail if no batch arrives for this long
  ))
  c.buffer = ""  # URL (path, s3://, gs://); empty: <workdir>/buffer
  c.weights = ""  # URL; empty: <workdir>/weights
  c.weight_store = ml_collections.ConfigDict(dict(full_every=8, keep=2))

  # Held-out evaluation: in the trainer before and after training, and by an evaluator process during training.
  c.eval = ml_collections.ConfigDict(dict(tasks=16, samples=8, every_versions=10, process=True))
  c.rl.pass_k = (1, 4, 8)
  return c
