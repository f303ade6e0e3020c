"""The copying probe: does a model learn in-context copying (an induction circuit), and how fast?

  python tools/copy_probe.py                                     # c2jax, the main job's model, 1000 steps
  python tools/copy_probe.py --impl=hf_deepseek_v3               # transformers' DeepseekV3, the same config and
                                                                 # the same initial weights (converted)
  python tools/copy_probe.py --impl=hf_llama                     # a Llama of about the same size
  python tools/copy_probe.py --impl=jax_llama --mla_features=latent_kv   # the same Llama in JAX, plus one of MLA's
                                                                 # features (the bisection)
  python tools/copy_probe.py --model_overrides='{"qk_rope_head_dim": 32}' --results=runs/copy.jsonl
  python tools/copy_probe.py --plot=runs/copy.jsonl --png=runs/copy.png   # curves of every recorded run
  python tools/copy_probe.py --bound [--train_alphabet_size=8]   # what ideal 1-, 2- and 3-token induction
                                                                 # predictors reach, no model

Every implementation trains on the same seeded stream (`c2jax.data.copy_stream`: random strings each written
twice) with the same AdamW settings (`c2jax.optim.OptimizerConfig`, its schedule evaluated by `make_schedule` in
both frameworks), and is scored every `--eval_every` steps on one fixed held-out batch: the cross-entropy on the
first copies (ln 32 = 3.47 at best) and on the second (toward 0 once the model copies). The JSON last line holds
the curve, the last point, and the first evaluated steps at which the second-copy CE fell below 90% and 50% of the
first-copy CE (null if it never did). The runs and what they show are in docs/experiments/copying.md.

The transformers implementations need the test extras (`pip install -e .[test]`): torch and transformers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script from anywhere

from absl import app
from absl import flags
import numpy as np

from c2jax.data.copy_stream import ALPHABET, WIDE_ALPHABET, CopyStream, Part, copy_losses

IMPLS = ("c2jax", "hf_deepseek_v3", "hf_llama", "jax_llama")
# MLA's features, each of which --impl=jax_llama can add to its Llama (the bisection between a Llama and MLA).
FEATURES = ("latent_kv",  # K and V from a latent: kv_a [D, D] -> RMSNorm -> kv_b [D, N x 2H] (D: --llama's hidden)
            "decoupled_rope",  # q, k = [content H | rope H]: RoPE on the second part only, one rope key for all heads
            "no_latent_norm")  # latent_kv without the RMSNorm between kv_a and kv_b


def define_flags():
  """The command line's flags, defined only when the tool runs: a process that imports this module for its functions
  (the tests, another tool) keeps its own flags of the same names (tools/bench_model.py has several)."""
  flags.DEFINE_enum("impl", "c2jax", IMPLS, "Which implementation trains.")
  flags.DEFINE_string("model", "tiny", "c2jax model preset (c2jax.model.presets) under --model_overrides.")
  flags.DEFINE_string(
      "model_overrides", None, "JSON object of ModelConfig fields over --model; default: the main job's "
      "(configs/rl_tiny.py's model_overrides).")
  flags.DEFINE_string("extra_overrides", "{}", "JSON object of ModelConfig fields applied after "
                      "--model_overrides (an ablation of the main job's model).")
  flags.DEFINE_string("llama", '{"hidden_size": 128, "num_attention_heads": 4, "head_dim": 32, '
                      '"intermediate_size": 256}', "JSON object of LlamaConfig fields for --impl=hf_llama "
                      "(its depth and vocabulary are the c2jax config's).")
  flags.DEFINE_list("mla_features", [], f"For --impl=jax_llama: MLA features added to its Llama, of "
                    f"{FEATURES}.")
  flags.DEFINE_float("latent_std", None, "For --impl=jax_llama with latent_kv: the init std of kv_a "
                     "(default: initializer_range).")
  flags.DEFINE_enum(
      "init", "c2jax", ("c2jax", "hf"), "The initial weights of c2jax and hf_deepseek_v3: c2jax's `init_params` (both "
      "start from the same draw), or the scheme of transformers' DeepseekV3 (std initializer_range everywhere: "
      "transformers' own init, and c2jax's draw with its latent columns rescaled to it).")
  flags.DEFINE_integer("steps", 1000, "Training steps.")
  flags.DEFINE_integer("eval_every", 50, "Steps between evaluations (and at the first and last).")
  flags.DEFINE_integer("batch_size", 16, "Rows per step.")
  flags.DEFINE_integer("seq_len", 256, "Tokens per row.")
  flags.DEFINE_integer("train_alphabet_size", 32, "Symbols of the training stream's strings "
                       "(`CopyStream.alphabet_size`, 2-222); the held-out batch stays the 32-symbol probe, and a "
                       "second one in the training alphabet is scored beside it (own_first, own_second).")
  flags.DEFINE_integer("eval_rows", 32, "Rows of the held-out batch.")
  flags.DEFINE_float("learning_rate", 3e-3, "Peak learning rate.")
  flags.DEFINE_integer("warmup_steps", 20, "Linear warmup steps.")
  flags.DEFINE_string("lr_multipliers", "{}", "JSON object {pattern: multiplier}: parameters whose path fully "
                      "matches the pattern train at multiplier x the rate (c2jax.optim.OptimizerConfig.lr_multipliers; "
                      "c2jax and jax_llama), e.g. '{\"(dense|moe)_layers/attn/(q_a|kv_a)\": 0.3}'.")
  flags.DEFINE_integer("schedule_steps", 1500, "Steps of the warmup + cosine schedule (to 0.1x).")
  flags.DEFINE_float("weight_decay", 0.1, "AdamW weight decay.")
  flags.DEFINE_float("bias_update_rate", None, "c2jax's balancing-bias rate (default: the pretraining "
                     "step's); transformers' DeepseekV3 has no balancing rule.")
  flags.DEFINE_integer("seed", 0, "Seed of the initial weights and of the training stream.")
  flags.DEFINE_integer("eval_seed", 12345, "Seed of the held-out batch.")
  flags.DEFINE_string("label", None, "Name of the run in --results and plots (default: the implementation).")
  flags.DEFINE_string("results", None, "A JSONL file the result line is appended to.")
  flags.DEFINE_string("plot", None, "Plot the runs of this JSONL results file instead of training.")
  flags.DEFINE_bool("bound", False, "Print the ratio an ideal 1-, 2- and 3-token induction predictor reaches on the "
                    "held-out batch of --train_alphabet_size symbols (`induction_bound`) instead of training.")
  flags.DEFINE_string("png", None, "Where --plot writes its figure (default: next to the results, .png).")


# ------------------------------------------------------------------------------------------------- configuration
@dataclasses.dataclass(frozen=True)
class ProbeSettings:
  """One probe run's training and scoring settings (the flags of the same names)."""

  steps: int = 1000
  eval_every: int = 50
  batch_size: int = 16
  seq_len: int = 256
  train_alphabet_size: int = 32  # the training stream's; the held-out probe's is always 32
  eval_rows: int = 32
  learning_rate: float = 3e-3
  warmup_steps: int = 20
  lr_multipliers: tuple[tuple[str, float], ...] = ()  # c2jax and jax_llama only
  schedule_steps: int = 1500
  weight_decay: float = 0.1
  bias_update_rate: float | None = None  # None: the pretraining step's default
  seed: int = 0
  eval_seed: int = 12345
  llama: tuple[tuple[str, Any], ...] = (("hidden_size", 128), ("num_attention_heads", 4), ("head_dim", 32),
                                        ("intermediate_size", 256))
  init: str = "c2jax"  # --init
  mla_features: tuple[str, ...] = ()  # --impl=jax_llama only
  latent_std: float | None = None  # --impl=jax_llama only


