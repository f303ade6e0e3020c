"""What every entry point does with its command line: a bad run config, and an input the user can fix (a path that
does not exist, an output that does: `refusals`), are refused in one sentence with exit code 2, never a traceback
(experiments/*_main.py, `python -m c2jax.services.actor_process`, the tools).

  _CONFIG = cli.define_config_file("configs/rl_tiny.py", "Run config file.")   # instead of DEFINE_config_file
  app.run(main, flags_parser=cli.flags_parser)      # --config.<key>=... for a key the config lacks: one sentence
  cfg = cli.typed(rl_run_config.parse, _CONFIG.value)   # a bad value: one sentence naming the key, exit code 2

ml_collections applies `--config.a.b=v` overrides when it loads the config file (while absl parses the flags, or,
for the flag's default, when the flag is defined); a key the file does not have raises a bare AttributeError there,
and a value of the wrong type an absl error that does not say what the field holds. `define_config_file` and
`flags_parser` find the override at fault and name it with the keys its section has.

`--config_help` (on every entry point that reads a run config through `typed`) prints every field of the typed run
config, one line each: its override, its value in the config file, the dataclass's default where that differs, and
the first sentence of its docstring entry (`c2jax.typed_config.field_help`: generated from the dataclasses); then
exits 0 before anything starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Sequence, TypeVar

from absl import flags
from ml_collections import config_flags

T = TypeVar("T")

EXIT_USAGE = 2

_CONFIG_HELP = flags.DEFINE_bool("config_help", False, "Print every field of the run config (its --config.<key> "
                                 "override, its value in this config, its default and its doc), then exit.")


def refuse(message: str) -> None:
  """Prints `message` (one sentence) to stderr and exits with code 2."""
  print(f"{os.path.basename(sys.argv[0] or 'c2jax')}: {message}", file=sys.stderr, flush=True)
  raise SystemExit(EXIT_USAGE)


@contextlib.contextmanager
def refusals():
  """Refuses (one sentence, code 2, no traceback) what the user can fix and the code refuses inside the block: a
  path that does not exist or is not what it must be, an output that exists (`c2jax.input_errors`), a damaged
  weight store, a writer id held by another live writer, a buffer cursor of another buffer, a mesh that the devices,
  the model or the batch cannot take."""
  from c2jax.input_errors import InputError
  from c2jax.parallel.mesh import MeshRefusal
  from c2jax.rollouts.buffer import BufferRefusal
  from c2jax.rollouts.weight_store import WeightStoreError
  try:
    yield
  except (InputError, BufferRefusal, MeshRefusal, WeightStoreError) as e:
    refuse(str(e))


def _override_keys(argv: Sequence[str], flag: str) -> list[tuple[str, str | None]]:
  """(dotted key, value or None) of every `--<flag>.key=value` / `--<flag>.key value` in argv."""
  out = []
  prefix = f"--{flag}."
  for i, arg in enumerate(argv):
    if arg.startswith(prefix):
      key, sep, value = arg[len(prefix):].partition("=")
      out.append((key, value if sep else (argv[i + 1] if i + 1 < len(argv) else None)))
  return out


def _describe(value: Any) -> str:
  kind = {bool: "True or False", int: "an integer", float: "a number", str: "a string",
          tuple: "a tuple written '(a, b)'"}.get(type(value))
  return f"{kind} (it holds {value!r})" if kind else f"of the type of {value!r}"


def override_error(config: Any, argv: Sequence[str], flag: str = "config") -> str | None:
  """The one-sentence error of the first override in argv that names no key of `config` or whose value does not
  parse as its field's type; None when every override fits."""
  for key, value in _override_keys(argv, flag):
    node, path = config, []
    for part in key.split("."):
      keys = sorted(node.keys()) if hasattr(node, "keys") else []
      if part not in keys:
        where = ".".join(path) or "the config"
        return (f"--{flag}.{key}: {where} has no key {part!r}; its keys are {', '.join(keys)}." if keys else
                f"--{flag}.{key}: {where} is {node!r}, not a section with keys.")
      node = node[part]
      path.append(part)
    if value is not None and isinstance(node, (bool, int, float, tuple)):
      try:
        parsed = _parse_like(node, value)
      except ValueError:
        parsed = None
      if parsed is None:
        return f"--{flag}.{key}={value}: the field is {_describe(node)}."
  return None


