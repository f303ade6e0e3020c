"""Tiny continued-pretraining run on the Python standard library's sources (byte tokens), CPU-sized.

  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py --workdir=runs/tiny \
      --config.steps=200 --config.step.learning_rate=1e-3
  # the same on 8 fake CPU devices, FSDP x EP x CP:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/pretrain_main.py \
      --config=configs/pretrain_tiny.py --workdir=runs/tiny_mesh --config.mesh=fsdp:2,expert:2,context:2
"""

import ml_collections

from configs.model import tiny


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = ml_collections.ConfigDict()
  c.model = "tiny"  # a module under configs/model
  c.model_overrides = ml_collections.ConfigDict({"vocab_size": 259})  # byte tokenizer: 256 bytes + 3 specials
  c.seed = 0
  # Device mesh, e.g. "fsdp:2,expert:2,context:2" (c2jax.parallel.mesh); empty: one device, no mesh.
  c.mesh = ""
  c.batch_size = 8
  c.seq_len = 128
  c.steps = 60
  c.log_every = 10
  c.eval_batches = 4
  c.max_train_files = 400  # a slice of the stdlib keeps start-up fast; None reads all of it
  c.step = ml_collections.ConfigDict(dict(
      learning_rate=3e-3, warmup_steps=10, total_steps=60, final_lr_fraction=0.1, weight_decay=0.1, b1=0.9,
      b2=0.95, eps=1e-8, grad_clip=1.0, mtp_weight=0.3, z_loss_weight=1e-4, bias_update_rate=1e-3))
  c.save_checkpoint = True
  assert tiny  # the model registry is configs/model/<name>.py
  return c