def model_config(preset: str = "tiny", overrides: dict | None = None, extra: dict | None = None):
  """The c2jax ModelConfig under test: `preset`, then `overrides` (None: the main job's, configs/rl_tiny.py's
  model_overrides), then `extra`; never an MTP module (the probe trains next-token prediction only)."""
  from c2jax.model.presets import model_config as named
  if overrides is None:
    from configs import rl_tiny
    overrides = rl_tiny.get_config().model_overrides.to_dict()
  return named(preset, {**overrides, "num_mtp_layers": 0, **(extra or {})}, "--model_overrides")


def optimizer_config(s: ProbeSettings):
  from c2jax.optim import OptimizerConfig
  return OptimizerConfig(learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, total_steps=s.schedule_steps,
                         final_lr_fraction=0.1, weight_decay=s.weight_decay, b1=0.9, b2=0.95, eps=1e-8, grad_clip=1.0,
                         lr_multipliers=s.lr_multipliers)


def step_config(s: ProbeSettings):
  from c2jax.pretrain.step import StepConfig
  rate = StepConfig().bias_update_rate if s.bias_update_rate is None else s.bias_update_rate
  return StepConfig(optim=optimizer_config(s), mtp_weight=0.0, z_loss_weight=0.0, bias_update_rate=rate)


