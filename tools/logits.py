"""Runs a c2jax checkpoint on token ids and saves the logits (float32 [B, T, V]), e.g. for parity checks.

  python tools/logits.py --checkpoint=/path/to/c2jax_ckpt --input_ids=ids.npy --output=logits.npy

`--input_ids` is an .npy of integer token ids [B, T] (a 1-D [T] array is taken as one sequence, B = 1).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging
import jax
import numpy as np

from c2jax.model import checkpoint
from c2jax.model import transformer

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "c2jax checkpoint directory.", required=True)
_INPUT_IDS = flags.DEFINE_string("input_ids", None, ".npy of int token ids [B, T] or [T].", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "Where to write the float32 logits [B, T, V] (.npy).", required=True)
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Cast params on load; default: as stored.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}.")
  if not flags.FLAGS["verbosity"].present:  # orbax logs every array at INFO; --verbosity=0 shows it
    logging.set_verbosity(logging.WARNING)
  tokens = np.load(_INPUT_IDS.value)
  if tokens.ndim == 1:
    tokens = tokens[None]
  if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
    raise app.UsageError(f"--input_ids holds {tokens.dtype} {list(tokens.shape)}; it must be integer ids [B, T].")
  params, cfg = checkpoint.load_checkpoint(_CHECKPOINT.value, dtype=_DTYPE.value)
  if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
    raise app.UsageError(f"--input_ids has ids in [{tokens.min()}, {tokens.max()}], outside the vocabulary "
                         f"[0, {cfg.vocab_size}).")
  run = jax.jit(lambda p, t: transformer.forward(p, t, cfg=cfg, with_mtp=False).logits)
  logits = np.asarray(run(params, tokens.astype(np.int32)), np.float32)
  np.save(_OUTPUT.value, logits)
  print(f"wrote {_OUTPUT.value}: logits float32 {list(logits.shape)}")


if __name__ == "__main__":
  app.run(main)
