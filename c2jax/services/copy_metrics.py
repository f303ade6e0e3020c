"""The copying probe as a pretraining metric: does the model copy what its context holds, at each evaluation?

  probe = CopyProbe.build(tok, heldout_source, seq_len=256, rows=8)
  record = probe.evaluate(params, model)            # {"copy_first_ce", "copy_second_ce", "copy_ratio", ...}
  plot(eval_records, "copying.png")                # both ratios against step, beside perplexity.png

Two fixed held-out batches in the run's own tokenizer, one forward each (the held-out perplexity's compiled program):
  * copy strings (`c2jax.data.copy_stream`, seed 12345: random strings each written twice): the mean CE of the
    second copies' tokens against the first copies'; `copy_ratio` = second / first, ~1 without an induction circuit,
    toward 0 with one (docs/experiments/copying.md: the probe passes at <= 0.5);
  * names in held-out code (`c2jax.data.name_reuse`): the CE of the tokens of a name's later uses in the document
    against those of first uses; `name_ratio` = later / first. Only a text source has them: a source of token
    documents (an SFT's recorded episodes, `token_docs`) has no text to find names in, so its runs log the copy
    strings' figures alone.
The strings' lengths follow the row length (24-48 symbols at T >= 256, shorter rows shorter strings) so that a row
holds whole pairs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from c2jax.data import sources as sources_lib
from c2jax.data.copy_stream import CopyStream, Part
from c2jax.data.name_reuse import NamePart, name_rows
from c2jax.data.tokenizer import Tokenizer
from c2jax.model import losses
from c2jax.model.config import ModelConfig
from c2jax.model.sharding import Layout, with_layout
from c2jax.model.transformer import forward
from c2jax.pretrain.step import document_mask

EVAL_SEED = 12345  # the held-out strings' generator (tools/copy_probe.py's held-out batch)
KEYS = ("copy_first_ce", "copy_second_ce", "copy_ratio", "name_first_ce", "name_later_ce", "name_ratio")


@functools.lru_cache(maxsize=8)
def token_ce_fn(model: ModelConfig, layout: Layout | None):
  """jit of (params, batch {tokens, positions, segment_ids, loss_mask} [B, T]) -> (token CE [B, T-1] nats, weight
  [B, T-1] of each target: `document_mask`). The held-out perplexity (`pretrain_loop.heldout_ce`) and both probe
  batches, which have the evaluation batches' keys and shape, run this one compiled program."""
  def token_ce(params, batch):
    tokens = batch["tokens"]
    out = forward(params, tokens, cfg=model, positions=batch["positions"], segment_ids=batch["segment_ids"],
                  with_mtp=False)
    return -losses.token_log_probs(out.logits[:, :-1], tokens[:, 1:]), document_mask(batch)[:, 1:]
  return jax.jit(with_layout(token_ce, layout))


def _batch(tokens: np.ndarray) -> dict[str, np.ndarray]:
  """Whole rows of one document each, in the evaluation batches' format (c2jax/data/packing.py)."""
  b, t = tokens.shape
  return {"tokens": tokens.astype(np.int32), "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
          "segment_ids": np.ones((b, t), np.int32), "loss_mask": np.ones((b, t), np.float32)}


def _mean(ce: np.ndarray, part: np.ndarray, which: int) -> float:
  sel = part[:, 1:] == which
  return float(ce[sel].mean()) if sel.any() else float("nan")


@dataclasses.dataclass(frozen=True)
class CopyProbe:
  """The two held-out batches: copy_tokens / copy_part [B, T] (`Part`), name_tokens / name_part [B, T] (`NamePart`;
  None when the held-out source holds token documents, not text)."""

  copy_tokens: np.ndarray
  copy_part: np.ndarray
  name_tokens: np.ndarray | None
  name_part: np.ndarray | None

  @classmethod
  def build(cls, tokenizer: Tokenizer, code_source: Mapping, *, seq_len: int, rows: int) -> CopyProbe:
    """Both batches: `rows` rows of T = seq_len tokens; the code rows from the first documents of `code_source`
    (a held-out source, in its fixed order) that fill a row."""
    max_len = min(48, (seq_len - 2) // 4)
    copies = CopyStream(seed=EVAL_SEED, seq_len=seq_len, min_len=min(24, max(2, max_len // 2)), max_len=max_len,
                        tokenizer=tokenizer).batch(rows)
    docs = sources_lib.open_source(code_source)
    if len(docs) and isinstance(docs[0], sources_lib.TokenDocument):  # no text to find names in (module docstring)
      return cls(copies.tokens, copies.part, None, None)
    names = name_rows((docs[i] for i in range(len(docs))), tokenizer, seq_len=seq_len, n_rows=rows)
    return cls(copies.tokens, copies.part, names.tokens, names.part)

  def evaluate(self, params, model: ModelConfig, layout: Layout | None = None,
               put: Callable = lambda b: jax.tree.map(jnp.asarray, b)) -> dict[str, float]:
    """The probe's figures (`KEYS`; the copy strings' three alone without a names batch): mean CE (nats/token) of
    each part and the ratios."""
    f = token_ce_fn(model, layout)
    copy_ce = np.asarray(jax.device_get(f(params, put(_batch(self.copy_tokens)))[0]), np.float64)
    first, second = _mean(copy_ce, self.copy_part, Part.FIRST), _mean(copy_ce, self.copy_part, Part.SECOND)
    out = {"copy_first_ce": first, "copy_second_ce": second, "copy_ratio": second / first}
    if self.name_tokens is None:
      return out
    name_ce = np.asarray(jax.device_get(f(params, put(_batch(self.name_tokens)))[0]), np.float64)
    new, later = _mean(name_ce, self.name_part, NamePart.FIRST), _mean(name_ce, self.name_part, NamePart.LATER)
    return {**out, "name_first_ce": new, "name_later_ce": later, "name_ratio": later / new}


def plot(records: Sequence[dict], path: str) -> None:
  """PNG of the two ratios (copy strings, names in code) against step, with the probe's pass line at 0.5."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  records = [r for r in records if "copy_ratio" in r]
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  steps = [r["step"] for r in records]
  ax.plot(steps, [r["copy_ratio"] for r in records], "o-", ms=4, label="copy strings: second / first copy CE")
  if all("name_ratio" in r for r in records):  # a token-document source has no names batch
    ax.plot(steps, [r["name_ratio"] for r in records], "s-", ms=4, label="names in code: later / first use CE")
  ax.axhline(0.5, color="k", ls="--", lw=1, label="the probe's pass line (0.5)")
  ax.set_xlabel("step")
  ax.set_ylabel("CE ratio")
  ax.set_ylim(0, max(1.2, *(r["copy_ratio"] for r in records)) if records else 1.2)
  ax.set_title("In-context copying during pretraining (held-out)")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