# A trainer: (rows) -> None trains one step; evaluate(tokens [B, T]) -> token CE [B, T-1].
Trainer = tuple[Callable[[np.ndarray], None], Callable[[np.ndarray], np.ndarray], int]


def hf_scheme(params, cfg):
  """c2jax's initial draw with every RMS-normed latent column (`ParamSpec.normed_outputs`, drawn at std
  1/sqrt(fan_in) by `params._std`) rescaled to std initializer_range: the init scheme of transformers' DeepseekV3
  (and c2jax's before the copying fix)."""
  import jax
  from c2jax.model.params import ParamSpec, param_specs

  def rescale(spec: ParamSpec, w):
    if not spec.normed_outputs:
      return w
    return w.at[..., :spec.normed_outputs].multiply(cfg.initializer_range * spec.shape[-2] ** 0.5)

  return jax.tree.map(rescale, param_specs(cfg), params, is_leaf=lambda x: isinstance(x, ParamSpec))


def c2jax_trainer(cfg, s: ProbeSettings) -> Trainer:
  """`c2jax.pretrain.step.train_step` (AdamW, the balancing-bias rule) and `transformer.forward`."""
  import jax
  import jax.numpy as jnp
  from c2jax.model import transformer
  from c2jax.model.params import init_params, trainable_mask
  from c2jax.pretrain import step as step_lib
  hp = step_config(s)
  params = init_params(cfg, jax.random.key(s.seed))
  if s.init == "hf":
    params = hf_scheme(params, cfg)
  state = step_lib.init_state(cfg, hp, jax.random.key(s.seed), params)
  train = jax.jit(lambda s, b: step_lib.train_step(s, b, cfg=cfg, hp=hp)[0], donate_argnums=0)

  @jax.jit
  def token_ce(params, tokens):
    logits = transformer.forward(params, tokens, cfg=cfg, with_mtp=False).logits[:, :-1]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1)[..., 0]

  def step(tokens):
    nonlocal state
    state = train(state, {"tokens": jnp.asarray(tokens)})

  # Trained parameters, as torch counts them (the balancing biases are buffers there, moved by no gradient).
  trained = sum(a.size for a, t in zip(jax.tree.leaves(state.params), jax.tree.leaves(trainable_mask(state.params)))
                if t)
  return step, lambda tokens: np.asarray(token_ce(state.params, jnp.asarray(tokens))), trained


