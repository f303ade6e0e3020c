"""A model as the policy of an evaluation episode (the scripted policies and the `Policy` interface are
`c2jax.envs.scripted_policies`).

`SamplerPolicy` samples each turn from a c2jax checkpoint through the actors' sampler, with the byte tokenizer: the
conversation so far is the prompt, the sample is the turn.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import numpy as np

from c2jax.envs.coding_tasks import CodingTask


@dataclasses.dataclass
class SamplerPolicy:
  """A c2jax model as the policy of one episode (make one per episode: it keeps the episode's own turns): the
  transcript (observations and its own earlier turns) is the prompt, a sample of up to `max_new_tokens` bytes is
  the turn. The prompt keeps its last `prompt_len` tokens.

  Attributes:
    params, model: the checkpoint (`c2jax.model.checkpoint.load_checkpoint`).
    sampling: `c2jax.actors.sampling.SamplingConfig` (max_new_tokens, temperature, stop tokens).
    prompt_len: the prompt window in tokens.
    seed: sampling key; each call folds in a counter.
  """

  params: object
  model: object
  sampling: object
  prompt_len: int = 1024
  seed: int = 0
  _turns: list = dataclasses.field(default_factory=list)

  def act(self, task: CodingTask, observations: Sequence[str]) -> str:
    from c2jax.actors import sampler as sampler_lib
    from c2jax.data.byte_tokenizer import ByteTokenizer
    tok = ByteTokenizer()
    own = self._turns
    transcript = "".join(o + (own[i] if i < len(own) else "") for i, o in enumerate(observations))
    ids = tok.encode(transcript, bos=True, eos=False)[-self.prompt_len:]
    prompt = np.zeros((1, self.prompt_len), np.int32)
    prompt[0, :len(ids)] = ids
    key = jax.random.fold_in(jax.random.key(self.seed), len(own))
    out = jax.device_get(sampler_lib.generate(self.params, prompt, np.array([len(ids)], np.int32), key,
                                              cfg=self.model, sampling=self.sampling))
    n = int(out.samples.lengths[0])
    text = tok.decode(out.samples.tokens[0, len(ids):len(ids) + n])
    own.append(text)
    return text
