"""web_search: the offline standard-library documentation backend (ranking, a deterministic build cached on disk,
bounded results, errors), the backend registry and its config, and the tool through the environment over the real
sandbox, with the default backend and with a registered custom one."""

import os
import shutil
import tempfile
import time
from unittest import mock

from absl.testing import absltest

from c2jax.envs.tools import web_search
from c2jax.envs.tasks.coding_tasks import CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.tools.protocol import ToolCall, ToolName, render as render_call
from tests.envs.tools.sandboxed_env import SandboxedEnvTest
from c2jax.envs.tools.web_search import WEB_SEARCH_BACKENDS, SearchResult, StdlibDocs

_CACHE = tempfile.mkdtemp(prefix="c2jax-web-search-test-")
_DOCS: list[StdlibDocs] = []


def tearDownModule():
  shutil.rmtree(_CACHE, ignore_errors=True)


def built_docs() -> StdlibDocs:
  """One index for the whole module, built in a temporary cache dir (the test's one build, ~3 s)."""
  if not _DOCS:
    docs = StdlibDocs(cache_dir=_CACHE)
    start = time.monotonic()
    docs.search("json", 1)
    print(f"stdlib docs index: built in {time.monotonic() - start:.2f} s, "
          f"{os.path.getsize(docs.cache_path()) / 1e6:.1f} MB on disk, {len(docs._loaded[0])} entries")
    _DOCS.append(docs)
  return _DOCS[0]


class FixedBackend:
  """A custom backend: answers every query with the same numbered results, and records what it was asked."""

  queries: list[tuple[str, int]] = []

  def search(self, query, k):
    FixedBackend.queries.append((query, k))
    return [SearchResult(f"result {i} for {query}", "fixed test backend", f"snippet {i}") for i in range(5)]


CUSTOM = "fixed_for_tests"
if CUSTOM not in WEB_SEARCH_BACKENDS:
  WEB_SEARCH_BACKENDS.register(CUSTOM)(FixedBackend)


class StdlibDocsTest(absltest.TestCase):

  def test_a_described_function_ranks_first(self):
    docs = built_docs()
    results = docs.search("serialize an object to a JSON string", 5)
    self.assertEqual(results[0].title, "json.dumps", [r.title for r in results])
    self.assertIn("Serialize ``obj`` to a JSON formatted ``str``", results[0].snippet)
    self.assertTrue(results[0].snippet.startswith("json.dumps(obj, *, skipkeys=False"))
    self.assertRegex(results[0].source, r"^Python 3\.\d+\.\d+ standard library docs \(offline\): function in json$")
    for query, title in (("split a string into shell words", "shlex.split"), ("join path components", "os.path.join"),
                         ("create a temporary directory", "tempfile.TemporaryDirectory")):
      self.assertEqual(docs.search(query, 3)[0].title, title, query)
    self.assertLen(docs.search("json", 3), 3)

  def test_the_index_is_cached_on_disk_and_loaded_by_the_next_process(self):
    docs = built_docs()
    self.assertTrue(docs.cache_path().startswith(os.path.join(_CACHE, "web_search", "stdlib_docs-py3.")))
    again = StdlibDocs(cache_dir=_CACHE)
    start = time.monotonic()
    self.assertEqual(again.search("serialize an object to a JSON string", 5),
                     docs.search("serialize an object to a JSON string", 5))
    self.assertIsNone(again.build_s)  # loaded, not built
    self.assertLess(time.monotonic() - start, 30.0)
    # A corrupt cache file is rebuilt over, not fatal.
    other = tempfile.mkdtemp(prefix="c2jax-web-search-test-")
    self.addCleanup(shutil.rmtree, other, True)
    small = StdlibDocs(cache_dir=other, modules=("shlex",))
    os.makedirs(os.path.dirname(small.cache_path()))
    with open(small.cache_path(), "wb") as f:
      f.write(b"not a pickle")
    self.assertEqual(small.search("split a string into shell words", 1)[0].title, "shlex.split")
    self.assertIsNotNone(small.build_s)
    reloaded = StdlibDocs(cache_dir=other, modules=("shlex",))
    reloaded.search("shlex", 1)
    self.assertIsNone(reloaded.build_s)

  def test_the_documentation_read_is_deterministic(self):
    a = web_search._extract(("json", "re", "no_such_module_here"))
    b = web_search._extract(("json", "re"))
    self.assertEqual(a, b)
    self.assertEqual([e[0] for e in a], sorted(e[0] for e in a))
    self.assertNotIn(" at 0x", "".join(e[3] for e in a))  # object addresses are cleaned out of signatures
    self.assertIn("json.dumps", [e[0] for e in a])
    self.assertNotIn("json.JSONDecoder.__init__", [e[0] for e in a])  # private, and its doc only inherited

  def test_empty_queries_are_errors_and_results_are_bounded(self):
    docs = built_docs()
    with self.assertRaisesRegex(ValueError, r"^the query is empty; .*\.$"):
      docs.search(" ", 5)
    self.assertEqual(docs.search("qqqxj zzqv", 5), [])
    self.assertEqual(web_search.render([]), "no matches.")
    out = web_search.render([SearchResult("a\ntitle", "two\nlines", "x" * 10000)])
    self.assertEqual(out.splitlines()[:2], ["a title", "  two lines"])
    self.assertLess(len(out), web_search.SNIPPET_CHARS + 40)
    self.assertTrue(out.endswith(" [...]"))

  def test_the_registry_names_the_backends_and_refuses_unknown_ones(self):
    self.assertIn("stdlib_docs", WEB_SEARCH_BACKENDS.names())
    with mock.patch.dict(os.environ, {"C2JAX_CACHE_DIR": _CACHE}):
      shared = WEB_SEARCH_BACKENDS.get("stdlib_docs")()
      self.assertIs(shared, WEB_SEARCH_BACKENDS.get("stdlib_docs")())  # one index per process
      self.assertEqual(shared.cache_dir, _CACHE)
    with self.assertRaisesRegex(ValueError, "Unknown web search backend 'nope'; known: .*stdlib_docs"):
      CodingEnv(EnvConfig(web_search_backend="nope"))


