"""search_code: code-aware tokens, units cut along Python's syntax, a paraphrased query finding its function, an index
rebuilt exactly when the repository changed, bounded results, and the tool through the environment over the real
sandbox (whose host-side walk follows no symlink)."""

import resource
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.tools import code_search
from c2jax.sandbox import sandbox as sandbox_lib
from c2jax.envs.tools.code_search import CodeSearch, chunk_file, render, tokens
from c2jax.envs.tasks.coding_tasks import Category, CodingTask
from c2jax.envs.core.env import CodingEnv, EnvConfig
from c2jax.envs.tools.protocol import ToolCall, ToolName, render as render_call
from tests.envs.tools.sandboxed_env import SandboxedEnvTest

PARSING = '''"""Reading times written by people and by machines."""

import datetime


def parse_iso_timestamp(text: str) -> datetime.datetime:
    """Return the moment an ISO 8601 text such as '2024-01-31T12:00:00' names."""
    day, _, clock = text.partition("T")
    year, month, dom = (int(x) for x in day.split("-"))
    hour, minute, second = (int(x) for x in (clock or "0:0:0").split(":"))
    return datetime.datetime(year, month, dom, hour, minute, second)


def format_duration(seconds: float) -> str:
    """Write a number of seconds as 1h02m03s."""
    minutes, s = divmod(int(seconds), 60)
    h, m = divmod(minutes, 60)
    return f"{h}h{m:02d}m{s:02d}s"
'''

CLIENT = '''class HttpClient:
    """A tiny HTTP client with retries."""

    retries = 3

    def get(self, url):
        """Fetch a URL and return the response body."""
        return self._retry("GET", url)

    @staticmethod
    def _retry(method, url):
        return method, url
'''

# Several files, with distractors that share words with the queries (parse, string, text, format).
REPO = {
    "timeutil/__init__.py": "",
    "timeutil/parsing.py": PARSING,
    "config/loader.py": ('def parse_config_line(line):\n'
                         '    """Split a \'key = value\' line into its key and its value."""\n'
                         '    key, _, value = line.partition("=")\n    return key.strip(), value.strip()\n\n\n'
                         'def load_config(path):\n    with open(path) as f:\n'
                         '        return dict(parse_config_line(x) for x in f if "=" in x)\n'),
    "net/client.py": CLIENT,
    "text/slug.py": ('def slugify(title):\n    """Lower-case a title and join its words with dashes, for URLs."""\n'
                     '    return "-".join(title.lower().split())\n\n\ndef count_words(text):\n'
                     '    return len(text.split())\n'),
    "README.md": "# tools\n\nSmall helpers: time parsing, configuration files, an HTTP client and text utilities.\n",
    "broken.py": "def half_written(:\n    return the string\n",
}


class TokensAndUnitsTest(parameterized.TestCase):

  def test_identifiers_are_split_spelled_out_and_folded(self):
    got = tokens("def parseISOTimestamp(obj_str): HTTPServer copytree the dates")
    for want in ("def", "pars", "iso", "timestamp", "parseisotimestamp", "object", "str", "obj_str", "http",
                 "server", "httpserver", "copytre", "dat"):
      self.assertIn(want, got)
    self.assertNotIn("the", got)  # a function word
    self.assertEqual(tokens("parse parses parsed parsing"), ["pars"] * 4)
    self.assertEqual(tokens("? ! a"), [])

  def test_python_is_cut_along_its_syntax(self):
    chunks = chunk_file("net/client.py", CLIENT)
    self.assertEqual([(c.name, c.start, c.end) for c in chunks],
                     [("HttpClient", 1, 5), ("HttpClient.get", 6, 8), ("HttpClient._retry", 10, 12)])
    lines = CLIENT.splitlines()
    for c in chunks:
      self.assertEqual(c.text, "\n".join(lines[c.start - 1:c.end]))
    self.assertEqual(chunks[2].text.splitlines()[0], "    @staticmethod")  # decorators belong to their function
    # The module docstring and imports between units land in a window; the functions are units.
    names = [(c.name, c.start, c.end) for c in chunk_file("timeutil/parsing.py", PARSING)]
    self.assertEqual(names, [("", 1, 5), ("parse_iso_timestamp", 6, 11), ("format_duration", 14, 18)])
    # Lines as Python's parser counts them: a form feed does not end a line.
    window, f = chunk_file("ff.py", 'import os\n\x0c\ndef f():\n    """Doc one. More."""\n    return 1\n')
    self.assertEqual((window.start, window.end, f.name, f.start, f.end, f.doc), (1, 2, "f", 3, 5, "Doc one."))
    self.assertEqual([c.name for c in chunk_file("one.py", "class A: x = 1\nclass B:\n  def g(self): pass\n")],
                     ["A", "B", "B.g"])

  def test_other_files_and_broken_python_are_cut_in_overlapping_windows(self):
    text = "\n".join(f"line {i}" for i in range(1, 101))
    for path in ("notes.txt", "broken.py"):
      chunks = chunk_file(path, text if path == "notes.txt" else "def f(:\n" + text)
      self.assertTrue(all(c.name == "" for c in chunks))
      self.assertEqual(chunks[0].start, 1)
      self.assertEqual(chunks[-1].end, 100 if path == "notes.txt" else 101)
      for a, b in zip(chunks, chunks[1:]):
        self.assertEqual(b.start, a.start + code_search.WINDOW_STRIDE)
        self.assertLessEqual(a.end - a.start + 1, code_search.WINDOW_LINES)
    self.assertEqual(chunk_file("empty.py", ""), [])
    self.assertEqual(chunk_file("blank.txt", "\n\n  \n"), [])


