"""c2jax: a JAX/XLA implementation of the Composer 2 training system."""

__version__ = "0.1.0"
