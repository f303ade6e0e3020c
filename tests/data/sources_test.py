"""Every source kind (stdlib, files, code_dir, jsonl, array_record, sft), min_bytes, the registry of kinds, and the
one-sentence errors for unknown kinds, bad keys, missing files and empty sources."""

import json
import os
import tempfile

from absl.testing import absltest, parameterized
from array_record.python.array_record_module import ArrayRecordWriter
import grain

from c2jax.data import sources
import c2jax.envs.teachers.demonstrations  # noqa: F401  (registers the "sft" kind: the tests do not depend on their order)
from c2jax.data.sources import SOURCES, open_source
from tests.data import corpora


def _write(path: str, text: str) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)


def _write_array_record(path: str, records: list[bytes]) -> str:
  writer = ArrayRecordWriter(path, "group_size:1")
  for r in records:
    writer.write(r)
  writer.close()
  return path


class SourcesTest(parameterized.TestCase):

  def test_stdlib_split_and_filters(self):
    train = open_source({"kind": "stdlib", "split": "train", "max_files": 30})
    heldout = open_source({"kind": "stdlib", "split": "heldout", "max_files": 30})
    self.assertLen(train, 30)
    self.assertEmpty(set(train) & set(heldout))
    self.assertTrue(all(isinstance(d, str) for d in train))
    long = open_source({"kind": "stdlib", "split": "train", "max_files": 10, "min_bytes": 20_000})
    self.assertLen(long, 10)
    self.assertGreaterEqual(min(sources.document_bytes(d) for d in long), 20_000)

  def test_files_and_code_dir(self):
    root = tempfile.mkdtemp()
    _write(f"{root}/a.py", "print('a')\n")
    _write(f"{root}/pkg/b.py", "x = 1\n" * 50)
    _write(f"{root}/pkg/c.rs", "fn main() {}\n")
    _write(f"{root}/pkg/notes.txt", "not code\n")
    _write(f"{root}/__pycache__/a.py", "cached\n")
    _write(f"{root}/.git/hook.py", "vcs\n")
    self.assertEqual(list(open_source({"kind": "files", "glob": f"{root}/**/*.py"})),
                     ["cached\n", "print('a')\n", "x = 1\n" * 50])  # sorted by path: __pycache__ < a.py
    code = open_source({"kind": "code_dir", "root": root, "extensions": [".py", ".rs"]})
    self.assertEqual(list(code), ["print('a')\n", "x = 1\n" * 50, "fn main() {}\n"])
    self.assertEqual(list(open_source({"kind": "code_dir", "root": root, "min_bytes": 100})), ["x = 1\n" * 50])

  def test_jsonl(self):
    texts = corpora.documents(20, 40)
    path = corpora.write_jsonl(texts, field="content")
    self.assertEqual(list(open_source({"kind": "jsonl", "path": path, "field": "content"})), texts)
    self.assertEqual(list(open_source({"kind": "jsonl", "path": [path, path], "field": "content",
                                       "min_bytes": 30})),
                     [t for t in texts if len(t) >= 30] * 2)
    with self.assertRaisesRegex(ValueError, "has no field 'text'; set 'field'"):
      open_source({"kind": "jsonl", "path": path})

  def test_token_docs(self):
    path = os.path.join(tempfile.mkdtemp(), "docs.jsonl")
    with open(path, "w") as f:
      f.write(json.dumps({"tokens": [1, 5, 6, 258, 7], "weights": [0, 0, 1, 1, 0]}) + "\n\n")
      f.write(json.dumps({"tokens": [1, 9], "weights": [0, 1]}) + "\n")
    docs = list(open_source({"kind": "token_docs", "path": path}))
    self.assertEqual(docs, [sources.TokenDocument((1, 5, 6, 258, 7), (0.0, 0.0, 1.0, 1.0, 0.0)),
                            sources.TokenDocument((1, 9), (0.0, 1.0))])
    self.assertLen(list(open_source({"kind": "token_docs", "path": path, "min_bytes": 3})), 1)
    with open(path, "a") as f:
      f.write(json.dumps({"tokens": [1, 2], "weights": [1]}) + "\n")
    with self.assertRaisesRegex(ValueError, "docs.jsonl:4 is not a token document"):
      open_source({"kind": "token_docs", "path": path})

  @parameterized.parameters(None, "body")
  def test_array_record(self, field):
    texts = corpora.documents(12, 30, alphabet="abcé")
    records = [t.encode() if field is None else json.dumps({field: t}).encode() for t in texts]
    path = _write_array_record(os.path.join(tempfile.mkdtemp(), "docs.array_record"), records)
    ds = open_source({"kind": "array_record", "paths": [path], "field": field})
    self.assertEqual(list(ds), texts)
    filtered = open_source({"kind": "array_record", "paths": path, "field": field, "min_bytes": 20})
    self.assertEqual(list(filtered), [t for t in texts if len(t.encode()) >= 20])
    with self.assertRaisesRegex(ValueError, "No record of .*docs.array_record reaches min_bytes=1000; lower"):
      open_source({"kind": "array_record", "paths": path, "field": field, "min_bytes": 1000})

  def test_sft(self):
    ds = open_source({"kind": "sft", "suite": "tiny_functions", "split": "train", "max_examples": 3})
    self.assertLen(ds, 3)
    (prompt, w0), (response, w1) = ds[0]
    self.assertEqual((w0, w1), (0.0, 1.0))
    self.assertIn("solution.py", prompt)
    self.assertTrue(response.endswith('<tool name="finish"/>'))

  def test_registered_kind(self):
    name = "test_numbers"
    if name not in SOURCES:
      SOURCES.register(name)(lambda n, min_bytes=0: grain.MapDataset.source([str(i) for i in range(n)]))
    self.assertEqual(list(open_source({"kind": name, "n": 3, "weight": 2.0})), ["0", "1", "2"])

  def test_errors(self):
    missing = os.path.join(tempfile.mkdtemp(), "nope.jsonl")
    empty = corpora.write_jsonl([])
    short = corpora.write_jsonl(["x"])
    bad = corpora.write_jsonl(["x"])
    with open(bad, "a") as f:
      f.write("{not json\n")
    cases = [
        ({"kind": "parquet", "path": "x"}, "Unknown data source kind 'parquet'; known: .*jsonl"),
        ({"path": "x"}, "has no 'kind'; known kinds"),
        ({"kind": "jsonl", "path": missing}, "Data file .*nope.jsonl' does not exist; fix 'path'"),
        ({"kind": "jsonl", "path": empty},
         "Data source 'jsonl' \\(.*corpus.jsonl\\) has no documents; point it at data or drop it"),
        ({"kind": "jsonl", "path": bad}, ":2 is not valid JSON"),
        ({"kind": "jsonl", "path": short, "min_bytes": 5}, "has no documents of at least min_bytes=5"),
        ({"kind": "jsonl", "path": short, "feild": "x"}, "has unknown key 'feild'; its keys are kind, weight, path"),
        ({"kind": "jsonl"}, "missing a required argument: 'path'"),
        ({"kind": "files", "glob": missing}, "No files match glob"),
        ({"kind": "code_dir", "root": missing}, "does not exist; set 'root'"),
        ({"kind": "sft", "suite": "realistic", "split": "train"}, "has no documents"),
        ({"kind": "stdlib", "split": "dev"}, "split='dev': use 'train' or 'heldout'"),
        ("stdlib", "must be a dict"),
    ]
    for spec, message in cases:
      with self.subTest(spec=str(spec)):
        with self.assertRaisesRegex(ValueError, message):
          open_source(spec)


if __name__ == "__main__":
  absltest.main()
