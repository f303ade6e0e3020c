"""Converts an HF DeepSeek-V3 / Kimi-K2 safetensors checkpoint into a c2jax checkpoint, streaming tensor by tensor.

  python tools/convert_hf.py --hf_dir=/path/to/DeepSeek-V3 --out_dir=/path/to/c2jax_ckpt [--dtype=bfloat16]

Reads config.json (and quantization_config for block-FP8 weights), converts every tensor into the c2jax layout and
writes an orbax checkpoint plus model_config.json (see c2jax.model.hf_convert and c2jax.model.checkpoint). Host
memory stays around a few HF tensors whatever the model size. Load the result with
`c2jax.model.checkpoint.load_checkpoint(out_dir)`.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging

from c2jax.model import hf_convert
from c2jax.services import cli

_HF_DIR = flags.DEFINE_string("hf_dir", None, "HF checkpoint directory (config.json + *.safetensors).",
                              required=True)
_OUT_DIR = flags.DEFINE_string("out_dir", None, "New directory for the c2jax checkpoint.", required=True)
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                           "Stored param dtype (router stays float32). Default: the checkpoint's dtype when it is "
                           "float32 or bfloat16, else float32.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar over tensors.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; use --hf_dir and --out_dir.")
  if not flags.FLAGS["verbosity"].present:  # orbax logs every array at INFO; --verbosity=0 shows it
    logging.set_verbosity(logging.WARNING)
  with cli.refusals():  # a --hf_dir that is not a checkpoint, an --out_dir that holds one: one sentence, exit 2
    summary = hf_convert.convert_hf_checkpoint(_HF_DIR.value, _OUT_DIR.value, dtype=_DTYPE.value,
                                               progress=_PROGRESS.value)
  print(summary)


if __name__ == "__main__":
  app.run(main)
