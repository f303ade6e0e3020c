"""Multi-turn RL with self-summaries on the long-horizon suite (report section 4: when the context fills, the model
summarizes its work so far and continues from the summary; the episode's reward trains every segment).

  python experiments/rl_main.py --config=configs/rl_long_horizon.py --workdir=runs/long_horizon
  python tools/sweep.py --config=configs/rl_long_horizon.py --sweep=configs/sweeps/self_summary.py

The tasks are tiny_long_horizon (c2jax/envs/tasks/suites/long_horizon.py): `def f(x)` applies K steps, each stated in
its own notes/step_i.txt among lines of filler; the prompt names only the files. A whole episode (read K files, write,
finish) does not fit the slot's `actors.context`, so the engine asks for a summary when a segment reaches
`actors.summary.trigger_tokens` (or its next observation would not fit) and continues the episode from it in a new
segment (c2jax/actors/agent_loop.py). The tokenizer is the suite's BPE trained with its train repositories' files
(`bpe:1024:repository`), so a note's words ("subtract", " 5") are single tokens, as the code's are (bytes made the
tiny model's copying harder still: docs/experiments/self_summary.md, section 3b), and the pool is 5000 sequences
(4,341 distinct functions at K = 3) so that the SFT's 1024 train tasks are too many to memorize. Everything else is
configs/rl_tiny.py's recipe; the trainer's batch holds a row per segment (groups_per_step x group_size x
max_segments rows, padding where chains are shorter).

The SFT warm start is multi-turn: the scripted `summarizing_reader`'s episodes on the first `sft.teacher.max_tasks`
train tasks (and `sft.teacher.heldout_tasks` held-out ones, for the SFT's held-out loss), recorded through the agent
loop with these actor settings (summaries included) and cached (c2jax/services/teacher_traces.py), one token
document per segment, the loss on the teacher's turns and summaries.
(The suite's single-turn demonstrations write the reference solution without reading a note: they would teach
guessing.) docs/experiments/self_summary.md says what has been run.
"""

import ml_collections

from c2jax.services import rl_run_config
from configs import rl_tiny

TOKENIZER = "bpe:1024:repository"  # c2jax/envs/teachers/suite_tokenizer.py: the notes' words are tokens; </s> is 2
EOS = 2


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = rl_tiny.get_config("single_turn")
  c.model_overrides.vocab_size = 1024
  c.init_checkpoint = ""
  # SFT on recorded multi-turn episodes: a row holds one segment (<= actors.context tokens).
  c.sft.update(enabled=True, steps=2500, seq_len=448, batch_size=8, learning_rate=3e-3, warmup_steps=20)
  c.sft.teacher.update(policy="summarizing_reader", max_tasks=1024, copies=1, flawed=0)
  c.task = rl_run_config.task_defaults("coding", coding_suite="tiny_long_horizon", max_turns=12, max_tokens=8192,
                                       instructions="none", tokenizer=TOKENIZER, reward_workers=4,
                                       suite_options={"num_files": 3, "filler_lines": 4, "pool_size": 5000})
  c.actors.update(
      episodes="multi_turn", group_size=4, groups_per_call=2, prompt_len=256, stop_tokens=(EOS,),
      context=448,  # the first observation (~90 tokens) and about two notes (~110 each with the read call)
      max_turns=12, max_new_tokens=128, max_episode_tokens=2048, chunk_steps=16, tool_workers=4)
  # The report's self-summaries: a segment ends at 300 positions (or sooner when an observation would not fit
  # beside a summary); a summary of at most 64 tokens; 4 segments per episode.
  c.actors.summary.update(trigger_tokens=300, max_tokens=64, max_segments=4)
  c.actors.summary_tokens = "trained"
  c.sft.teacher.summary.update(trigger_tokens=300, max_tokens=64, max_segments=4)  # the teacher's: as the actors'
  c.trainer.update(steps=20, groups_per_step=2, checkpoint_every=10)
  c.eval.update(tasks=16, samples=4, best_of=4, process=False)
  c.rl.pass_k = (1, 4)
  return c
