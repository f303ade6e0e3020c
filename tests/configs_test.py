"""Golden snapshots: every run config in configs/ (and every model preset) resolved to its dataclasses, one
`key = value` line per field. A change of any default, preset or shipped config shows up here as a reviewed diff.

  C2JAX_UPDATE_GOLDENS=1 .venv/bin/python -m pytest tests/configs_test.py    # rewrites tests/golden/ after a change
"""

import difflib
import json
import os
import pathlib

from absl.testing import absltest
from absl.testing import parameterized

from c2jax import typed_config
from c2jax.eval import suite_eval
from c2jax.model import presets
from c2jax.services import pretrain_run_config
from c2jax.services import rl_run_config
from configs import eval_complementary
from configs import eval_humaneval
from configs import eval_realistic
from configs import pretrain_tiny
from configs import rl_char_class
from configs import rl_long_horizon
from configs import rl_tiny

_GOLDEN = pathlib.Path(__file__).resolve().parent / "golden"
_UPDATE = bool(os.environ.get("C2JAX_UPDATE_GOLDENS"))
_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _lines(plain: dict, prefix: str = "") -> list[str]:
  return [f"{prefix}{k} = {json.dumps(v, sort_keys=True)}" for k, v in typed_config.flatten(plain).items()]


def _rl(module, arg: str | None = None) -> list[str]:
  cfg = rl_run_config.parse(module.get_config(arg))
  # The run config as written, then what it resolves to: the architecture, and the actors' own config.
  return (_lines(typed_config.to_plain(cfg)) + _lines(typed_config.to_plain(cfg.model_config), "resolved.model.")
          + _lines(typed_config.to_plain(cfg.actor_config), "resolved.actor."))


def _pretrain(module, arg: str | None = None) -> list[str]:
  cfg = pretrain_run_config.parse(module.get_config(arg))
  lines = _lines(typed_config.to_plain(cfg)) + _lines(typed_config.to_plain(cfg.model_config), "resolved.model.")
  for p in cfg.phases_resolved():
    lines += _lines({"start": p.start, "rope": typed_config.to_plain(p.model.rope), "hp": typed_config.to_plain(p.hp)},
                    f"resolved.phases.{p.name}.")
  return lines


def _eval(module, arg: str | None = None) -> list[str]:
  cfg = suite_eval.parse(module.get_config(arg))
  return _lines(typed_config.to_plain(cfg)) + _lines(typed_config.to_plain(cfg.model_config), "resolved.model.")


SNAPSHOTS = {
    "configs/pretrain_tiny.py": lambda: _pretrain(pretrain_tiny),
    "configs/pretrain_tiny.py:rl_tiny": lambda: _pretrain(pretrain_tiny, "rl_tiny"),
    "configs/pretrain_tiny.py:rl_tiny_single_turn": lambda: _pretrain(pretrain_tiny, "rl_tiny_single_turn"),
    "configs/pretrain_tiny.py:rl_tiny_copy": lambda: _pretrain(pretrain_tiny, "rl_tiny_copy"),
    "configs/rl_tiny.py": lambda: _rl(rl_tiny),
    "configs/rl_tiny.py:single_turn": lambda: _rl(rl_tiny, "single_turn"),
    "configs/rl_char_class.py": lambda: _rl(rl_char_class),
    "configs/rl_long_horizon.py": lambda: _rl(rl_long_horizon),
    "configs/eval_realistic.py": lambda: _eval(eval_realistic),
    "configs/eval_humaneval.py": lambda: _eval(eval_humaneval),
    **{f"configs/eval_complementary.py:{arg}": (lambda arg=arg: _eval(eval_complementary, arg))
       for arg in eval_complementary.EVALUATIONS},
    **{f"preset {name}": (lambda name=name: _lines(typed_config.to_plain(presets.MODEL_PRESETS.get(name)())))
       for name in presets.MODEL_PRESETS.names()},
}


def _path(name: str) -> pathlib.Path:
  return _GOLDEN / (name.replace("configs/", "").replace(".py", "").replace("preset ", "preset_").replace(":", "_")
                    + ".txt")


class GoldenConfigsTest(parameterized.TestCase):

  @parameterized.named_parameters((name.replace("/", "_").replace(".", "_").replace(" ", "_"), name)
                                  for name in SNAPSHOTS)
  def test_matches_its_golden_snapshot(self, name):
    got = "\n".join(SNAPSHOTS[name]()) + "\n"
    path = _path(name)
    if _UPDATE:
      path.write_text(got)
    self.assertTrue(path.exists(), f"{path} is missing: run with C2JAX_UPDATE_GOLDENS=1 to write it.")
    want = path.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), str(path), name))
    self.assertEqual(got, want, f"{name} resolves differently from {path} (a change of defaults?). Review the diff; "
                     f"if it is intended, rerun with C2JAX_UPDATE_GOLDENS=1 and commit the snapshot.\n{diff}")

  def test_every_run_config_in_configs_has_a_snapshot(self):
    files = {f"configs/{p.name}" for p in (_ROOT / "configs").glob("*.py")
             if p.name not in ("__init__.py", "from_json.py")}
    self.assertEqual(files, {n.split(":")[0] for n in SNAPSHOTS if n.startswith("configs/")})
    self.assertEqual({p.name for p in _GOLDEN.glob("*.txt")}, {_path(n).name for n in SNAPSHOTS})


if __name__ == "__main__":
  absltest.main()
