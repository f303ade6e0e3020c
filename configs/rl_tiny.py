"""The main job, CPU-sized: SFT -> asynchronous RL -> held-out evaluation of a tiny MoE on tiny coding tasks (report
sections 3-6), in two modes. Every field and its default: c2jax/services/rl_run_config.py.

  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_tiny                   # the agent
  python experiments/rl_main.py --config=configs/rl_tiny.py:single_turn --workdir=runs/rl_single_turn  # one turn
  # ablations of the recipe (c2jax/rl/config.py), e.g. GRPO instead of Dr. GRPO, synchronous RL, a perfect teacher:
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_grpo --config.rl.advantage=grpo
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_sync --config.schedule=sync
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_perfect --config.sft.teacher.flawed=0
  # the trainer alone against an existing buffer, actors anywhere else:
  python experiments/rl_main.py --config=configs/rl_tiny.py --config.actors.external=True \\
      --config.buffer=s3://bucket/run/buffer --config.weights=s3://bucket/run/weights
  python -m c2jax.services.actor_process --buffer=s3://bucket/run/buffer --weights=s3://bucket/run/weights

"agentic" (the default, what `make demo` runs). The tasks are tiny_spec (c2jax/envs/tasks/suites/spec.py): the prompt
only says to implement `f(xs)` as SPEC.md says; SPEC.md names the composition and tests/test_visible.py holds
examples the agent can run. An episode is the agent loop in the engine (c2jax/actors/agent_loop.py): the model's turns
are tool calls, each answered by the sandboxed environment, until it finishes or a budget ends it; the hidden tests
grade it. Tokens are a 1024-token BPE of the suite's train text with its repositories and its teacher's observations
(`bpe:1024:episodes`): tool results and unittest's output are most of an episode. The SFT is on recorded agent traces
(c2jax/services/teacher_traces.py): each train task four times, twice by `spec_fixer` (reads SPEC.md, writes, runs
the visible tests, finishes; in a third of its episodes the first write is one part wrong, and it answers the failing
run with the right write; the wrong write carries no loss) and twice by `spec_unclosed`, a careless teacher that
finishes without verifying and in half of its episodes cuts its write_file call off (an incomplete call: nothing is
written, the environment says the call is malformed, it finishes all the same). Those failing traces are kept as
demonstrations, as real SFT data keep careless sessions, so the SFT policy, too, often leaves its write incomplete on
held-out tasks. RL, rewarded by the hidden tests with a penalty on malformed calls (report section 4), makes it
complete its writes and run the tests before finishing more often. With a perfect teacher
(`--config.sft.teacher.flawed=0`: all four traces by spec_fixer) the figures are in the docs below.

"single_turn" (`configs/rl_tiny.py:single_turn`, an ablation: the recipe without the agent). The tasks are
tiny_compositions (c2jax/envs/tasks/suites/compositions.py): write a one-line Python function over a list from a
sentence that names its reducer, mapper and filter in words ("the sum of the squares of the even numbers in xs") and an
example; a sample is one turn of the coding environment (write_file + finish), graded in a sandbox by the task's
hidden tests (reward = the fraction passed). Held-out tasks are compositions never trained on (by SFT or RL), whose
parts all are. Tokens are a 512-token byte-level BPE of the suite's train text (c2jax/envs/teachers/suite_tokenizer.py,
trained on first use and cached): prompts are the first observation without the tool-format help
(`instructions="none"`: the SFT teaches the format), 63-115 tokens; an answer is 62-85. First a short cached SFT on
the train split's demonstrations (c2jax/services/warm_start.py), then RL on the train split; the held-out tasks
measure pass@1 and best-of-8 before and after RL. The SFT teacher is imperfect: two of its four demonstrations of
every task leave the write_file call incomplete (c2jax/envs/teachers/demonstrations.py), so the SFT policy does so about
half of the time, on held-out tasks too. RL, rewarded by the hidden tests, unlearns it. With a perfect teacher
(`--config.sft.teacher.flawed=0`) RL at this size adds nothing that carries to held-out compositions.

What each choice was measured against, and what each mode's runs show (held-out pass@1, best-of-8, and the agent's
behaviour: turns, read-before-edit, tests-before-finish, recovery after failing tests, malformed calls, tokens):
docs/experiments/main_job.md. configs/rl_char_class.py is the seconds-scale variant on a built-in toy task.
"""

import ml_collections

from c2jax.rl import rewards
from c2jax.services import rl_run_config

EOS = 2  # the suite BPEs' end of sequence (c2jax/data/bpe.py SPECIALS): where a turn ends
MODES = ("agentic", "single_turn")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  mode = arg or "agentic"
  if mode not in MODES:
    raise ValueError(f"configs/rl_tiny.py:{mode}: the mode is one of {MODES} (default agentic).")
  c = _single_turn()
  return c if mode == "single_turn" else _agentic(c)


