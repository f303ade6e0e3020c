"""The main job, CPU-sized: SFT -> asynchronous RL -> held-out evaluation of a tiny MoE on tiny coding tasks
(report sections 3-6).

  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_tiny
  # ablations of the recipe (c2jax/rl/config.py), e.g. GRPO instead of Dr. GRPO, or synchronous RL:
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_grpo --config.rl.advantage=grpo
  python experiments/rl_main.py --config=configs/rl_tiny.py --workdir=runs/rl_sync --config.schedule=sync
  # the trainer alone against an existing buffer, actors anywhere else:
  python experiments/rl_main.py --config=configs/rl_tiny.py --config.actors.external=True \\
      --config.buffer=s3://bucket/run/buffer --config.weights=s3://bucket/run/weights
  python experiments/actor_main.py --buffer=s3://bucket/run/buffer --weights=s3://bucket/run/weights

The tasks are tiny_compositions (c2jax/envs/suites/compositions.py): write a one-line Python function over a list
from a sentence that names its reducer, mapper and filter in words ("the sum of the squares of the even numbers in
xs") and an example; a sample is one turn of the coding environment (write_file + finish), graded in a sandbox by
the task's hidden tests (reward = the fraction passed). Held-out tasks are compositions never trained on (by SFT or
RL), whose parts all are. Tokens are a 512-token byte-level BPE of the suite's train text (c2jax/data/bpe.py,
trained on first use and cached): prompts are the first observation without the tool-format help
(`instructions="none"`: the SFT teaches the format), 63-115 tokens; an answer is 62-85.
First a short cached SFT on the train split's demonstrations (c2jax/rl/warm_start.py), then RL on the train split;
the held-out tasks measure pass@1 and best-of-8 before and after RL.

The SFT teacher is imperfect, as real SFT data are: two of its four demonstrations of every task leave the
write_file call incomplete (c2jax/data/sft.py; the report's RL penalizes incomplete tool calls, section 4), so the
SFT policy does so about half of the time, on held-out tasks too. RL, rewarded by the hidden tests, unlearns it.
With a perfect teacher (`--config.sft.teacher.flawed=0`) the SFT policy has memorized the 138 train tasks and RL at
this size has nothing to add that carries to held-out compositions: over four seeds the held-out change was
-0.05 to +0.07; with one flawed demonstration in four, pass@1 rose by 0.15-0.16 but best-of-8, at its ceiling,
stayed within -0.008 (WORKSPACE_NOTES.md, the main job).

Why this suite and tokenizer at CPU scale: a 2-layer byte-level model does not learn, within minutes, to condition
its answer on the words of a statement (tiny_functions: held-out pass@1 <= 0.03 after 300-900 SFT steps; this suite
with bytes: 0.008 after 300, and even train tasks get bodies that ignore the words); with words as single tokens,
300 steps reach 0.67 (WORKSPACE_NOTES.md, the coding main job). tiny_functions (constants to copy as well) fits the
same shapes under its own BPE: --config.task.coding_suite=tiny_functions.

configs/rl_char_class.py is the seconds-scale variant on a built-in toy task (tests, quick sweeps).
"""

import ml_collections

from c2jax.model.config import ModelConfig  # noqa: F401  (documents where model_overrides' fields live)
from c2jax.rl.config import RLConfig, to_config_dict
from configs.model import tiny

