"""Small corpora written to temporary directories for the data tests."""

import json
import os
import random
import string
import tempfile


def documents(n: int, max_len: int, seed: int = 0, alphabet: str = string.ascii_lowercase) -> list[str]:
  """n distinct random texts of 1..max_len characters (each starts with its index, so no two are equal)."""
  rng = random.Random(seed)
  out = []
  for i in range(n):
    head = f"{i}:"
    out.append(head + "".join(rng.choice(alphabet) for _ in range(rng.randint(0, max(0, max_len - len(head))))))
  return out


def write_jsonl(texts, field: str = "text", directory: str | None = None, name: str = "corpus.jsonl") -> str:
  path = os.path.join(directory or tempfile.mkdtemp(), name)
  with open(path, "w", encoding="utf-8") as f:
    for t in texts:
      f.write(json.dumps({field: t, "id": len(t)}) + "\n")
  return path
