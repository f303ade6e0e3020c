"""ModelConfig.platform: the model's backend choices follow it (or the devices the program runs on), and checkpoints
do not store it."""

import json
import os
import shutil
import tempfile

from absl.testing import absltest
import jax

from c2jax.model import checkpoint
from c2jax.model import config as config_lib
from c2jax.model import moe
from c2jax.model.config import MoeDispatch
from pallas_kernels.target import Platform
from tests import tiny
from tests.pallas_kernels.target_test import abstract_mesh


class PlatformTest(absltest.TestCase):

  def test_model_dispatch_follows_the_platform(self):
    self.assertIs(moe.resolve_dispatch(MoeDispatch.AUTO, Platform.CPU), MoeDispatch.TILES)
    self.assertIs(moe.resolve_dispatch(MoeDispatch.AUTO, Platform.GPU), MoeDispatch.RAGGED)
    self.assertIs(moe.resolve_dispatch(MoeDispatch.SLOTS, Platform.GPU), MoeDispatch.SLOTS)
    self.assertIs(moe.platform_of(tiny.MODEL.replace(platform=Platform.TPU)), Platform.TPU)
    with jax.sharding.use_abstract_mesh(abstract_mesh("gpu")):
      self.assertIs(moe.platform_of(tiny.MODEL), Platform.GPU)

  def test_checkpoints_do_not_store_the_platform(self):
    cfg = tiny.MODEL.replace(platform=Platform.GPU)
    saved = config_lib.config_to_json_dict(cfg)
    self.assertNotIn("platform", saved)
    self.assertIs(config_lib.config_from_json_dict(saved).platform, Platform.AUTO)
    with self.assertRaisesRegex(ValueError, r"^a model config file names a platform \('gpu'\); where a program runs "
                                "is not part of a checkpoint"):
      config_lib.config_from_json_dict({**saved, "platform": "gpu"})  # a foreign file must not pick the program
    # Through the checkpoint loader, with a model_config.json that names one.
    directory = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
    with open(os.path.join(directory, checkpoint.CONFIG_FILE), "w") as f:
      json.dump({**saved, "platform": "tpu"}, f)
    with self.assertRaisesRegex(ValueError, "names a platform \\('tpu'\\)"):
      checkpoint.read_config(directory)
    with open(os.path.join(directory, checkpoint.CONFIG_FILE), "w") as f:
      json.dump(saved, f)
    self.assertIs(checkpoint.read_config(directory).platform, Platform.AUTO)



if __name__ == "__main__":
  absltest.main()
