"""Environments, one sub-package per concern (lowest first; docs/design/layers.md):

  tasks/, token_tasks/, tools/   coding task formats and suites; tasks as the actors see them; the agent's tools
  chat/, grading/                chat formats; grading by hidden tests in the sandbox (`c2jax.sandbox`)
  core/                          the coding environment and environments as the agent loop drives them
  teachers/                      scripted policies, SFT demonstrations, a suite's own BPE
  coding_rl.py                   coding suites as actor tasks (this package, above the rest)
  service/                       environments on their own servers (gRPC), above this package: a server builds any
                                 suite this package registers

Importing the package registers the built-in token task suites.
"""

from c2jax.envs.token_tasks import char_class  # noqa: F401  (registers the built-in suite)
from c2jax.envs import coding_rl  # noqa: F401  (registers the coding suites as actor tasks)