class RankingTest(parameterized.TestCase):

  @parameterized.parameters(
      ("parse a date string", "timeutil/parsing.py", "parse_iso_timestamp"),
      ("turn seconds into a readable duration", "timeutil/parsing.py", "format_duration"),
      ("make a url slug from a title", "text/slug.py", "slugify"),
      ("how many words are in a text", "text/slug.py", "count_words"),
      ("get the response body of a url", "net/client.py", "HttpClient.get"),
  )
  def test_a_paraphrased_query_ranks_its_function_first(self, query, path, name):
    hits = CodeSearch().search(REPO, query, 3)
    self.assertEqual((hits[0][0].path, hits[0][0].name), (path, name), [(c.path, c.name, s) for c, s in hits])
    self.assertEqual([s for _, s in hits], sorted((s for _, s in hits), reverse=True))

  def test_results_render_as_headers_and_snippets(self):
    out = render(CodeSearch().search(REPO, "parse a date string", 2))
    first = out.split("\n\n")[0].splitlines()
    self.assertEqual(first[0], "timeutil/parsing.py:6-11 (parse_iso_timestamp)")
    self.assertEqual(first[1], "def parse_iso_timestamp(text: str) -> datetime.datetime:")
    self.assertEqual(render([]), "no matches.")

  def test_the_index_is_rebuilt_exactly_when_a_file_changed(self):
    search = CodeSearch()
    search.search(REPO, "parse a date string", 3)
    search.search(dict(REPO), "slug", 3)  # same paths and contents: the cached index
    self.assertEqual(search.builds, 1)
    changed = dict(REPO, **{"geo/distance.py": 'def haversine_km(a, b):\n    """Great-circle distance between two '
                                               'latitude/longitude points."""\n    return 0.0\n'})
    hits = search.search(changed, "distance between two points on the globe", 1)
    self.assertEqual(search.builds, 2)
    self.assertEqual(hits[0][0].name, "haversine_km")
    renamed = dict(REPO)
    renamed["text/slugs.py"] = renamed.pop("text/slug.py")  # the same content under another path is a change
    self.assertEqual(search.search(renamed, "slug", 1)[0][0].path, "text/slugs.py")
    self.assertEqual(search.builds, 3)
    self.assertNotEqual(code_search.fingerprint({"a": "bc"}), code_search.fingerprint({"ab": "c"}))

  def test_an_edit_cuts_only_the_edited_file_again(self):
    search = CodeSearch()
    search.search(REPO, "parse a date string", 3)
    edited = dict(REPO, **{"timeutil/parsing.py": REPO["timeutil/parsing.py"] + "\ndef tomorrow():\n    pass\n"})
    with mock.patch.object(code_search, "chunk_file", wraps=code_search.chunk_file) as cut:
      hits = search.search(edited, "tomorrow", 1)
    self.assertEqual([c.args[0] for c in cut.call_args_list], ["timeutil/parsing.py"])
    self.assertEqual(hits[0][0].name, "tomorrow")
    self.assertEqual(search.builds, 2)

  def test_empty_and_wordless_queries_are_errors_and_unknown_words_match_nothing(self):
    search = CodeSearch()
    with self.assertRaisesRegex(ValueError, r"^the query is empty; .*\.$"):
      search.search(REPO, "  ", 3)
    with self.assertRaisesRegex(ValueError, "no words to search for"):
      search.search(REPO, "?! a", 3)
    self.assertEqual(search.search(REPO, "qqqxj", 3), [])
    self.assertEqual(CodeSearch().search({}, "parse", 3), [])

  def test_output_is_bounded(self):
    long_lines = "\n".join(f"    value_{i} = '{'y' * 1000}'" for i in range(100))
    files = {f"m{j}.py": f"def big_{j}():\n    '''Make many values.'''\n{long_lines}\n" for j in range(8)}
    hits = CodeSearch().search(files, "make many values", 3)
    self.assertLen(hits, 3)
    out = render(hits)
    for block in out.split("\n\n"):
      lines = block.splitlines()
      self.assertLessEqual(len(lines), code_search.SNIPPET_LINES + 2)
      self.assertTrue(all(len(x) <= code_search.SNIPPET_LINE_CHARS + 6 for x in lines))
      self.assertEqual(lines[-1], f"[... {102 - code_search.SNIPPET_LINES} more lines]")
    self.assertLess(len(out), 3 * (code_search.SNIPPET_LINES + 2) * (code_search.SNIPPET_LINE_CHARS + 7))

  def test_binary_huge_and_cache_files_are_not_indexed(self):
    files = {"data.py": "def needle_finder():\n    return '\0'\n",
             "big.py": "def needle_finder():\n    pass\n" + "#" * code_search.MAX_FILE_BYTES,
             "__pycache__/m.py": "def needle_finder():\n    pass\n",
             "ok.py": "def needle_finder():\n    pass\n"}
    self.assertEqual([c.path for c, _ in CodeSearch().search(files, "needle finder", 5)], ["ok.py"])

  def test_a_large_repository_adds_the_latent_term_and_stays_deterministic(self):
    topics = ["parse a date", "open a socket", "sort the rows", "hash a password", "draw a chart"]
    files = {f"pkg/mod_{i}.py": "".join(
        f"def {topics[(i + j) % 5].split()[0]}_{topics[(i + j) % 5].split()[-1]}_{i}_{j}(x):\n"
        f"    '''Helper {j} to {topics[(i + j) % 5]}.'''\n    return x\n\n\n" for j in range(5))
        for i in range(50)}
    files["pkg/special.py"] = ("def hash_password_with_salt(pw, salt):\n    '''Salted password digest.'''\n"
                               "    return pw\n")
    a, b = CodeSearch(), CodeSearch()
    hits = a.search(files, "password digest with a salt", 5)
    self.assertIsNotNone(a._index._lsa)  # 251 units: past LSA_MIN_DOCUMENTS
    self.assertEqual(hits[0][0].name, "hash_password_with_salt")
    self.assertEqual(hits, b.search(files, "password digest with a salt", 5))
    self.assertIsNone(CodeSearch()._index)
    small = CodeSearch()
    small.search(REPO, "parse", 1)
    self.assertIsNone(small._index._lsa)  # a handful of units: lexical only


