"""Multi-turn RL with self-summaries on the long-horizon suite (report section 4: when the context fills, the model
summarizes its work so far and continues from the summary; the episode's reward trains every segment).

  python experiments/rl_main.py --config=configs/rl_long_horizon.py --workdir=runs/long_horizon
  python tools/sweep.py --config=configs/rl_long_horizon.py --sweep=configs/sweeps/self_summary.py

The tasks are tiny_long_horizon (c2jax/envs/suites/long_horizon.py): `def f(x)` applies K steps, each stated in its
own notes/step_i.txt among lines of filler; the prompt names only the files. A whole episode (read K files, write,
finish) does not fit the slot's `actors.context`, so the engine asks for a summary when a segment reaches
`actors.summary.trigger_tokens` (or its next observation would not fit) and continues the episode from it in a new
segment (c2jax/actors/agent_loop.py). Tokens are bytes (259, the suite's BPE never sees the notes). Everything
else is configs/rl_tiny.py's recipe; the trainer's batch holds a row per segment (groups_per_step x group_size x
max_segments rows, padding where chains are shorter).

The SFT warm start is multi-turn: the scripted `summarizing_reader`'s episodes on the first `sft.teacher.max_tasks`
tasks of each split, recorded through the agent loop with these actor settings (summaries included) and cached
(c2jax/services/teacher_traces.py), one token document per segment, the loss on the teacher's turns and summaries.
(The suite's single-turn demonstrations write the reference solution without reading a note: they would teach
guessing.) docs/experiments/self_summary.md says what has been run.
"""

import ml_collections

from c2jax.services import rl_run_config
from configs import rl_tiny

EOS = 258  # the byte tokenizer's end of sequence


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = rl_tiny.get_config()
  c.model_overrides.vocab_size = 259
  c.init_checkpoint = ""
  # SFT on recorded multi-turn episodes: a row holds one segment (<= actors.context tokens).
  c.sft.update(enabled=True, steps=300, seq_len=1024, batch_size=4, learning_rate=3e-3, warmup_steps=20)
  c.sft.teacher.update(policy="summarizing_reader", max_tasks=64, copies=1, flawed=0)
  c.task = rl_run_config.task_defaults("coding", coding_suite="tiny_long_horizon", max_turns=12, max_tokens=8192,
                                       instructions="none", tokenizer="byte", reward_workers=4,
                                       suite_options={"num_files": 3, "filler_lines": 2})
  c.actors.update(
      episodes="multi_turn", group_size=4, groups_per_call=2, prompt_len=512, stop_tokens=(EOS,),
      context=1024,  # the first observation (~300) and about two notes (~300 each with the read call) per segment
      max_turns=12, max_new_tokens=256, max_episode_tokens=4096, chunk_steps=16, tool_workers=4)
  # The report's self-summaries: a segment ends at 700 positions (or sooner when an observation would not fit
  # beside a summary); a summary of at most 128 tokens; 4 segments per episode.
  c.actors.summary.update(trigger_tokens=700, max_tokens=128, max_segments=4)
  c.actors.summary_tokens = "trained"
  c.sft.teacher.summary.update(trigger_tokens=700, max_tokens=128, max_segments=4)  # the teacher's: as the actors'
  c.trainer.update(steps=20, groups_per_step=2, checkpoint_every=10)
  c.eval.update(tasks=8, samples=4, best_of=4, process=False)
  c.rl.pass_k = (1, 4)
  return c
