"""The suite's shared tiny model and compiled functions: tests that use the same config and shapes compile once.

  from tests import tiny
  tiny.MODEL                      # 2 layers of the tiny preset: 1 dense + 1 MoE, no MTP, float32, vocab 512
  tiny.BYTES                      # the same with the byte tokenizer's 259 tokens (the actors' and harness' tests)
  tiny.MODEL_MTP                  # 2 layers with the preset's MTP module (the sampler, decode and sharded tests)
  params = tiny.params()          # its params (seed 0), initialized once per process; copy before donating them
  f = tiny.jit(forward, cfg=tiny.MODEL, with_mtp=False)   # one jitted function per (function, static args)
  tiny.ENGINE, tiny.ENGINE_SAMPLING                # the agent engine's shapes and draw settings of every test
  lp, ids = tiny.trainer_logprobs(cfg, params, tokens)  # the trainer's forward on one sequence, one program per bucket
  tiny.random_params(cfg, seed)   # numpy draws at scales where routing and norms matter (the HF parity tests)

On 2 CPU cores a compile of the tiny model's value-and-grad costs ~15-20 s and a sampler config ~10 s, so a test
should reuse a config and a jitted function of this module before it makes its own. `tests/conftest.py` also puts
every compiled program into one persistent compilation cache for the session, which catches the same program
compiled twice through different Python functions (and by the processes the tests start).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.actors.engine import EngineConfig
from c2jax.actors.sampling import SamplingConfig
from c2jax.model import hf_convert, presets
from c2jax.model import params as params_lib
from c2jax.model.config import ModelConfig
from c2jax.model.params import Params, init_params
from c2jax.model.losses import token_log_probs
from c2jax.model.transformer import forward

MODEL: ModelConfig = presets.model_config("tiny", {"n_layers": 2, "num_mtp_layers": 0, "scan_unroll": 1})
BYTES: ModelConfig = MODEL.replace(vocab_size=259)
MODEL_MTP: ModelConfig = presets.model_config("tiny", {"n_layers": 2, "scan_unroll": 1})  # ... and one MTP module
# The agent engine (c2jax/actors/engine.py) of the tests that run BYTES through the agent loop: 4 slots of 1280
# positions, append buckets 16/64/256, forced turns up to 256 tokens; turns end at EOS (258) or ">".
ENGINE = EngineConfig(slots=4, context=1280, chunk_sizes=(16, 64, 256), max_forced=256)
ENGINE_SAMPLING = SamplingConfig(max_new_tokens=1, temperature=1.0, stop_tokens=(258, ord(">")))


@functools.cache
def _init(cfg: ModelConfig) -> Callable:
  return jax.jit(init_params, static_argnums=0)


@functools.cache
def params(cfg: ModelConfig = MODEL, seed: int = 0) -> Params:
  """The params of `cfg` from `jax.random.key(seed)`, made once per process (shared: never donate them)."""
  return _init(cfg)(cfg, jax.random.key(seed))


@functools.cache
def _jit(fn: Callable, static: tuple) -> Callable:
  return jax.jit(functools.partial(fn, **dict(static)))


def jit(fn: Callable, **static) -> Callable:
  """`jax.jit(functools.partial(fn, **static))`, one per (fn, static) in the process (static values hashable)."""
  return _jit(fn, tuple(sorted(static.items())))


@functools.cache
def _scored(cfg: ModelConfig) -> Callable:

  def score(params, tokens):
    out = forward(params, tokens[None], cfg=cfg, with_mtp=False)
    lp = token_log_probs(out.logits[0, :-1], tokens[1:])
    return jnp.concatenate([jnp.zeros((1,), jnp.float32), lp]), out.expert_ids[:, 0]

  return jax.jit(score)


def trainer_logprobs(cfg: ModelConfig, params: Params, tokens) -> tuple[np.ndarray, np.ndarray]:
  """The trainer's forward (no MTP) on one sequence of n tokens: ([n] float32 each position's log-prob of its
  token, 0 at position 0; [Lm, n, K] the routed experts of every position).

  The sequence is padded to 256, 512, 1024, ... positions, as the trainer pads its rows, so that one program serves
  every length of a bucket (a program per length costs a compile per trajectory): attention is causal and the MoE
  dropless, so the padding changes no position before it.
  """
  tokens = np.asarray(tokens, np.int32)
  n = len(tokens)
  t = 256
  while t < n:
    t *= 2
  lp, ids = _scored(cfg)(params, np.pad(tokens, (0, t - n)))
  return np.asarray(lp)[:n], np.asarray(ids)[:, :n]


def random_params(cfg: ModelConfig, seed: int = 0) -> Params:
  """Norms ~U(0.5, 1.5), router ~N(0, 0.5), biases ~N(0, 0.1), embedding ~N(0, 1), matrices ~N(0, 1/fan_in):
  scales at which routing, norms and attention matter (and the top-k choice is rarely near a tie).

  numpy, not `init_params`: jax.random would compile one kernel per leaf shape (seconds each on CPU).
  """
  rng = np.random.default_rng(seed)
  specs = params_lib.param_specs(cfg)
  fan_in = {}
  for t in hf_convert.conversion_plan(cfg).values():
    if t.n_in is not None:
      leaf = specs
      for k in t.path:
        leaf = leaf[k]
      fan_in[t.path] = math.prod(leaf.shape[len(t.index):][:t.n_in])

  def draw(path, a):
    path = tuple(k.key for k in path)
    name = path[-1]
    if "norm" in name:
      x = rng.uniform(0.5, 1.5, a.shape)
    elif name == "router":
      x = rng.normal(0.0, 0.5, a.shape)
    elif name.endswith("bias"):
      x = rng.normal(0.0, 0.1, a.shape)
    elif name == "embed":
      x = rng.normal(0.0, 1.0, a.shape)
    else:
      x = rng.normal(0.0, fan_in[path] ** -0.5, a.shape)
    return x.astype(a.dtype)

  return jax.tree_util.tree_map_with_path(draw, params_lib.abstract_params(cfg))
