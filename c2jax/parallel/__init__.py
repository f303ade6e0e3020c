"""Parallelism: device meshes, logical-axis rules, expert-parallel MoE and context-parallel attention.

See `c2jax.parallel.layout` for how the pieces fit, and `c2jax.pretrain.sharded` for the sharded train step.
"""