def turn(*calls: ToolCall) -> str:
  return "\n".join(render_call(c) for c in calls)


def web(query: str) -> ToolCall:
  return ToolCall(ToolName.WEB_SEARCH, {"query": query})


TASK = CodingTask(task_id="docs", prompt="Write JSON.", files={"a.py": "x = 1\n"},
                  hidden_tests={"hidden_tests/test_x.py": "import unittest\n"})


class ThroughTheEnvTest(SandboxedEnvTest):

  task = TASK

  def test_the_default_backend_answers_from_the_offline_docs(self):
    built_docs()
    with mock.patch.dict(os.environ, {"C2JAX_CACHE_DIR": _CACHE}):
      env = self.env(max_search_results=2)
      r = env.step(turn(web("serialize an object to a JSON string"), web("qqqxj zzqv")))
    self.assertIn('<result tool="web_search">\njson.dumps\n  Python 3.', r.observation)
    self.assertEqual(r.observation.split('<result tool="web_search">')[1].count("standard library docs"), 2)
    self.assertIn('<result tool="web_search">\nno matches.\n</result>', r.observation)
    self.assertEqual(r.info["step_tool_errors"], 0)

  def test_a_registered_backend_is_used_when_configured(self):
    FixedBackend.queries.clear()
    env = self.env(web_search_backend=CUSTOM, max_search_results=3, max_observation_bytes=4000)
    r = env.step(turn(web("how do I frobnicate")))
    self.assertEqual(FixedBackend.queries, [("how do I frobnicate", 3)])
    self.assertIn("result 0 for how do I frobnicate\n  fixed test backend\nsnippet 0", r.observation)
    self.assertIn("result 2 for", r.observation)
    self.assertNotIn("result 3 for", r.observation)  # the env keeps max_search_results of what a backend returns
    r = env.step('<tool name="web_search"><arg name="query"></arg></tool>')
    self.assertIn("argument 'query' is empty", r.observation)
    self.assertEqual(env._execute(web("  "))[0], False)
    self.assertLen(FixedBackend.queries, 1)


if __name__ == "__main__":
  absltest.main()
