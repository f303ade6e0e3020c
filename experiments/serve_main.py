"""Serves a c2jax checkpoint behind an OpenAI-compatible endpoint (/v1/chat/completions with tools and streaming,
/v1/models) over the agent engine, in the model's own chat format (`c2jax.services.openai_server`).

  python experiments/serve_main.py --checkpoint=runs/ckpt --tokenizer=runs/hf_model --chat_format=kimi_k2 \\
      --port=8000 [--weights=runs/rl/weights]     # newer versions of a weight store are swapped in flight

Then any OpenAI client: `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")` (docs/usage.md). A flag with
a bad value, or a path that does not exist, is refused in one sentence (exit code 2).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from absl import app
from absl import flags

from c2jax.services import cli

_CHECKPOINT = flags.DEFINE_string("checkpoint", "", "The c2jax checkpoint to serve.")
_TOKENIZER = flags.DEFINE_string("tokenizer", "byte", '"byte", or a tokenizer.json / HF model directory.')
_CHAT_FORMAT = flags.DEFINE_string("chat_format", "brief", "brief, deepseek_v3 or kimi_k2.")
_WEIGHTS = flags.DEFINE_string("weights", "", "A weight store URL whose newer versions are served in flight.")
_POLL_S = flags.DEFINE_float("poll_s", 5.0, "Seconds between two looks at the weight store.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "The address to listen on.")
_PORT = flags.DEFINE_integer("port", 8000, "The port to listen on.")
_MODEL_NAME = flags.DEFINE_string("model_name", "c2jax", "The model name /v1/models lists.")
_SLOTS = flags.DEFINE_integer("slots", 8, "Conversations decoded at once.")
_CONTEXT = flags.DEFINE_integer("context", 4096, "Positions per slot: a conversation and its reply.")
_MAX_FORCED = flags.DEFINE_integer("max_forced", 1024, "The longest earlier assistant message, in tokens.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "The longest reply, and a request's default.")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "The sampling temperature of every slot.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "The nucleus of every slot.")
_CHUNK_STEPS = flags.DEFINE_integer("chunk_steps", 16, "Decode steps between two looks at the request queue.")
_SEED = flags.DEFINE_integer("seed", 0, "Seeds the seeds of requests that give none.")


def main(argv):
  del argv
  import uvicorn

  from c2jax.services import openai_server
  try:
    cfg = openai_server.ServeConfig(
        checkpoint=_CHECKPOINT.value, tokenizer=_TOKENIZER.value, chat_format=_CHAT_FORMAT.value,
        weights=_WEIGHTS.value, poll_s=_POLL_S.value, model_name=_MODEL_NAME.value, slots=_SLOTS.value,
        context=_CONTEXT.value, max_forced=_MAX_FORCED.value, max_tokens=_MAX_TOKENS.value,
        temperature=_TEMPERATURE.value, top_p=_TOP_P.value, chunk_steps=_CHUNK_STEPS.value, seed=_SEED.value)
  except ValueError as e:
    cli.refuse(str(e))
  with cli.refusals():
    server = openai_server.build(cfg)
  server.start()
  uvicorn.run(openai_server.make_app(server), host=_HOST.value, port=_PORT.value, log_level="info")


if __name__ == "__main__":
  app.run(main)
