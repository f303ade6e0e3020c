"""Errors in what a user gives a run, as opposed to faults of the code: a path that does not exist or is not what it
must be, an output that would be overwritten. Entry points refuse them in one sentence that names the fix, with exit
code 2 and no traceback (`c2jax.services.cli.refusals`), and check them before starting anything expensive.

  raise MissingInput(f"--hf_dir={path} does not exist; point it at an HF checkpoint directory with config.json.")

Each keeps the built-in error it refines as a base (`MissingInput` is a FileNotFoundError and a ValueError,
`MismatchedInput` a ValueError, `ExistingOutput` a FileExistsError), so code that catches those still catches them.
"""


class InputError(Exception):
  """A run's input that the user can fix; the message is one sentence naming the input and the fix."""


class MissingInput(InputError, FileNotFoundError, ValueError):
  """A path the run reads does not exist, or is not what it must be (a directory without the file that makes it a
  checkpoint, a model directory without the tokenizer file c2jax reads). A ValueError too: the config field or flag
  that named the path holds a bad value."""


class MismatchedInput(InputError, ValueError):
  """An input that exists but does not fit the run: a checkpoint of another architecture than the run's model."""


class ExistingOutput(InputError, FileExistsError):
  """A path the run would create already exists, and writing there would overwrite or mix two outputs."""
