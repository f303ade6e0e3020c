"""The optimizer shared by pretraining and RL: AdamW with warmup + decay and clipping (`adamw.py`)."""

from c2jax.optim.adamw import Decay, OptimizerConfig, make_optimizer, make_schedule

__all__ = ["Decay", "OptimizerConfig", "make_optimizer", "make_schedule"]
