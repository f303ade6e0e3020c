"""Tiny continued pretraining (report section 3): bulk code -> long-context extension -> SFT, CPU-sized.

  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py --workdir=runs/pretrain_tiny
  # one phase only, longer:
  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py --workdir=runs/bulk \
      --config.phase_order=bulk --config.phases.bulk.steps=400
  # the same on 8 fake CPU devices, FSDP x EP x CP:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/pretrain_main.py \
      --config=configs/pretrain_tiny.py --workdir=runs/tiny_mesh --config.mesh=fsdp:2,expert:2,context:2

Batch sizes are multiples of 4 so that the 8-device mesh above (batch over fsdp x expert) divides them.
The report's shape at 1/256 of its lengths: bulk at T=128 (report: 32K) with plain rope, long context at T=512
(report: 256K, 8x; here 4x) with YaRN factor 4, then SFT on chat-formatted coding-task demonstrations (loss on
the assistant's part only). MTP is trained by self-distillation in the last two phases only, as in the report.
Data: the Python standard library's own sources (train/held-out split by file), byte tokens. Every field and its
default: c2jax/services/pretrain_run_config.py.

"rl_tiny" (`--config=configs/pretrain_tiny.py:rl_tiny`): the pretraining of the main job's own model, so that one
model goes through pretraining, SFT and RL (report section 3) on one tokenizer: the architecture of
configs/rl_tiny.py's default (agentic) mode and its suite's BPE (bpe:1024:episodes of tiny_spec), one bulk phase on
the same stdlib sources at T=256. "rl_tiny_single_turn" is the same for the main job's single-turn mode
(configs/rl_tiny.py:single_turn: bpe:512 of tiny_compositions), which the perplexity-vs-reward sweep runs. Its
`models/bulk` is what `--config.sft.base_checkpoint=` of the RL job starts the SFT from (`make demo`),
and with `checkpoint.model_at` its `models/step_<N>` are the points of tools/perplexity_vs_reward.py.
"rl_tiny_copy" is "rl_tiny" with copy strings (the "copy" source: random strings each written twice) mixed into the
code, weight 0.25 against the code's 1.0; its runs against the copying probe logged at every evaluation
(`copy_ratio`, `name_ratio` in eval.jsonl, copying.png) are in docs/experiments/copying.md:

  python experiments/pretrain_main.py --config=configs/pretrain_tiny.py:rl_tiny_copy --workdir=runs/copy \
      --config.phases.bulk.sources.copy.weight=1.0 --config.phases.bulk.learning_rate=1e-3
"""

import ml_collections

from c2jax.services import pretrain_run_config


def _stdlib(split: str, **extra) -> dict:
  return {"kind": "stdlib", "split": split, "weight": 1.0, **extra}


MODES = ("byte", "rl_tiny", "rl_tiny_single_turn", "rl_tiny_copy")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  mode = arg or "byte"
  if mode not in MODES:
    raise ValueError(f"configs/pretrain_tiny.py:{mode}: the mode is one of {MODES} (default byte).")
  if mode == "byte":
    return _byte()
  c = _rl_tiny("single_turn" if mode == "rl_tiny_single_turn" else None)
  if mode == "rl_tiny_copy":
    # Copy strings mixed into the code (docs/experiments/copying.md): weight 0.25 against the code's 1.0 is a
    # fifth of the tokens.
    c.phases.bulk.sources.copy = {"kind": "copy", "weight": 0.25, "documents": 10_000, "doc_chars": 4096, "min_len": 24,
                                  "max_len": 48, "seed": 0}
  return c


