"""A small LM training loop: stdlib-code batches, the jitted `train_step`, logging, held-out eval, checkpoint.

This is the driver of `experiments/pretrain_main.py` on the tiny default. It logs to stdout, to TensorBoard
(`<workdir>/tb`), and to `<workdir>/metrics.jsonl`, and saves the final params as a c2jax model checkpoint
(`<workdir>/checkpoint`, readable by `tools/logits.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import pathlib
import time
from typing import Callable

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from c2jax.data.byte_tokenizer import ByteTokenizer
from c2jax.data import stdlib_corpus
from c2jax.model import losses
from c2jax.model.config import ModelConfig
from c2jax.model.transformer import forward
from c2jax.parallel.mesh import MeshConfig, make_mesh
from c2jax.model.sharding import Layout
from c2jax.parallel.train import make_trainer, with_layout
from c2jax.pretrain.step import StepConfig, init_state, train_step


def model_config_from(c: ml_collections.ConfigDict) -> ModelConfig:
  """configs/model/<c.model>.py's config with `c.model_overrides` applied."""
  try:
    module = importlib.import_module(f"configs.model.{c.model}")
  except ModuleNotFoundError as e:
    raise ValueError(f"model={c.model!r}: no configs/model/{c.model}.py; pick one of the files there.") from e
  return module.get_model_config().replace(**dict(c.model_overrides))


def eval_loss(params, cfg: ModelConfig, batches: list[np.ndarray], layout: Layout | None = None,
              put: Callable = jnp.asarray) -> float:
  """Mean next-token CE (nats/token) over held-out batches (under the mesh's `layout` when sharded)."""
  f = jax.jit(with_layout(lambda p, t: losses.next_token_loss(forward(p, t, cfg=cfg, with_mtp=False).logits, t),
                          layout))
  terms = [f(params, put(b)) for b in batches]
  return float(sum(t.sum for t in terms) / sum(t.weight for t in terms))


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
  """Trains for c.steps steps; returns the final metrics (train loss, held-out loss before and after)."""
  work = pathlib.Path(workdir)
  work.mkdir(parents=True, exist_ok=True)
  cfg = model_config_from(c)
  tok = ByteTokenizer()
  if cfg.vocab_size < tok.vocab_size:
    raise ValueError(f"vocab_size={cfg.vocab_size} < {tok.vocab_size} byte tokens: set model_overrides.vocab_size.")
  hp = StepConfig(**dict(c.step))
  rng = np.random.default_rng(c.seed)
  train = stdlib_corpus.token_stream("train", tok, max_files=c.max_train_files)
  held = stdlib_corpus.token_stream("heldout", tok)
  eval_batches = [stdlib_corpus.random_windows(held, c.batch_size, c.seq_len, np.random.default_rng(1000 + i))
                  for i in range(c.eval_batches)]
  logging.info("model: %s", cfg)
  if c.get("mesh"):
    # Sharded over a device mesh (FSDP + EP + CP): same step, traced under the mesh's layout.
    mesh_config = MeshConfig.parse(c.mesh)
    if mesh_config.num_devices > jax.device_count():
      raise ValueError(f"mesh={c.mesh!r} needs {mesh_config.num_devices} devices but only {jax.device_count()} "
                       "exist; shrink the mesh (or fake CPU devices with "
                       "XLA_FLAGS=--xla_force_host_platform_device_count=N).")
    trainer = make_trainer(cfg, hp, make_mesh(mesh_config, jax.devices()[:mesh_config.num_devices]),
                           batch_size=c.batch_size, seq_len=c.seq_len)
    state, step_fn, put = trainer.init(jax.random.key(c.seed)), trainer.step, trainer.put_batch
    layout = trainer.layout
    put_tokens = lambda tokens: trainer.put_batch({"tokens": tokens})["tokens"]
  else:
    state = init_state(cfg, hp, jax.random.key(c.seed))
    step_fn = jax.jit(functools.partial(train_step, cfg=cfg, hp=hp), donate_argnums=0)
    put = lambda batch: jax.tree.map(jnp.asarray, batch)
    layout, put_tokens = None, jnp.asarray

  try:
    from tensorboardX import SummaryWriter
    tb = SummaryWriter(str(work / "tb"))
  except ImportError:  # TensorBoard logging is optional; metrics.jsonl always has everything.
    tb = None
  before = eval_loss(state.params, cfg, eval_batches, layout, put_tokens)
  history = []
  t0 = time.perf_counter()
  with open(work / "metrics.jsonl", "w") as log, tqdm.trange(c.steps, desc="train", unit="step") as bar:
    for i in bar:
      batch = put({"tokens": stdlib_corpus.random_windows(train, c.batch_size, c.seq_len, rng)})
      state, metrics = step_fn(state, batch)
      if (i + 1) % c.log_every == 0 or i + 1 == c.steps:
        m = {k: float(v) for k, v in jax.device_get(metrics).items()}
        m["step"] = i + 1
        m["tokens_per_s"] = (i + 1) * c.batch_size * c.seq_len / (time.perf_counter() - t0)
        history.append(m)
        log.write(json.dumps(m) + "\n")
        bar.set_postfix(loss=f"{m['loss']:.3f}", ce=f"{m['ce']:.3f}")
        if tb is not None:
          for k, v in m.items():
            tb.add_scalar(f"train/{k}", v, i + 1)
  after = eval_loss(state.params, cfg, eval_batches, layout, put_tokens)
  result = {"steps": c.steps, "train_loss": history[-1]["loss"], "heldout_ce_before": before,
            "heldout_ce_after": after, "tokens_per_s": history[-1]["tokens_per_s"]}
  if tb is not None:
    tb.add_scalar("eval/heldout_ce", after, c.steps)
    tb.close()
  if c.save_checkpoint:
    from c2jax.model.checkpoint import save_checkpoint
    save_checkpoint(str(work / "checkpoint"), state.params, cfg)
    result["checkpoint"] = str(work / "checkpoint")
  (work / "result.json").write_text(json.dumps(result, indent=2))
  return result
