"""The host's one way to parse Python text: model-written files (search_code's units, lint), hidden
tests (grading's instrumentation) and task sources, all under one process-wide lock.

  tree = host_ast.parse(text, filename="pkg/mod.py")       # raises host_ast.Unparsable for any bad file
  with host_ast.AST_LOCK:                                   # a third-party parser (pyflakes) called directly
    ...

Why one lock. CPython 3.11 converts a parsed tree into `ast` objects with one recursion counter per interpreter,
not per thread; two threads parsing at once interleave their increments, and the one that finishes second raises
`SystemError: AST constructor recursion depth mismatch` (seen when an actor graded in `reward_workers` threads
while its tool workers ran search_code). So every `ast.parse`, `ast.unparse` and `compile` of Python text in the
host process holds `AST_LOCK` (tests/sandbox/host_ast_test.py checks that no other module of the library calls
them); each takes milliseconds for files of the sizes the tools admit.

Why one error. A file the model wrote can fail to parse in more ways than SyntaxError: NUL bytes and bad
encodings (ValueError), nesting past the parser's or the AST constructor's limits (RecursionError, and
SystemError on CPython 3.11), trees too big for memory (MemoryError). Each of them is that file's failure, never
the caller's: `parse` raises `Unparsable` (a ValueError naming the file) for all of them.
"""

from __future__ import annotations

import ast
import functools
import threading

# Reentrant: a serialized function may call `parse` (grading's instrumentation parses inside its own lock).
AST_LOCK = threading.RLock()
# What a hostile or broken file can make the parser raise (see the module docstring).
_PARSE_FAILURES = (SyntaxError, ValueError, RecursionError, MemoryError, SystemError)


class Unparsable(ValueError):
  """A source the parser refused, for any reason; the message names the file and the reason in one sentence."""


def parse(source: str, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
  """`ast.parse(source, filename, mode)` under AST_LOCK.

  Raises:
    Unparsable: the source does not parse, is too deeply nested, or too big to hold as a tree.
  """
  with AST_LOCK:
    try:
      return ast.parse(source, filename=filename, mode=mode)
    except _PARSE_FAILURES as e:
      reason = e.msg if isinstance(e, SyntaxError) else f"{type(e).__name__}: {e}"
      raise Unparsable(f"{filename} does not parse as Python ({str(reason)[:200]}).") from None


def unparse(tree: ast.AST) -> str:
  """`ast.unparse(tree)` under AST_LOCK (it recurses through the same counters)."""
  with AST_LOCK:
    return ast.unparse(tree)


def serialized(fn):
  """`fn` run under AST_LOCK: for code that calls a parser it does not own (pyflakes' `api.check`)."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with AST_LOCK:
      return fn(*args, **kwargs)
  return wrapped
