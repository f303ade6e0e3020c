from c2jax.envs.token_tasks import char_class  # noqa: F401  (registers the built-in suite)
from c2jax.envs import coding_rl  # noqa: F401  (registers the coding suites as actor tasks)