def _single_turn() -> ml_collections.ConfigDict:
  """The one-turn job; also the recipe the agentic job starts from."""
  c = rl_run_config.defaults()
  c.model = "tiny"  # a preset of c2jax.model.presets
  # The BPE's 512 tokens (c2jax/envs/teachers/suite_tokenizer.py; <pad> 0, <s> 1, </s> 2); 2 layers (1 dense + 1 MoE)
  # keep each compile to seconds on a CPU.
  c.model_overrides = ml_collections.ConfigDict(
      {"vocab_size": 512, "n_layers": 2, "num_mtp_layers": 0, "scan_unroll": 1, "d_model": 128})
  c.seed = 0
  c.schedule = "async"

  # The RL recipe keeps the report's defaults (Dr. GRPO, k1 KL, routing replay, the plausibility filter, no overlong
  # masking). 1e-4 with a 10-step warmup: Adam's first update is a sign step of the full rate on every weight, and
  # without warmup one such step on a 32-sample gradient moved the SFT'd policy far enough to lose its reward.
  c.rl.optim.learning_rate = 1e-4
  c.rl.optim.warmup_steps = 10
  # The report's nonlinear length penalty, on: - 0.1 * C_{k=1,q=0.5}(tokens / 1000) costs a 75-token answer 0.007.
  c.rl.reward.length_penalty.weight = 0.1
  # A detected attempt to game the grader (c2jax/envs/grading/grading.py) scores below an honest failure.
  c.rl.reward.weights.hack_attempts = rewards.HACK_ATTEMPTS_WEIGHT
  c.rl.pass_k = (1, 4, 8)

  # c2jax/envs/coding_rl.py: the coding suite as single-turn tasks; suite_options selects tasks of the suite.
  c.task = rl_run_config.task_defaults("coding", coding_suite="tiny_compositions", max_turns=8, max_tokens=8192,
                                       instructions="none", tokenizer="bpe:512", reward_workers=4)
  # The SFT warm start on the suite's train-split demonstrations, cached by its settings. Rows of 512 tokens hold ~3
  # demonstrations (first-fit packing). teacher: `flawed` of the `copies` demonstrations of every task carry `flaw`.
  c.sft.update(enabled=True, steps=300, seq_len=512, batch_size=8, learning_rate=3e-3, warmup_steps=20,
               mtp_weight=0.0)
  c.sft.teacher.update(copies=4, flawed=2, flaw="incomplete_call")

  c.actors.update(
      num=2, external=False, group_size=8, groups_per_call=2,
      prompt_len=128,  # >= the longest prompt (115 tokens with BOS); prompts are left-aligned, then padded
      max_new_tokens=96,  # the longest reference answer is 85 tokens with EOS
      temperature=1.0, stop_tokens=(EOS,),
      chunk_steps=16,  # decode steps between checks for newer weights
      max_lag=1,  # admission: a group starts at most this many versions before the update that trains on it
      weight_updates="in_flight", poll_interval_s=0.05, admission_recheck_s=1.0,
      pending_lease_s=300.0)  # admission forgets the begun groups of an actor silent this long

  c.trainer.update(steps=40, groups_per_step=4, checkpoint_every=10, keep_checkpoints=2, take_timeout_s=900.0,
                   poll_interval_s=0.02)
  c.weight_store.update(full_every=8, keep=2)
  # Held-out evaluation: in the trainer before and after training (tasks x samples), and by an evaluator process
  # during training (every_versions, the same tasks). All 35 held-out tasks; best-of-8 and pass@k are estimated
  # from 16 samples per task (c2jax/eval/metrics.py), which halves their sampling noise against 8 samples.
  c.eval.update(tasks=35, samples=16, best_of=8, every_versions=20, process=True)
  return c


def _agentic(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The agent: tiny_spec through the agent loop, SFT on recorded traces (the module docstring)."""
  c.model_overrides.vocab_size = 1024
  c.task = rl_run_config.task_defaults("coding", coding_suite="tiny_spec", max_turns=6, max_tokens=8192,
                                       instructions="none", tokenizer="bpe:1024:episodes", reward_workers=4)
  # A row of 1024 tokens holds one to four recorded episodes (234-820 tokens, mean 367; first-fit packing).
  c.sft.update(enabled=True, steps=600, seq_len=1024, batch_size=8, learning_rate=3e-3, warmup_steps=20)
  # Each train task 4 times; the last 2 by the careless teacher (the module docstring). Held-out tasks once (0: all
  # 35), by spec_fixer, for the SFT's held-out loss.
  c.sft.teacher.update(policy="spec_fixer", copies=4, flawed=2, flaw="spec_unclosed", max_tasks=0,
                       heldout_tasks=0)
  c.actors.update(
      episodes="multi_turn",
      context=1024,  # the longest recorded episode is 820 tokens
      max_turns=6, max_new_tokens=128, max_episode_tokens=1024, tool_workers=4,
      # The engine's buckets, few enough that the job compiles all of them before its first evaluation (27
      # programs; the defaults' 60 cost twice that, and their 64-token chunk went unused: docs/benchmarks.md,
      # "tools/bench_main_job.py").
      chunk_sizes=(16, 256), row_buckets=(2, 8))
  # An update of 32 rows of 1024 positions takes 10-20 s on 2 cores beside the actors, and an evaluation of 280
  # episodes ~3.5 min: 30 steps, 8 samples per held-out task (best-of-8 from exactly 8), no evaluator process.
  c.trainer.update(steps=30)
  # The report's penalty on incomplete or malformed tool calls (section 4), per call.
  c.rl.reward.weights.malformed_tool_calls = -0.1
  c.eval.update(tasks=35, samples=8, best_of=8, process=False)
  return c