def _torch_trainer(model, s: ProbeSettings) -> Trainer:
  """torch.optim.AdamW with c2jax's schedule (`make_schedule`, read per step) and global-norm clipping."""
  import torch
  from c2jax.optim import make_schedule
  torch.manual_seed(s.seed)
  opt_cfg = optimizer_config(s)
  schedule = make_schedule(opt_cfg)
  params = [p for p in model.parameters() if p.requires_grad]
  opt = torch.optim.AdamW(params, lr=0.0, betas=(opt_cfg.b1, opt_cfg.b2), eps=opt_cfg.eps,
                          weight_decay=opt_cfg.weight_decay)
  count = 0

  def token_ce(tokens: np.ndarray):
    t = torch.as_tensor(tokens, dtype=torch.long)
    logits = model(t).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), t[:, 1:].reshape(-1),
                                             reduction="none").reshape(t.shape[0], -1)

  def step(tokens):
    nonlocal count
    model.train()
    for group in opt.param_groups:
      group["lr"] = float(schedule(count))
    loss = token_ce(tokens).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, opt_cfg.grad_clip)
    opt.step()
    count += 1

  def evaluate(tokens):
    model.eval()
    with torch.no_grad():
      return token_ce(tokens).numpy()

  return step, evaluate, sum(p.numel() for p in params)


def hf_deepseek_v3_trainer(cfg, s: ProbeSettings) -> Trainer:
  """transformers' DeepseekV3ForCausalLM of `cfg` (`to_hf_dict`), starting from c2jax's initial weights at `seed`
  (exported with `hf_export.export_params`), so both frameworks start from the same point; or, with --init=hf, from
  transformers' own init."""
  import jax
  import torch
  import transformers
  from c2jax.model import hf_export
  from c2jax.model.params import init_params
  if s.init == "hf":
    torch.manual_seed(s.seed)
    return _torch_trainer(transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**cfg.to_hf_dict())), s)
  with tempfile.TemporaryDirectory() as tmp:
    hf_export.export_params(init_params(cfg, jax.random.key(s.seed)), cfg, tmp, dtype="float32")
    model = transformers.DeepseekV3ForCausalLM.from_pretrained(tmp, dtype=torch.float32)
  return _torch_trainer(model, s)


def hf_llama_trainer(cfg, s: ProbeSettings) -> Trainer:
  """transformers' LlamaForCausalLM (--llama's fields, the c2jax config's depth and vocabulary), HF's own init."""
  import torch
  import transformers
  fields = {"vocab_size": cfg.vocab_size, "num_hidden_layers": cfg.n_layers, "tie_word_embeddings": False,
            "max_position_embeddings": max(s.seq_len, 512), "initializer_range": cfg.initializer_range,
            **dict(s.llama)}
  fields.setdefault("num_key_value_heads", fields.get("num_attention_heads"))
  torch.manual_seed(s.seed)
  return _torch_trainer(transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields)).float(), s)