def _parse_like(old: Any, text: str) -> Any:
  import ast
  if isinstance(old, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(text)
    return text.lower() in ("true", "1")
  value = ast.literal_eval(text) if isinstance(old, tuple) else type(old)(text)
  if isinstance(old, tuple) and not isinstance(value, tuple):
    raise ValueError(text)
  return value


def config_file_error(argv: Sequence[str], flag: str = "config") -> str | None:
  """The one-sentence error of `--<flag>=path[:arg]` in argv when `path` is not a file (ml_collections would report
  it only when the config is first read, inside a 40-line traceback); None when it is one or argv names none."""
  spec = _config_spec(argv, flag)
  if spec is None:
    return None
  path = spec.partition(":")[0]
  if os.path.isfile(path):
    return None
  default = _DEFAULTS.get(flag)
  example = f" such as {os.path.relpath(default.partition(':')[0])}" if default else ""
  return (f"--{flag}={spec}: {path} is not a file; name a config file{example} (a relative path is read from "
          f"{os.getcwd()}).")


def flags_parser(argv: Sequence[str], flag: str = "config") -> list[str]:
  """absl's flag parsing (`app.run(main, flags_parser=flags_parser)`), with the config file and its overrides
  checked: a config file that does not exist, an unknown key or a value of the wrong type exits with one sentence
  (code 2)."""
  message = config_file_error(argv, flag)
  if message:
    refuse(message)
  try:
    return flags.FLAGS(list(argv))
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    config = _config_without_overrides(argv, flag)
    message = override_error(config, argv, flag) if config is not None else None
    refuse(message or str(e).strip().splitlines()[-1].strip("'\""))


_DEFAULTS: dict[str, str | None] = {}  # flag name -> its default config file (define_config_file)


def _load_config_file(spec: str) -> Any:
  """`get_config(arg)` of the config file `path[:arg]`, as ml_collections loads it (without any override)."""
  import importlib.util
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("c2jax_cli_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _config_spec(argv: Sequence[str], flag: str) -> str | None:
  """The `path[:arg]` of `--<flag>=...` / `--<flag> ...` in argv, or None."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith(f"--{flag}=")), None)
  if spec is None:
    spec = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == f"--{flag}"), None)
  return spec


def _config_without_overrides(argv: Sequence[str], flag: str) -> Any:
  """The config file of `--<flag>=path[:arg]` (or the flag's default), without the overrides; None when there is
  none or it does not load (then absl's own message stands)."""
  spec = _config_spec(argv, flag) or _DEFAULTS.get(flag)
  if not spec:
    return None
  try:
    return _load_config_file(spec)
  except Exception:  # noqa: BLE001  (the config file itself fails: absl's message says why)
    return None


def define_config_file(default: str | None, help_text: str, name: str = "config"):
  """`config_flags.DEFINE_config_file(name, default, help_text)`, whose default (loaded, with the command line's
  overrides, at definition) refuses a bad override in one sentence like `flags_parser` does."""
  _DEFAULTS[name] = default
  try:
    return config_flags.DEFINE_config_file(name, default, help_text)
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    config = _config_without_overrides(sys.argv, name)
    message = override_error(config, sys.argv, name) if config is not None else None
    refuse(message or str(e).strip().splitlines()[-1].strip("'\""))


def typed(parse: Callable[[Any], T], config: Any) -> T:
  """`parse(config)` (a run config module's parse), its ValueError refused in one sentence (code 2); with
  `--config_help`, prints the typed config's fields (`config_help`) and exits 0."""
  try:
    cfg = parse(config)
  except ValueError as e:
    refuse(str(e))
  if flags.FLAGS.is_parsed() and _CONFIG_HELP.value:
    print(config_help(cfg, _config_spec(sys.argv, "config") or _DEFAULTS.get("config")), flush=True)
    raise SystemExit(0)
  return cfg


def write_config(cfg: Any, workdir: str) -> str:
  """The typed run config `cfg`, resolved (every field), as <workdir>/config.json (`typed_config.to_plain`: the
  run config module's parse reads it back); returns its path."""
  import json
  from c2jax import typed_config
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, "config.json")
  with open(path, "w", encoding="utf-8") as f:
    f.write(json.dumps(typed_config.to_plain(cfg), indent=2) + "\n")
  return path


def outputs(workdir: str, entries: Sequence[tuple[str, str, str]]) -> str:
  """The lines a job prints at its end about where its outputs are: one per (what, path under `workdir`, how to use
  it, "{path}" standing for the path) whose path exists."""
  rows = [(what, os.path.join(workdir, rel), use.format(path=os.path.join(workdir, rel))) for what, rel, use in entries
          if os.path.exists(os.path.join(workdir, rel))]
  width = max((len(what) for what, _, _ in rows), default=0)
  lines = [f"outputs in {os.path.abspath(workdir)}:"]
  lines += [f"  {what:<{width}}  {path}" + (f"  ({use})" if use else "") for what, path, use in rows]
  return "\n".join(lines)


def config_help(cfg: Any, source: str | None = None) -> str:
  """The lines `--config_help` prints for the typed run config `cfg` (read from the config file `source`)."""
  import json
  from c2jax import typed_config
  where = f"in {os.path.relpath(source.partition(':')[0])}{':' + source.partition(':')[2] if ':' in source else ''}" \
      if source else "at its default"
  lines = [f"{type(cfg).__name__}: every field as --config.<key>=<value>, with its value {where} (and the default "
           "where that differs) and its doc."]
  for h in typed_config.field_help(cfg):
    value = json.dumps(h.value)
    default = "" if h.default is typed_config.NO_DEFAULT or h.default == h.value else \
        f" (default {json.dumps(h.default)})"
    lines.append(f"  --config.{h.key}={value}{default}  {h.doc}")
  return "\n".join(lines)
