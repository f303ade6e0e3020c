"""Model presets: the named architectures, overrides on top, and `checkpoint:<dir>` (a checkpoint's own)."""

import os
import tempfile

from absl.testing import absltest

from c2jax.model import presets
from c2jax.model.checkpoint import save_checkpoint
from tests import tiny


class PresetsTest(absltest.TestCase):

  def test_overrides_and_unknown_names(self):
    cfg = presets.model_config("tiny", {"n_layers": 2, "vocab_size": 259})
    self.assertEqual((cfg.n_layers, cfg.vocab_size), (2, 259))
    with self.assertRaisesRegex(ValueError, "Unknown model preset 'huge'; known: kimi_k25, small, tiny"):
      presets.model_config("huge")
    with self.assertRaisesRegex(ValueError, "model_overrides has no field .n_layerz."):
      presets.model_config("tiny", {"n_layerz": 2})

  def test_checkpoint_names_its_own_architecture(self):
    d = os.path.join(tempfile.mkdtemp(), "ckpt")
    save_checkpoint(d, tiny.params(), tiny.MODEL)
    self.assertEqual(presets.model_config(f"checkpoint:{d}"), tiny.MODEL)
    self.assertEqual(presets.load(f"checkpoint:{d}"), tiny.MODEL)
    self.assertEqual(presets.model_config(f"checkpoint:{d}", {"param_dtype": "bfloat16"}),
                     tiny.MODEL.replace(param_dtype="bfloat16"))
    with self.assertRaisesRegex(FileNotFoundError, "is not a c2jax checkpoint: model_config.json is missing"):
      presets.model_config(f"checkpoint:{os.path.dirname(d)}")
    with self.assertRaisesRegex(ValueError, "names no directory"):
      presets.model_config("checkpoint:")


if __name__ == "__main__":
  absltest.main()