TASK = CodingTask(task_id="search", prompt="Find the date parser.", category=Category.FEATURE,
                  files=REPO, hidden_tests={"hidden_tests/test_x.py": "import unittest\n"})


def turn(*calls: ToolCall) -> str:
  return "\n".join(render_call(c) for c in calls)


def search(query: str) -> ToolCall:
  return ToolCall(ToolName.SEARCH_CODE, {"query": query})


class ThroughTheEnvTest(SandboxedEnvTest):

  task = TASK

  def test_search_finds_code_sees_writes_and_reports_no_matches(self):
    env = self.env()
    r = env.step(turn(search("parse a date string")))
    self.assertIn('<result tool="search_code">\ntimeutil/parsing.py:6-11 (parse_iso_timestamp)\n', r.observation)
    self.assertEqual(r.info["step_tool_errors"], 0)
    builds = env._code_search.builds  # 0 or 1: a pooled worker may hold this repository's index already
    # A file written through the env, and one the sandboxed code wrote, are found at the next search.
    r = env.step(turn(
        ToolCall(ToolName.WRITE_FILE, {"path": "geo/distance.py",
                                       "content": "def haversine_km(a, b):\n    return 0.0\n"}),
        ToolCall(ToolName.RUN, {"command": "printf 'def bake_sourdough_bread():\\n    pass\\n' > bakery.py"}),
        search("haversine km"), search("bake bread"), search("qqqxj")))
    self.assertIn("geo/distance.py:1-2 (haversine_km)", r.observation)
    self.assertIn("bakery.py:1-2 (bake_sourdough_bread)", r.observation)
    self.assertIn('<result tool="search_code">\nno matches.\n</result>', r.observation)
    self.assertEqual(env._code_search.builds, builds + 1)  # the unchanged repository of the last two: one index

  def test_symlinks_out_of_the_workdir_are_not_followed(self):
    env = self.env()
    r = env.step(turn(ToolCall(ToolName.RUN, {"command": "ln -s /etc/passwd passwd.py && ln -s /etc etc && "
                                                         "mkdir -p d && ln -s / d/root && ls -l passwd.py"}),
                      search("root nobody bin bash passwd"), search("parse a date string")))
    self.assertIn("passwd.py -> /etc/passwd", r.observation)  # the links exist inside
    self.assertNotIn("root:x:0", r.observation)
    self.assertNotIn("passwd.py:", r.observation)
    self.assertNotIn("etc/", r.observation.split("search_code")[1])
    self.assertIn("timeutil/parsing.py:6-11 (parse_iso_timestamp)", r.observation)  # the repository still is

  def test_results_are_bounded_and_errors_are_observations(self):
    env = self.env(max_search_results=2, max_observation_bytes=600)
    r = env.step(turn(search("text")))
    body = r.observation.split('<result tool="search_code">\n')[1]
    self.assertLessEqual(body.count(".py:"), 2)
    self.assertLess(len(r.observation.encode()), 900)
    # An empty query is refused by the parser (a malformed call); the tool itself refuses one too.
    r = env.step('<tool name="search_code"><arg name="query"> </arg></tool>')
    self.assertIn("argument 'query' is empty", r.observation)
    self.assertEqual(r.info["step_malformed_tool_calls"], 1)
    self.assertEqual(env._execute(search(" ")), (False, "the query is empty; describe the code to find, e.g. "
                                                        "'parse a date string'."))
    r = env.step(turn(search("?!")))
    self.assertIn('<error tool="search_code">\nthe query', r.observation)
    with self.assertRaisesRegex(ValueError, "max_search_results"):
      CodingEnv(EnvConfig(max_search_results=0))

  def test_sandbox_files_skips_big_files_unread(self):
    with sandbox_lib.Sandbox({"a.py": "x = 1\n", "big.txt": "z" * 5000}) as box:
      self.assertEqual(box.files(max_file_bytes=4096), {"a.py": "x = 1\n"})
      self.assertEqual(set(box.files()), {"a.py", "big.txt"})