def jax_llama_trainer(cfg, s: ProbeSettings) -> Trainer:
  """A Llama written in JAX (--llama's sizes, RoPE theta 1e4 on all head dims, untied head, std initializer_range),
  trained by `c2jax.optim.make_optimizer`, with `s.mla_features` of MLA added: one difference at a time between the
  Llama and c2jax's attention, for the bisection in docs/experiments/copying.md."""
  import jax
  import jax.numpy as jnp
  import optax
  from c2jax.model.norms import rms_norm
  from c2jax.optim import make_optimizer
  unknown = set(s.mla_features) - set(FEATURES)
  if unknown:
    raise ValueError(f"--mla_features names {sorted(unknown)}; choose from {FEATURES}.")
  feats = set(s.mla_features)
  llama = dict(s.llama)
  d, n, h, f = llama["hidden_size"], llama["num_attention_heads"], llama["head_dim"], llama["intermediate_size"]
  r = h if "decoupled_rope" in feats else 0  # rope dims beside the h content dims
  latent = "latent_kv" in feats or "no_latent_norm" in feats
  std = cfg.initializer_range
  keys = iter(jax.random.split(jax.random.key(s.seed), 16 * cfg.n_layers + 4))

  def normal(shape, scale=std):
    return scale * jax.random.normal(next(keys), shape)

  def layer():
    p = {"attn_norm": jnp.ones(d), "q": normal((d, n * (h + r))), "o": normal((n * h, d)), "mlp_norm": jnp.ones(d),
         "gate": normal((d, f)), "up": normal((d, f)), "down": normal((f, d))}
    if latent:
      p.update(kv_a=normal((d, d)) * ((s.latent_std or std) / std), kv_a_norm=jnp.ones(d), kv_b=normal((d, n * 2 * h)))
    else:
      p.update(k=normal((d, n * h)), v=normal((d, n * h)))
    if r:
      p["k_rope"] = normal((d, r))
    return p

  params = {"embed": normal((cfg.vocab_size, d)), "layers": [layer() for _ in range(cfg.n_layers)],
            "final_norm": jnp.ones(d), "lm_head": normal((d, cfg.vocab_size))}

  def rope(x, positions):  # x [B, T, ..., R], HALVES pairs
    inv = 1.0 / (10000.0 ** (np.arange(0, x.shape[-1], 2) / x.shape[-1]))
    angles = (positions[:, None] * inv).reshape((1, x.shape[1]) + (1,) * (x.ndim - 3) + (-1,))
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * jnp.cos(angles) - x2 * jnp.sin(angles), x2 * jnp.cos(angles) + x1 * jnp.sin(angles)],
                           -1)

  def token_ce(p, tokens):
    b, t = tokens.shape
    positions = jnp.arange(t, dtype=jnp.float32)
    causal = jnp.tril(jnp.ones((t, t), bool))
    x = p["embed"][tokens]
    for lp in p["layers"]:
      y = rms_norm(x, lp["attn_norm"], 1e-6)
      q = (y @ lp["q"]).reshape(b, t, n, h + r)
      if latent:
        c = y @ lp["kv_a"]
        c = c * lp["kv_a_norm"] if "no_latent_norm" in feats else rms_norm(c, lp["kv_a_norm"], 1e-6)
        k, v = jnp.split((c @ lp["kv_b"]).reshape(b, t, n, 2 * h), 2, axis=-1)
      else:
        k, v = (y @ lp["k"]).reshape(b, t, n, h), (y @ lp["v"]).reshape(b, t, n, h)
      if r:
        k_rope = jnp.broadcast_to(rope(y @ lp["k_rope"], positions)[:, :, None], (b, t, n, r))
        q = jnp.concatenate([q[..., :h], rope(q[..., h:], positions)], -1)
        k = jnp.concatenate([k, k_rope], -1)
      else:
        q, k = rope(q, positions), rope(k, positions)
      scores = jnp.where(causal, jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(h + r), -1e30)
      x = x + jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, -1), v).reshape(b, t, n * h) @ lp["o"]
      y = rms_norm(x, lp["mlp_norm"], 1e-6)
      x = x + (jax.nn.silu(y @ lp["gate"]) * (y @ lp["up"])) @ lp["down"]
    logits = rms_norm(x, p["final_norm"], 1e-6) @ p["lm_head"]
    return -jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], -1)[..., 0]

  tx = make_optimizer(optimizer_config(s))
  state = (params, tx.init(params))

  @jax.jit
  def train(state, tokens):
    p, opt = state
    grads = jax.grad(lambda p: token_ce(p, tokens).mean())(p)
    updates, opt = tx.update(grads, opt, p)
    return optax.apply_updates(p, updates), opt

  def step(tokens):
    nonlocal state
    state = train(state, jnp.asarray(tokens))

  evaluate = jax.jit(token_ce)
  return (step, lambda tokens: np.asarray(evaluate(state[0], jnp.asarray(tokens))),
          sum(a.size for a in jax.tree.leaves(params)))


TRAINERS = {"c2jax": c2jax_trainer, "hf_deepseek_v3": hf_deepseek_v3_trainer, "hf_llama": hf_llama_trainer,
            "jax_llama": jax_llama_trainer}


