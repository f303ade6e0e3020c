from c2jax.envs import char_class  # noqa: F401  (registers the built-in suite)