TOKENIZER = "bpe:512"  # c2jax/data/bpe.py: 512 tokens, specials <pad> 0, <s> 1, </s> 2
EOS = 2  # the BPE's end of sequence (bpe.SPECIALS): where a turn ends


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = ml_collections.ConfigDict()
  c.model = "tiny"  # a module under configs/model
  # The BPE's 512 tokens; 2 layers (1 dense + 1 MoE) keep each compile to seconds on a CPU.
  c.model_overrides = ml_collections.ConfigDict(
      {"vocab_size": 512, "n_layers": 2, "num_mtp_layers": 0, "scan_unroll": 1, "d_model": 128})
  c.init_checkpoint = ""  # a c2jax model checkpoint (pretraining / SFT) to start from; empty: the SFT below
  c.seed = 0
  c.mesh = ""  # the trainer's device mesh, e.g. "fsdp:2,expert:2" (c2jax.parallel.mesh); empty: one device
  c.compilation_cache = ""  # directory of compiled programs (empty: <workdir>/jax_cache), reused on restart
  c.schedule = "async"  # async | sync (c2jax.rl.run_config.Schedule)

  # The RL recipe: every field of c2jax.rl.config.RLConfig, defaults from the report (Dr. GRPO, k1 KL, routing
  # replay, the plausibility filter, no overlong masking, the nonlinear length penalty).
  rl = to_config_dict(RLConfig(model=tiny.get_model_config()))
  # 1e-4 with a 10-step warmup. Adam's first update is a sign step of the full rate on every weight: on a 32-sample
  # gradient, without warmup, it alone moved the SFT'd policy by a KL of 0.14-0.23 per token at 2e-4 / 3e-4, and
  # train reward then fell to ~0.05-0.2. With the warmup, 2e-4 drifted held-out pass@1 down (0.67 -> 0.66 at step
  # 30); 1e-4 raised it by 0.08-0.10 in 40 steps. The report's scale uses ~1e-6 (WORKSPACE_NOTES.md: the RL runs).
  rl.optim.learning_rate = 1e-4
  rl.optim.warmup_steps = 10
  # The report's nonlinear length penalty, on: - 0.1 * C_{k=1,q=0.5}(tokens / 1000) costs a 75-token answer 0.007.
  rl.reward.length_penalty.weight = 0.1
  c.rl = rl

  # c2jax/envs/coding_rl.py: the coding suite as single-turn tasks; suite_options selects tasks of the suite.
  c.task = ml_collections.ConfigDict(dict(suite="coding", coding_suite="tiny_compositions", seed=0, max_turns=8,
                                          max_tokens=8192, instructions="none", tokenizer=TOKENIZER,
                                          suite_options={}, reward_workers=4))
  # The SFT warm start on the suite's train-split demonstrations: a one-phase run of the pretraining loop, cached by
  # its settings under cache_dir ($C2JAX_CACHE_DIR or ~/.cache/c2jax when empty; c2jax/rl/warm_start.py). Skipped
  # when init_checkpoint is set. Rows of 512 tokens hold ~3 demonstrations (first-fit packing); 300 steps are ~2.5
  # min on 2 CPU cores and reach held-out pass@1 ~0.67 sampled, ~0.81 greedy. Shorter SFTs leave a policy that RL
  # at these rates does not improve on held-out tasks (150 and 220 steps: WORKSPACE_NOTES.md).
  # suite_options: the SFT's own selection of the suite's tasks (empty: the task's).
  # teacher: `flawed` of the `copies` demonstrations of every task carry `flaw` (c2jax/data/sft.py FLAWS).
  c.sft = ml_collections.ConfigDict(dict(enabled=True, cache_dir="", steps=300, seq_len=512, batch_size=8,
                                         learning_rate=3e-3, warmup_steps=20, mtp_weight=0.0, suite_options={},
                                         teacher=dict(copies=4, flawed=2, flaw="incomplete_call")))

  c.actors = ml_collections.ConfigDict(dict(
      num=2,  # local actor processes started by rl_main
      external=False,  # True: start none; actors run elsewhere against the same URLs
      group_size=8, groups_per_call=2,
      prompt_len=128,  # >= the longest prompt (115 tokens with BOS); prompts are left-aligned, then padded
      max_new_tokens=96,  # the longest reference answer is 85 tokens with EOS
      temperature=1.0, stop_tokens=[EOS],
      chunk_steps=16,  # decode steps between checks for newer weights
      max_lag=1,  # admission: a group starts at most this many versions before the update that trains on it
      weight_updates="in_flight",  # in_flight | between_calls
      poll_interval_s=0.05,  # a refused actor polls trainer.json this often, and asks again when it changes
      admission_recheck_s=1.0,  # ... or after this long
      pending_lease_s=300.0,  # admission forgets the begun groups of an actor silent this long
      cpus="",  # Linux cpu-list ("2-3") the actors and the evaluator are pinned to; empty: no pinning
  ))

  c.trainer = ml_collections.ConfigDict(dict(
      steps=40, groups_per_step=4, checkpoint_every=10, keep_checkpoints=2,
      take_timeout_s=900.0,  # fail if no batch arrives for this long
      poll_interval_s=0.02,  # how often the trainer looks for newly committed groups while it waits
      cpus="",  # Linux cpu-list ("0-1") the trainer is pinned to after SFT (c2jax/actors/placement.py)
  ))
  c.buffer = ""  # URL (path, s3://, gs://); empty: <workdir>/buffer
  c.weights = ""  # URL; empty: <workdir>/weights
  c.weight_store = ml_collections.ConfigDict(dict(full_every=8, keep=2))

  # Held-out evaluation: in the trainer before and after training (tasks x samples), and by an evaluator process
  # during training (every_versions, the same tasks). All 35 held-out tasks; best-of-8 and pass@k are estimated
  # from 16 samples per task (c2jax/actors/evaluate.py), which halves their sampling noise against 8 samples.
  c.eval = ml_collections.ConfigDict(dict(tasks=35, samples=16, best_of=8, every_versions=20, process=True))
  c.rl.pass_k = (1, 4, 8)
  return c
