"""The RL run config: the shipped configs resolve, the main job's shapes hold its task suite (no prompt cut, no
answer cut off by the token budget, no SFT demonstration longer than a row), the JSON the actors read round-trips,
and bad keys and values are refused in one sentence naming them."""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.actors.actor import WeightUpdates
from c2jax.data.tokenizer import make_tokenizer
from c2jax.envs.teachers import demonstrations
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.teachers import suite_tokenizer
from c2jax.parallel import mesh as mesh_lib
from c2jax.rl.packing import RowLayout
from c2jax.services import rl_loop
from c2jax.services import rl_run_config
from c2jax.services import teacher_traces
from c2jax.services import warm_start
from configs import rl_char_class
from configs import rl_tiny


class RunConfigsTest(parameterized.TestCase):

  @parameterized.named_parameters(("rl_tiny", rl_tiny, None), ("rl_tiny_single_turn", rl_tiny, "single_turn"),
                                  ("rl_char_class", rl_char_class, None))
  def test_resolves_and_round_trips_through_json(self, module, arg):
    cfg = rl_run_config.parse(module.get_config(arg))
    suite = cfg.task_suite()
    self.assertEqual(cfg.rl.model, cfg.model_config)
    self.assertLessEqual(cfg.eval.tasks, suite.size("heldout"))
    self.assertGreater(cfg.actor_config.max_new_tokens, 0)
    self.assertBetween(cfg.eval.k, 1, cfg.eval.samples)
    self.assertEqual(rl_run_config.from_json(rl_run_config.to_json(cfg)), cfg)

  def test_best_of_defaults_to_the_samples_and_refuses_more(self):
    c = rl_tiny.get_config("single_turn")
    cfg = rl_run_config.parse(c)
    self.assertEqual((cfg.eval.samples, cfg.eval.k), (16, 8))  # K = 8, from 16 samples
    c.eval.best_of = 0
    self.assertEqual(rl_run_config.parse(c).eval.k, 16)
    c.eval.best_of = 17
    with self.assertRaisesRegex(ValueError, r"^eval: best_of=17 must lie in \[1, samples=16\]"):
      rl_run_config.parse(c)

  def test_the_actors_seed_is_the_runs_and_sync_forces_on_policy(self):
    c = rl_tiny.get_config()
    c.seed, c.schedule = 7, "sync"
    actor = rl_run_config.parse(c).actor_config
    self.assertEqual((actor.seed, actor.split, actor.max_lag, actor.weight_updates),
                     (7, "train", 0, WeightUpdates.BETWEEN_CALLS))

  @parameterized.named_parameters(
      ("unknown_key", {"trainer": {"bogus_key": 1}},
       "trainer has no field 'bogus_key'; its fields are checkpoint_every, cpus, groups_per_step"),
      ("unknown_section", {"trainr": {}}, "the config has no field 'trainr'; its fields are actors, buffer"),
      ("bad_type", {"trainer": {"steps": "many"}}, r"trainer.steps='many' must be an integer\."),
      ("bad_range", {"trainer": {"steps": 0}}, r"trainer: steps=0 must be >= 1\."),
      ("bad_enum", {"actors": {"weight_updates": "sometimes"}},
       "actors.weight_updates='sometimes' is not one of 'in_flight', 'between_calls'"),
      ("bad_schedule", {"schedule": "later"}, "schedule='later' is not one of 'async', 'sync'"),
      ("bad_model_field", {"model_overrides": {"layers": 2}}, "model_overrides has no field 'layers'; its fields"),
      ("bad_preset", {"model": "huge"}, "Unknown model preset 'huge'; known: kimi_k25, small, tiny"),
      ("bad_suite", {"task": {"suite": "chess"}}, "Unknown task suite 'chess'"),
      ("field_of_another_suite", {"task": {"suite": "char_class", "coding_suite": "x"}, "sft": {"enabled": False}},
       "task has no field 'coding_suite'; its fields are answer_tokens, prefix_len, seed, size_per_split"),
      ("seed_is_not_an_actor_key", {"actors": {"seed": 3}}, "actors has no field 'seed'"),
      ("rl_model", {"rl": {"model": {}}}, "rl has no field 'model'"),
      ("temperatures", {"rl": {"sampling_temperature": 0.5}},
       "rl.sampling_temperature=0.5 differs from actors.temperature=1.0"),
      ("sft_needs_coding", {"task": {"suite": "char_class"}}, "sft.enabled needs a coding task suite"),
      ("bad_mesh", {"mesh": "fsdp:two"}, "mesh='fsdp:two': Bad mesh item"),
      ("bad_cpus", {"actors": {"cpus": "a-b"}}, "actors: CPU list 'a-b'"),
      ("bad_flaw", {"sft": {"teacher": {"flaw": "typo"}}}, "sft.teacher: Unknown SFT demonstration flaw 'typo'"),
      ("unreported_term", {"task": {"suite": "char_class"}, "sft": {"enabled": False},
                           "rl": {"reward": {"weights": {"outcome": 1.0, "hack_attempts": -1.0}}}},
       "rl.reward.weights weights 'hack_attempts', which task suite 'char_class' does not report \\(it reports "
       "outcome\\)"),
      ("env_local_negative", {"actors": {"episodes": "multi_turn"}, "env_service": {"local": -1}},
       "env_service: EnvServiceConfig.local=-1 must be an integer >= 0"),
      ("env_server_not_host_port", {"actors": {"episodes": "multi_turn"}, "env_service": {"servers": "h:1,envhost"}},
       "env_service: EnvServiceConfig.servers: 'envhost' is not host:port"),
      ("env_server_twice", {"actors": {"episodes": "multi_turn"}, "env_service": {"servers": ["h:1", "h:1"]}},
       "env_service: EnvServiceConfig.servers='h:1,h:1' names a server twice"),
      ("env_secret_env", {"actors": {"episodes": "multi_turn"}, "env_service": {"local": 1, "secret_env": "A-B"}},
       "env_service: EnvServiceConfig.secret_env='A-B' must name the environment variable"),
      ("env_bind", {"actors": {"episodes": "multi_turn"}, "env_service": {"local": 1, "bind": "h:1/x"}},
       "env_service: EnvServiceConfig.bind='h:1/x' must be an address of this host"),
      ("env_tls_half", {"actors": {"episodes": "multi_turn"}, "env_service": {"local": 1, "tls_cert": "c.pem"}},
       "env_service: EnvServiceConfig: tls_cert and tls_key go together"),
      ("env_timeouts", {"actors": {"episodes": "multi_turn"}, "env_service": {"open_wait_s": 0}},
       "env_service: EnvServiceConfig.open_wait_s=0.0 must be > 0"),
      ("env_field", {"env_service": {"hosts": "h:1"}}, "env_service has no field 'hosts'"),
      ("packed_rows", {"trainer": {"packed_rows": -1}}, "packed_rows=-1 must be >= 0"),
      ("env_single_turn", {"env_service": {"local": 2}},
       "env_service: environment servers run multi-turn episodes \\(actors.episodes=multi_turn\\)"),
  )
  def test_refuses_in_one_sentence(self, override, message):
    with self.assertRaisesRegex(ValueError, message) as caught:
      rl_run_config.parse(override)
    self.assertNotIn("\n", str(caught.exception))

  @parameterized.named_parameters(
      # The first row count that cannot take the mesh: packed rows (the default) start at half the padded 32.
      ("batch", "fsdp:3", {}, "mesh='fsdp:3': Batch size 16 does not split into micro_batches=1 of rows divisible by "
       "data x fsdp x expert = 3"),
      ("micro_batches", "fsdp:8", {"micro_batches": 8}, "Batch size 16 does not split into micro_batches=8"),
      ("heads", "tensor:8", {}, "attention heads cannot be split over a tensor axis of 8"),
      ("devices", "fsdp:4,expert:4", {}, "mesh='fsdp:4,expert:4' needs 16 devices but only 8 exist"),
  )
  def test_the_trainers_mesh_is_checked_before_anything_starts(self, mesh, rl, message):
    # What rl_job.run calls before the SFT warm start and the actors (the suite runs on 8 fake CPU devices).
    cfg = rl_run_config.parse(rl_tiny.get_config("single_turn"))
    cfg = dataclasses.replace(cfg, mesh=mesh, rl=dataclasses.replace(cfg.rl, **rl))
    with self.assertRaisesRegex(mesh_lib.MeshRefusal, message) as caught:
      rl_loop.check_mesh(cfg)
    self.assertNotIn("\n", str(caught.exception))
    rl_loop.check_mesh(dataclasses.replace(cfg, mesh="fsdp:2"))  # one that divides every row count: no refusal

  def test_packed_row_buckets(self):
    cfg = rl_run_config.parse(rl_tiny.get_config("single_turn"))
    self.assertEqual(rl_loop.row_buckets(cfg), (16, 32))  # packed, the default
    padded = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, rows=RowLayout.PADDED))
    self.assertIsNone(rl_loop.row_buckets(padded))  # one row per sequence
    rows = rl_loop.batch_rows(cfg)
    self.assertEqual(rows, 32)

    def packed(rl=None, mesh="", **trainer):
      return dataclasses.replace(cfg, mesh=mesh, rl=dataclasses.replace(cfg.rl, **(rl or {})),
                                 trainer=dataclasses.replace(cfg.trainer, rows=RowLayout.PACKED, **trainer))

    self.assertEqual(rl_loop.row_buckets(packed()), (16, 32))  # half the padded rows, then all of them
    self.assertEqual(rl_loop.row_buckets(packed(packed_rows=6)), (6, 12, 24, 32))
    self.assertEqual(rl_loop.row_buckets(packed(rl={"micro_batches": 4}, packed_rows=0)), (16, 32))
    with self.assertRaisesRegex(ValueError, "packed_rows=6 does not split into rl.micro_batches=4; use a multiple"):
      rl_loop.row_buckets(packed(rl={"micro_batches": 4}, packed_rows=6))
    # Every packed row count must lay out on the trainer's mesh, checked before anything starts.
    with self.assertRaisesRegex(mesh_lib.MeshRefusal, "Batch size 6 does not split"):
      rl_loop.check_mesh(packed(mesh="fsdp:4", packed_rows=6))
    rl_loop.check_mesh(packed(mesh="fsdp:4", packed_rows=8))

  @parameterized.named_parameters(
      ("comma_string", " envhost-1:7070, envhost-2:7070 ", ("envhost-1:7070", "envhost-2:7070")),
      ("list", ["envhost-1:7070", "[::1]:7071"], ("envhost-1:7070", "[::1]:7071")),
      ("none", "", ()),
  )
  def test_env_service_servers_as_a_comma_string_or_a_list(self, servers, addresses):
    cfg = rl_run_config.parse({"actors": {"episodes": "multi_turn"}, "env_service": {"servers": servers}})
    self.assertEqual(cfg.env_service.addresses, addresses)
    self.assertEqual(cfg.env_service.remote, bool(addresses))
    self.assertEqual(rl_run_config.from_json(rl_run_config.to_json(cfg)), cfg)

  def test_env_service_defaults_to_in_process(self):
    # `make demo` and every shipped config keep their environments in the actors' processes.
    for module, arg in ((rl_tiny, None), (rl_tiny, "single_turn"), (rl_char_class, None)):
      self.assertFalse(rl_run_config.parse(module.get_config(arg)).env_service.remote)
    c = rl_run_config.defaults()
    self.assertEqual((c.env_service.servers, c.env_service.local, c.env_service.bind), ("", 0, "127.0.0.1"))

  def test_every_field_is_in_the_defaults(self):
    # What configs/ start from: every field a ConfigDict key, so `--config.x.y=` reaches each of them.
    c = rl_run_config.defaults()
    self.assertEqual(rl_run_config.parse(c), rl_run_config.RLRunConfig())
    self.assertIn("pending_lease_s", c.actors)
    self.assertIn("zstd_level", c.weight_store)
    self.assertIsInstance(c.actors.stop_tokens, tuple)  # a tuple is a command-line override, a list is not
    self.assertEqual(sorted(rl_run_config.task_defaults("char_class")), ["answer_tokens", "prefix_len", "seed",
                                                                         "size_per_split", "suite"])

  @parameterized.parameters("single_turn", "agentic")
  def test_main_job_shapes_hold_the_suite(self, mode):
    reason = sandbox_lib.unavailable_reason()
    if mode == "agentic" and reason:
      self.skipTest(f"the agentic job's BPE plays its teacher's episodes in sandboxes: {reason}")
    cfg = rl_run_config.parse(rl_tiny.get_config(mode))
    task, suite, actors = cfg.task, cfg.task_suite(), cfg.actor_config
    tok = make_tokenizer(suite_tokenizer.resolve(task["tokenizer"], task["coding_suite"]))
    # The model covers the BPE; HF's trainer may stop a few merges short of the asked size when two merges make the
    # same string (the agentic BPE: 1002 of 1024), and ids past it only decode to nothing.
    self.assertBetween(tok.vocab_size, 0.95 * cfg.model_config.vocab_size, cfg.model_config.vocab_size)
    for split in ("train", "heldout"):
      longest = max(len(suite.task(split, i).prompt) for i in range(suite.size(split)))
      self.assertLessEqual(longest, actors.prompt_len, split)
      if mode == "agentic":  # the SFT's rows are recorded episodes (tests/services/teacher_traces_test.py)
        continue
      examples = demonstrations.sft_examples(task["coding_suite"], split, instructions=task["instructions"],
                                             max_turns=task["max_turns"], max_tokens=task["max_tokens"],
                                             suite_options=dict(task["suite_options"]))
      self.assertLen(examples, suite.size(split))
      answer = max(len(tok.encode(r, bos=False, eos=True)) for _, r in examples)
      self.assertLessEqual(answer, actors.max_new_tokens, split)
      demo = max(len(tok.encode(p, bos=True, eos=False)) + len(tok.encode(r, bos=False, eos=True))
                 for p, r in examples)
      self.assertLessEqual(demo, cfg.sft.seq_len, split)
    self.assertIn(tok.eos_id, actors.stop_tokens)
    # The SFT trains the RL run's own model on the same prompts.
    p = warm_start.sft_config(cfg)
    source = dict(p.phases["sft"].sources["tasks"])
    if mode == "agentic":
      self.assertEqual(source, {"kind": "token_docs", "path": teacher_traces.traces_path(cfg, "train")})
    else:
      self.assertEqual((source["suite"], source["instructions"], dict(source["suite_options"])),
                       (task["coding_suite"], "none", dict(task["suite_options"])))
    self.assertEqual(p.tokenizer, suite_tokenizer.resolve(task["tokenizer"], task["coding_suite"]))


if __name__ == "__main__":
  absltest.main()