# ------------------------------------------------------------------------------------------------------ scoring
def induction_bound(rows, match: int = 1, alphabet_size: int = 32, smoothing: float = 0.02) -> float:
  """Second / first copy CE of an ideal `match`-token induction predictor on `rows` (a `CopyRows`): each
  second-copy token is predicted as the tokens that followed the earlier occurrences of its `match` preceding
  tokens in the row (uniform over those occurrences, all earlier strings included), mixed with `smoothing` of the
  uniform over the alphabet; a first copy costs ln(alphabet_size). What a circuit that matches one token (an
  induction head) or `match` tokens can reach on the probe, without a model."""
  ce = []
  for tokens, part in zip(np.asarray(rows.tokens), np.asarray(rows.part)):
    for j in np.flatnonzero(part == Part.SECOND):
      key = tuple(tokens[j - match:j])
      nexts = [tokens[i + match] for i in range(j - match) if tuple(tokens[i:i + match]) == key]
      p = smoothing / alphabet_size + (1 - smoothing) * (nexts.count(tokens[j]) / len(nexts) if nexts
                                                        else 1 / alphabet_size)
      ce.append(-np.log(p))
  return float(np.mean(ce) / np.log(alphabet_size))


def first_below(curve: list[dict[str, Any]], fraction: float) -> int | None:
  """The first evaluated step whose second-copy CE is below `fraction` x its first-copy CE, or None."""
  return next((p["step"] for p in curve if p["second"] < fraction * p["first"]), None)


def run_probe(impl: str, cfg, s: ProbeSettings, progress: Callable[[dict], None] = lambda point: None
              ) -> dict[str, Any]:
  """Trains `impl` for `s.steps` steps on the seeded copy stream; returns the result dict (see the module doc)."""
  step, evaluate, n_params = TRAINERS[impl](cfg, s)
  eval_rows = CopyStream(seed=s.eval_seed, seq_len=s.seq_len).batch(s.eval_rows)
  stream = CopyStream(seed=s.seed, seq_len=s.seq_len, alphabet_size=s.train_alphabet_size)
  own_rows = (None if s.train_alphabet_size == len(ALPHABET) else
              CopyStream(seed=s.eval_seed, seq_len=s.seq_len, alphabet_size=s.train_alphabet_size).batch(s.eval_rows))
  curve: list[dict[str, Any]] = []
  start = time.monotonic()
  for i in range(s.steps + 1):
    if i % s.eval_every == 0 or i == s.steps:
      first, second = copy_losses(evaluate(eval_rows.tokens), eval_rows.part)
      curve.append({"step": i, "first": round(first, 4), "second": round(second, 4),
                    "seconds": round(time.monotonic() - start, 1)})
      if own_rows is not None:  # the same copying on held-out strings of the training alphabet
        own_first, own_second = copy_losses(evaluate(own_rows.tokens), own_rows.part)
        curve[-1].update(own_first=round(own_first, 4), own_second=round(own_second, 4))
      progress(curve[-1])
    if i < s.steps:
      step(stream.batch(s.batch_size).tokens)
  last = curve[-1]
  return {"impl": impl, "params": int(n_params), "steps": s.steps, "first": last["first"], "second": last["second"],
          "ratio": round(last["second"] / last["first"], 4), "below_90": first_below(curve, 0.9),
          "below_50": first_below(curve, 0.5), "seconds": last["seconds"], "curve": curve}