def hostile_files(kind: str, total: int = 1 << 20) -> dict[str, str]:
  """`total` bytes of model-written Python in files of at most 200 KB, built to make indexing expensive."""
  files, i = {}, 0
  while sum(map(len, files.values())) < total:
    size = min(200_000, total - sum(map(len, files.values())))
    if kind == "long_signatures":  # every signature line cut into character n-grams
      unit = lambda k: f"def g{i}_{k}(" + ",".join(f"p{k}_{j}" for j in range(300)) + "): pass\n"
    elif kind == "tiny_functions":  # a unit per 20 bytes
      unit = lambda k: f"def f{i}_{k}(): pass\n"
    elif kind == "tiny_methods":
      unit = lambda k: ("class C:\n" if k == 0 else "") + f"  def m{i}_{k}(s): return s{k}\n"
    elif kind == "nested_functions":  # deep expressions in many small functions
      unit = lambda k: f"def n{i}_{k}(a):\n  return " + "[" * 60 + f"a{k}" + "]" * 60 + "\n"
    elif kind == "huge_names":  # functions named by one huge camelCase identifier each, on one huge line
      unit = lambda k: "def " + "".join(f"Word{i}X{k}y{j}" for j in range(600)) + "(): pass\n"
    parts, n, k = [], 0, 0
    while n < size:
      parts.append(unit(k))
      n, k = n + len(parts[-1]), k + 1
    files[f"pkg/m{i}.py"] = "".join(parts)
    i += 1
  return files


