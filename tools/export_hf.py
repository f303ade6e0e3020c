"""Exports a c2jax checkpoint as an HF DeepSeek-V3 safetensors checkpoint, streaming tensor by tensor.

  python tools/export_hf.py --checkpoint=/path/to/c2jax_ckpt --out_dir=/path/to/hf_model \
      [--dtype=bfloat16] [--max_shard_size=5GB] [--tokenizer_dir=/path/to/base_model]

Writes config.json, model-0000i-of-0000n.safetensors shards and model.safetensors.index.json (as transformers'
save_pretrained does; MTP modules in the DeepSeek-V3 release layout, for vLLM's MTP drafter) and, with
--tokenizer_dir, copies the tokenizer files next to them (see c2jax.model.hf_export). The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(out_dir)`, serves with `vllm serve out_dir`, and converts back
with tools/convert_hf.py. Host memory stays around a few HF tensors (and the largest chunk the checkpoint stores).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags
from absl import logging

from c2jax.model import hf_export
from c2jax.services import cli

_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "c2jax checkpoint directory (model_config.json + params/).",
                                  required=True)
_OUT_DIR = flags.DEFINE_string("out_dir", None, "New (or empty) directory for the HF checkpoint.", required=True)
_DTYPE = flags.DEFINE_enum("dtype", hf_export.ExportDtype.BFLOAT16.value, [d.value for d in hf_export.ExportDtype],
                           "Stored dtype: bfloat16 (what servers load; half the bytes) or float32 (exact). The "
                           "router and its correction bias stay float32 either way.")
_MAX_SHARD_SIZE = flags.DEFINE_string("max_shard_size", hf_export.DEFAULT_MAX_SHARD_SIZE,
                                      "Largest shard, e.g. 5GB (10^9 bytes), 500MB, 2GiB; a larger tensor gets a "
                                      "shard of its own.")
_TOKENIZER_DIR = flags.DEFINE_string("tokenizer_dir", None, "Directory whose tokenizer files (tokenizer.json, "
                                     "tokenizer_config.json with its chat template, special_tokens_map.json, "
                                     "generation_config.json, ...) are copied next to the weights.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show a progress bar over tensors.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; use --checkpoint and --out_dir.")
  if not flags.FLAGS["verbosity"].present:  # orbax and tensorstore log at INFO; --verbosity=0 shows it
    logging.set_verbosity(logging.WARNING)
  try:
    summary = hf_export.export_checkpoint(_CHECKPOINT.value, _OUT_DIR.value, dtype=_DTYPE.value,
                                          max_shard_size=_MAX_SHARD_SIZE.value, tokenizer_dir=_TOKENIZER_DIR.value,
                                          progress=_PROGRESS.value)
  except (FileNotFoundError, FileExistsError, ValueError) as e:  # the library's one-sentence refusals
    cli.refuse(str(e))  # exit code 2, as every entry point's
  print(summary)


if __name__ == "__main__":
  app.run(main)