def plot(results_file: str, png: str) -> str:
  """Second- over first-copy CE against steps for every run in `results_file`; returns the PNG's path."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  runs = [json.loads(line) for line in pathlib.Path(results_file).read_text().splitlines() if line.strip()]
  if not runs:
    raise ValueError(f"{results_file} holds no runs.")
  fig, ax = plt.subplots(figsize=(8, 5))
  for run in runs:
    ax.plot([p["step"] for p in run["curve"]], [p["second"] / p["first"] for p in run["curve"]],
            label=run.get("label", run["impl"]))
  ax.axhline(0.9, color="grey", lw=0.5, ls="--")
  ax.axhline(0.5, color="grey", lw=0.5, ls="--")
  ax.set_xlabel("step")
  ax.set_ylabel("second-copy CE / first-copy CE")
  ax.set_title("In-context copying on the copy stream (lower: copies)")
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(png, dpi=120)
  return png


FLAGS = flags.FLAGS


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}.")
  if FLAGS.plot:
    png = plot(FLAGS.plot, FLAGS.png or os.path.splitext(FLAGS.plot)[0] + ".png")
    print(json.dumps({"png": png}))
    return
  if not 2 <= FLAGS.train_alphabet_size <= len(WIDE_ALPHABET):
    raise app.UsageError(f"--train_alphabet_size={FLAGS.train_alphabet_size} must be in [2, {len(WIDE_ALPHABET)}].")
  if FLAGS.steps < 1 or FLAGS.eval_every < 1 or FLAGS.batch_size < 1 or FLAGS.eval_rows < 1:
    raise app.UsageError("--steps, --eval_every, --batch_size and --eval_rows must be >= 1.")
  if FLAGS.bound:
    size = FLAGS.train_alphabet_size
    rows = CopyStream(seed=FLAGS.eval_seed, seq_len=FLAGS.seq_len, alphabet_size=size).batch(FLAGS.eval_rows)
    print(json.dumps({f"match_{k}": round(induction_bound(rows, k, size), 4) for k in (1, 2, 3)}))
    return
  settings = ProbeSettings(
      steps=FLAGS.steps, eval_every=FLAGS.eval_every, batch_size=FLAGS.batch_size, seq_len=FLAGS.seq_len,
      train_alphabet_size=FLAGS.train_alphabet_size, eval_rows=FLAGS.eval_rows, learning_rate=FLAGS.learning_rate,
      warmup_steps=FLAGS.warmup_steps,
      lr_multipliers=tuple(json.loads(FLAGS.lr_multipliers).items()), schedule_steps=FLAGS.schedule_steps,
      weight_decay=FLAGS.weight_decay, bias_update_rate=FLAGS.bias_update_rate,
      seed=FLAGS.seed, eval_seed=FLAGS.eval_seed, llama=tuple(json.loads(FLAGS.llama).items()),
      mla_features=tuple(FLAGS.mla_features), latent_std=FLAGS.latent_std, init=FLAGS.init)
  overrides = None if FLAGS.model_overrides is None else json.loads(FLAGS.model_overrides)
  cfg = model_config(FLAGS.model, overrides, json.loads(FLAGS.extra_overrides))
  if cfg.vocab_size < 256:
    raise app.UsageError(f"vocab_size={cfg.vocab_size}: the copy stream speaks bytes; use a vocabulary >= 256.")
  if settings.lr_multipliers and FLAGS.impl not in ("c2jax", "jax_llama"):
    raise app.UsageError(f"--lr_multipliers is for --impl=c2jax or jax_llama (c2jax's optimizer), not {FLAGS.impl}.")
  if FLAGS.impl != "c2jax":
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
  print(f"{FLAGS.impl}: {settings.steps} steps of {settings.batch_size} x {settings.seq_len}; step first-copy-CE "
        "second-copy-CE seconds", flush=True)
  result = run_probe(FLAGS.impl, cfg, settings, lambda p: print(
      f"  {p['step']:5d} {p['first']:.3f} {p['second']:.3f} {p['seconds']:.0f}s"
      + (f"   training alphabet: {p['own_first']:.3f} {p['own_second']:.3f}" if "own_first" in p else ""), flush=True))
  result.update(label=FLAGS.label or FLAGS.impl, settings=dataclasses.asdict(settings), model=FLAGS.model,
                model_overrides=overrides, extra_overrides=json.loads(FLAGS.extra_overrides),
                load_average=round(os.getloadavg()[0], 2))
  line = json.dumps(result)
  if FLAGS.results:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.results)), exist_ok=True)
    with open(FLAGS.results, "a", encoding="utf-8") as f:
      f.write(line + "\n")
  print(line)


if __name__ == "__main__":
  define_flags()
  app.run(main)