def _rl_tiny(rl_mode: str | None) -> ml_collections.ConfigDict:
  """The main job's model and tokenizer (configs/rl_tiny.py in `rl_mode`), pretrained on code (the docstring)."""
  from configs import rl_tiny

  rl = rl_tiny.get_config(rl_mode)
  c = pretrain_run_config.defaults()
  c.model = rl.model
  c.model_overrides = ml_collections.ConfigDict(rl.model_overrides.to_dict())
  c.tokenizer, c.tokenizer_suite = rl.task.tokenizer, rl.task.coding_suite
  c.seed = 0
  c.mesh = ""
  c.phase_order = "bulk"
  c.phases = ml_collections.ConfigDict({"bulk": dict(
      steps=400, seq_len=256, batch_size=8, rope={}, sources={"stdlib": _stdlib("train", max_files=400)},
      learning_rate=3e-3, warmup_steps=20, decay="cosine", final_lr_fraction=0.1, mtp_weight=0.0,
      mtp_target="labels")})
  c.optim = ml_collections.ConfigDict(dict(weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8, grad_clip=1.0))
  c.step = ml_collections.ConfigDict(dict(z_loss_weight=1e-4, bias_update_rate=1e-3))
  c.eval = ml_collections.ConfigDict(dict(every=50, batches=4, batch_size=8, seq_len=256, source=_stdlib("heldout")))
  c.log_every = 10
  c.checkpoint = ml_collections.ConfigDict(dict(every=100, keep=2, model_at=()))
  return c


def _byte() -> ml_collections.ConfigDict:
  """The three-phase byte-level run (the module docstring)."""
  c = pretrain_run_config.defaults()
  c.model = "tiny"  # a preset of c2jax.model.presets
  c.model_overrides = ml_collections.ConfigDict({"vocab_size": 259})  # byte tokenizer: 256 bytes + 3 specials
  c.tokenizer = "byte"  # or the path of an HF tokenizer.json (vocab_size must cover it)
  c.seed = 0
  # Device mesh, e.g. "fsdp:2,expert:2,context:2" (c2jax.parallel.mesh); empty: one device, no mesh.
  c.mesh = ""

  c.phase_order = "bulk,long_context,sft"
  schedule = dict(decay="cosine", final_lr_fraction=0.1)
  c.phases = ml_collections.ConfigDict({
      "bulk": dict(
          steps=60, seq_len=128, batch_size=8, rope={"type": "default"},
          sources={"stdlib": _stdlib("train", max_files=400)},
          learning_rate=3e-3, warmup_steps=10, mtp_weight=0.0, mtp_target="labels", **schedule),
      "long_context": dict(
          steps=15, seq_len=512, batch_size=4,
          # YaRN from the bulk phase's 128 positions to 4x: the rope dims that rotate fastest keep their period.
          rope={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "mscale": 1.0,
                "mscale_all_dim": 1.0},
          sources={"stdlib_long": _stdlib("train", max_files=400, min_bytes=4096)},
          learning_rate=1e-3, warmup_steps=3, mtp_weight=0.3, mtp_target="self_distill", **schedule),
      "sft": dict(
          # One demonstration per row: a tiny_functions prompt (the first observation, with the brief tool format)
          # and its answer are ~0.55-0.7K bytes (~1.3-1.5K with the full format help).
          steps=15, seq_len=768, batch_size=8, rope={},
          sources={"tasks": {"kind": "sft", "suite": "tiny_functions", "split": "train", "weight": 1.0,
                             "instructions": "brief"}},
          learning_rate=1e-3, warmup_steps=3, mtp_weight=0.3, mtp_target="self_distill", **schedule),
  })
  # AdamW and the LM step's settings shared by every phase (schedules are per phase).
  c.optim = ml_collections.ConfigDict(dict(weight_decay=0.1, b1=0.9, b2=0.95, eps=1e-8, grad_clip=1.0))
  c.step = ml_collections.ConfigDict(dict(z_loss_weight=1e-4, bias_update_rate=1e-3))
  # Held-out code perplexity, on files no phase trains on, at one fixed shape so that phases compare.
  c.eval = ml_collections.ConfigDict(dict(every=15, batches=4, batch_size=8, seq_len=128,
                                          source=_stdlib("heldout")))
  c.log_every = 5
  c.checkpoint = ml_collections.ConfigDict(dict(every=30, keep=2))
  return c
