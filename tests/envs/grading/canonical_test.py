"""The judge's canonical form (taken here, in-process, on trusted values) and the host's comparison rule: type-strict
where Python is loose, opaque for what is not a plain value, exact where it matters (NaN, -0.0, big ints)."""

import math

from absl.testing import absltest
from absl.testing import parameterized

from c2jax.envs.grading import canonical
from c2jax.envs.grading import judge


def plain(value):
  """What the host sees of `value` recorded by the judge."""
  return canonical.decode(judge.canonical(value))


def check(kind, *operands, **payload):
  return canonical.decide(kind, {"args": [judge.canonical(o) for o in operands], **payload})


class AlwaysEqual:

  def __eq__(self, other):
    return True

  __hash__ = object.__hash__


class Int(int):

  def __eq__(self, other):
    return True

  __hash__ = int.__hash__


class Point:

  def __init__(self, x, y):
    self.x, self.y = x, y


class Slotted:
  __slots__ = ("a",)

  def __init__(self, a):
    self.a = a


class CanonicalTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("int_float", 100, 100.0, True),
      ("bool_int", True, 1, False),
      ("bool_bool", False, False, True),
      ("zero_signs", -0.0, 0.0, True),
      ("nan", math.nan, math.nan, False),
      ("nan_in_list", [math.nan], [math.nan], False),
      ("inf", math.inf, math.inf, True),
      ("big_int", 2 ** 200 + 1, 2 ** 200 + 1, True),
      ("big_int_float", 2 ** 53 + 1, float(2 ** 53), False),
      ("str_bytes", "a", b"a", False),
      ("list_tuple", [1, 2], (1, 2), False),
      ("nested", {"a": [1, (2, 3)], "b": {1, 2}}, {"b": {2, 1}, "a": [1.0, (2, 3)]}, True),
      ("set_frozenset", {1, 2}, frozenset({1, 2}), True),
      ("dict_bool_key", {True: 1}, {1: 1}, False),
      ("none", None, None, True),
      ("none_zero", None, 0, False),
      ("always_equal", AlwaysEqual(), 5, False),
      ("always_equal_both", AlwaysEqual(), AlwaysEqual(), False),  # no state of its own: opaque, never equal
      ("int_subclass", Int(3), 3, False),
      ("int_subclasses", Int(3), Int(4), False),  # opaque: never equal, not even to each other
      ("objects", Point(1, [2]), Point(1, [2]), True),
      ("objects_differ", Point(1, [2]), Point(1, [3]), False),
      ("object_vs_dict", Point(1, 2), {"x": 1, "y": 2}, False),
      ("slots", Slotted(1), Slotted(1.0), True),
      ("function", len, len, False),
  )
  def test_equality(self, a, b, equal):
    self.assertEqual(canonical.equal(plain(a), plain(b)), equal)
    self.assertEqual(check("assertEqual", a, b), equal)

  def test_bounds_make_opaque(self):
    self.assertIsInstance(plain(list(range(judge.MAX_NODES + 1))), canonical.Opaque)
    self.assertIsInstance(plain("x" * (judge.MAX_CHARS + 1)), canonical.Opaque)
    deep = []
    for _ in range(judge.MAX_DEPTH + 2):
      deep = [deep]
    self.assertIsInstance(plain(deep), canonical.Opaque)
    loop = []
    loop.append(loop)
    self.assertIsInstance(plain(loop), canonical.Opaque)

  def test_ordering_and_membership(self):
    self.assertTrue(check("assertGreaterEqual", 5, 4.5))
    self.assertFalse(check("assertLess", True, 2))  # bools are not numbers here
    self.assertTrue(check("assertIn", 1.0, [0, 1]))
    self.assertFalse(check("assertIn", True, [0, 1]))
    self.assertTrue(check("assertIn", "b", "abc"))
    self.assertTrue(check("assertNotIn", "z", {"a": 1}))
    self.assertFalse(check("assertIn", AlwaysEqual(), [1]))
    # An opaque container answers for itself: the judge's in-process fact.
    self.assertTrue(check("assertIn", "a", object(), facts={"contains": True}))
    self.assertFalse(check("assertIn", "a", object()))

  def test_other_kinds(self):
    self.assertTrue(check("assertTrue", [0]))
    self.assertFalse(check("assertTrue", AlwaysEqual()))  # no truth fact recorded: undecidable, fails
    self.assertTrue(check("assertAlmostEqual", 0.1 + 0.2, 0.3))
    self.assertFalse(check("assertAlmostEqual", 1.0, 1.1, kw={"places": judge.canonical(2), "delta": None}))
    self.assertTrue(check("assertAlmostEqual", 1.0, 1.1, kw={"places": None, "delta": judge.canonical(0.2)}))
    self.assertTrue(check("assertIsNone", None))
    self.assertTrue(check("assertIsNotNone", AlwaysEqual()))
    self.assertTrue(check("assertIs", True, True))
    self.assertFalse(check("assertIs", 1, True))
    self.assertTrue(check("assertRegex", "abc", "b."))
    self.assertTrue(check("assertCountEqual", [1, 2, 2], (2, 1, 2)))
    self.assertFalse(check("assertListEqual", [1], (1,)))
    self.assertFalse(canonical.decide("fail", {}))

  def test_raises(self):
    raised = ["builtins.KeyError", "builtins.LookupError", "builtins.Exception"]
    self.assertTrue(canonical.decide("assertRaises", {"expected": ["builtins.LookupError"], "raised": raised}))
    self.assertFalse(canonical.decide("assertRaises", {"expected": ["builtins.ValueError"], "raised": raised}))
    self.assertFalse(canonical.decide("assertRaises", {"expected": ["builtins.ValueError"], "raised": None}))
    self.assertTrue(canonical.decide("assertRaisesRegex", {"expected": ["builtins.KeyError"], "raised": raised,
                                                           "regex": "^'k", "message": "'k'"}))

  @parameterized.named_parameters(
      ("not_a_dict", "assertEqual", [1, 1]),
      ("bad_arity", "assertEqual", {"args": [1]}),
      ("bad_tag", "assertEqual", {"args": [{"zz": 1}, 1]}),
      ("two_tags", "assertEqual", {"args": [{"f": "1.0", "t": []}, 1]}),
      ("bad_float", "assertEqual", {"args": [{"f": "one"}, 1]}),
      ("unknown_kind", "assertMagic", {"args": []}),
      ("is_without_fact", "assertIs", {"args": [[1], [1]]}),
      ("raises_without_names", "assertRaises", {"expected": "ValueError", "raised": None}),
  )
  def test_malformed(self, kind, payload):
    with self.assertRaises(canonical.Malformed):
      canonical.decide(kind, payload)


if __name__ == "__main__":
  absltest.main()
