"""The judge's canonical form (taken here, in-process, on trusted values) and the host's comparison rule: type-strict
where Python is loose, opaque for what is not a plain value, exact where it matters (NaN, -0.0, big ints)."""

import json
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


class NeverDiffers:
  """State of its own (5), an `__eq__` that always holds and an `__ne__` that never does."""

  def __init__(self):
    self.value = 5

  def __eq__(self, other):
    return True

  def __ne__(self, other):
    return False

  __hash__ = object.__hash__


def compare(ops, *operands):
  """(the truth the judge's recorder returns for the chain, whether the host agrees with its record)."""
  log = judge._LOG.fixture = []
  truth = judge.record_check(None, 1, "compare", ops, *operands)
  (_, kind, payload), = log
  return truth, canonical.decide(kind, json.loads(judge._dump(payload)), ops=ops)


_SAME = object()


class CompareTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("int_float", ("==",), 1, 1.0, True), ("list_tuple", ("==",), [1], (1,), False),
      ("nan", ("!=",), math.nan, math.nan, True), ("str_order", ("<",), "a", "b", True),
      ("list_order", (">=",), [1, 2], [1, 3], False), ("set_subset", ("<=",), {1}, {1, 2}, True),
      ("membership", ("in",), 2, [1, 2], True), ("key", ("not in",), 3, {1: 2}, True),
      ("none", ("is",), None, None, True), ("same_object", ("is",), _SAME, _SAME, True),
      ("other_object", ("is not",), _SAME, object(), True), ("chain_holds", ("<", "<"), 1, 2, lambda: 3, True),
      ("chain_stops", ("==", "=="), 1, 2, lambda: 1 / 0, False),
  )
  def test_honest_comparisons_agree(self, ops, *operands_and_truth):
    *operands, truth = operands_and_truth
    self.assertEqual(compare(ops, *operands), (truth, True))

  @parameterized.named_parameters(
      ("always_equal", ("==",), NeverDiffers(), 5), ("reversed", ("==",), 5, NeverDiffers()),
      ("never_differs", ("!=",), NeverDiffers(), 5), ("member", ("in",), NeverDiffers(), (5,)),
      ("in_a_container", ("==",), [NeverDiffers()], [5]), ("chain", ("==", "=="), 5, NeverDiffers(), lambda: 5),
      ("opaque", ("==",), Int(0), 5), ("stateless", ("==",), AlwaysEqual(), 5),
      ("bool_is_no_int", ("==",), True, 1),
  )
  def test_what_python_and_the_host_disagree_on_fails(self, ops, *operands):
    self.assertFalse(compare(ops, *operands)[1])

  def test_a_comparison_that_raised_does_not_agree(self):
    with self.assertRaises(ZeroDivisionError):
      compare(("<", "<"), 1, 2, lambda: 1 / 0)
    (_, _, payload), = judge._LOG.fixture
    self.assertFalse(canonical.decide("compare", payload, ops=("<", "<")))

  @parameterized.named_parameters(
      ("more_truths_than_pairs", {"args": [1, 1], "truths": [True, True]}),
      ("a_false_before_the_end", {"args": [1, 2, 2], "truths": [False, True]}),
      ("operands_missing", {"args": [1], "truths": [True]}), ("no_truths", {"args": [1, 1]}),
  )
  def test_malformed_compare_records(self, payload):
    with self.assertRaises(canonical.Malformed):
      canonical.decide("compare", payload, ops=("==", "=="))


if __name__ == "__main__":
  absltest.main()