def _host_rss_mb() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def _host_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)  # this process alone, not its children
  return usage.ru_utime + usage.ru_stime


class SearchBudgetAttackTest(SandboxedEnvTest, parameterized.TestCase):
  """A policy writes ~1 MB of Python built to make search_code's index expensive, then searches: the host
  process's time and memory stay the same whatever the files hold, and a call past its budget is the tool's error,
  counted, within the episode's time left."""

  task = TASK
  KINDS = ("long_signatures", "tiny_functions", "tiny_methods", "nested_functions", "huge_names")

  def _write(self, env, files):
    r = env.step(turn(*[ToolCall(ToolName.WRITE_FILE, {"path": p, "content": c}) for p, c in files.items()]))
    self.assertEqual(r.info["step_tool_errors"], 0)

  @parameterized.named_parameters(*[(k, k) for k in KINDS])
  def test_indexing_costs_the_host_process_nothing(self, kind):
    env = self.env(max_tokens=1 << 30)
    env.step(turn(search("parse a date string")))  # the environment's search is up
    self._write(env, hostile_files(kind))
    rss, cpu = _host_rss_mb(), _host_cpu_s()
    r = env.step(turn(search("return the value")))
    # The host read the files and sent them (~0.1 s); the index was built elsewhere, and is held elsewhere.
    self.assertLess(_host_cpu_s() - cpu, 1.5)
    self.assertLess(_host_rss_mb() - rss, 48)
    self.assertIn("search_code", r.observation)
    self.assertEqual(r.info["step_tool_errors"], int("<error tool=\"search_code\">" in r.observation))

  @parameterized.named_parameters(*[(k, k) for k in KINDS[:3]])
  def test_a_call_past_the_episodes_time_left_is_a_counted_tool_error(self, kind):
    env = self.env(max_tool_s=60.0, max_tokens=1 << 30)
    env.step(turn(search("parse a date string")))
    self._write(env, hostile_files(kind, 4 << 20))
    env._tool_s = env.config.max_tool_s - 0.3  # 0.3 s of tool time left: less than parsing 4 MB takes
    t0 = time.monotonic()
    r = env.step(turn(search("return the value")))
    self.assertLess(time.monotonic() - t0, 3.0)  # the 0.3 s, and the host reading and sending 4 MB
    self.assertIn('<error tool="search_code">\nsearch_code stopped: indexing this repository took over',
                  r.observation)
    self.assertEqual(r.info["step_tool_errors"], 1)
    self.assertEqual(r.info["tool_errors"], 1)
    self.assertTrue(r.done)
    self.assertEqual(r.info["done_reason"], "time_budget")

  def test_a_build_past_its_memory_budget_is_a_counted_tool_error(self):
    from c2jax.envs.tools import bounded_search  # here: the other tests of the file need only the env
    memory = bounded_search.MEMORY_BYTES
    bounded_search.MEMORY_BYTES = 24 << 20
    self.addCleanup(setattr, bounded_search, "MEMORY_BYTES", memory)
    env = self.env(max_tokens=1 << 30)
    self._write(env, hostile_files("tiny_functions", 2 << 20))
    r = env.step(turn(search("return the value"), search("parse a date string")))
    self.assertIn('<error tool="search_code">\nsearch_code stopped: indexing this repository took over',
                  r.observation)
    self.assertEqual(r.info["step_tool_errors"], 2)  # the next call's fresh worker meets the same cap
    self.assertFalse(r.done)

  def test_a_query_of_a_whole_file_is_refused_by_both_searches(self):
    env = self.env(max_tokens=1 << 30)
    for tool in (ToolName.SEARCH_CODE, ToolName.WEB_SEARCH):
      r = env.step(turn(ToolCall(tool, {"query": "parse date " * 2000})))
      self.assertIn(f'<error tool="{tool.value}">\nthe query has 22000 characters', r.observation)
      self.assertEqual(r.info["step_tool_errors"], 1)


if __name__ == "__main__":
  absltest.main()
