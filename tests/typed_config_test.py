"""The one converter between plain config data and frozen dataclasses: each type's rule, errors that name the
dotted key and what it allows, round trips, and the ConfigDict form that keeps tuples overridable."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

from absl.testing import absltest
from absl.testing import parameterized

from c2jax import typed_config


class Color(enum.Enum):
  RED = "red"
  BLUE = "blue"


@dataclasses.dataclass(frozen=True)
class Inner:
  rate: float = 0.5
  color: Color = Color.RED

  def __post_init__(self):
    if not 0 <= self.rate <= 1:
      raise ValueError(f"rate={self.rate} must lie in [0, 1].")


@dataclasses.dataclass(frozen=True)
class Outer:
  name: str = "x"
  steps: int = 3
  on: bool = True
  sizes: tuple[int, ...] = (1, 2)
  weights: tuple[tuple[str, float], ...] = (("a", 1.0),)
  inner: Inner = Inner()
  phases: Mapping[str, Inner] = dataclasses.field(default_factory=dict)
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  maybe: Inner | None = None
  hidden: int = dataclasses.field(default=7, metadata={typed_config.PLAIN: False})


class TypedConfigTest(parameterized.TestCase):

  def test_converts_each_field_to_its_declared_type(self):
    got = typed_config.from_plain(Outer(), {
        "steps": 5, "on": False, "sizes": [3, 4, 5], "weights": {"a": 2, "b": 0.5},
        "inner": {"color": "BLUE"}, "phases": {"p": {"rate": 1}}, "extra": {"k": [1, "v"]},
        "maybe": {"rate": 0.25}}, "outer")
    self.assertEqual(got, Outer(steps=5, on=False, sizes=(3, 4, 5), weights=(("a", 2.0), ("b", 0.5)),
                                inner=Inner(color=Color.BLUE), phases={"p": Inner(rate=1.0)},
                                extra={"k": [1, "v"]}, maybe=Inner(rate=0.25)))
    self.assertIsInstance(got.phases["p"].rate, float)

  def test_fields_left_out_keep_the_default_and_nested_sections_merge(self):
    base = Outer(inner=Inner(rate=0.1, color=Color.BLUE))
    self.assertEqual(typed_config.from_plain(base, {"inner": {"rate": 0.2}}, "o").inner, Inner(0.2, Color.BLUE))
    self.assertIs(typed_config.from_plain(base, None, "o"), base)

  def test_round_trips_through_the_plain_form(self):
    cfg = Outer(weights=(("a", 1.0), ("b", 2.0)), phases={"p": Inner()}, maybe=Inner(rate=0.3))
    plain = typed_config.to_plain(cfg)
    self.assertEqual(plain["weights"], {"a": 1.0, "b": 2.0})  # named pairs are a mapping
    self.assertEqual(plain["sizes"], [1, 2])
    self.assertEqual(plain["inner"]["color"], "red")
    self.assertNotIn("hidden", plain)
    self.assertEqual(typed_config.from_plain(Outer(), plain, "o"), cfg)

  @parameterized.named_parameters(
      ("unknown_key", {"stpes": 1}, "o has no field 'stpes'; its fields are extra, inner, maybe, name, on, phases"),
      ("nested_unknown", {"inner": {"rat": 1}}, "o.inner has no field 'rat'; its fields are color, rate."),
      ("hidden_field", {"hidden": 1}, "o has no field 'hidden'"),
      ("bool_for_int", {"steps": True}, r"o.steps=True must be an integer\."),
      ("float_for_int", {"steps": 2.5}, r"o.steps=2.5 must be an integer\."),
      ("string_for_bool", {"on": "yes"}, r"o.on='yes' must be True or False\."),
      ("bad_enum", {"inner": {"color": "green"}}, r"o.inner.color='green' is not one of 'red', 'blue'\."),
      ("bad_item", {"sizes": [1, "x"]}, r"o.sizes\[1\]='x' must be an integer\."),
      ("not_a_list", {"sizes": 3}, r"o.sizes=3 must be a list\."),
      ("not_a_mapping", {"inner": 3}, r"o.inner=3 must be a mapping of Inner fields\."),
      ("post_init", {"phases": {"p": {"rate": 2.0}}}, r"o.phases.p: rate=2.0 must lie in \[0, 1\]\."),
      ("number_for_string", {"name": 3}, r"o.name=3 must be a string\."),
  )
  def test_refuses_in_one_sentence_naming_the_key(self, data, message):
    with self.assertRaisesRegex(ValueError, message) as caught:
      typed_config.from_plain(Outer(), data, "o")
    self.assertNotIn("\n", str(caught.exception))

  def test_the_top_level_is_named_the_config(self):
    with self.assertRaisesRegex(ValueError, "^the config has no field 'x'"):
      typed_config.from_plain(Outer(), {"x": 1}, "")

  def test_config_dict_keeps_tuples_and_flatten_lists_leaves(self):
    c = typed_config.to_config_dict(Outer())
    self.assertEqual(c.sizes, (1, 2))  # a tuple: ml_collections can override it from the command line
    self.assertEqual(typed_config.from_plain(Outer(), c, "o"), Outer())
    flat = typed_config.flatten(typed_config.to_plain(Outer(phases={"p": Inner()})))
    self.assertEqual(flat["phases.p.rate"], 0.5)
    self.assertEqual(flat["sizes"], [1, 2])
    self.assertEqual(flat["extra"], {})



@dataclasses.dataclass(frozen=True)
class Documented:
  """A section without an entry for `other`.

  Attributes:
    a, b: two fields at once (e.g. both numbers). Not part of the first sentence.
    c: one field; d / e: two more in the same entry, over
      two lines.
    inner: a nested section.
  """

  a: int = 1
  b: int = 2
  c: str = "x"
  d: float = 0.5
  e: bool = False
  other: int = 0
  inner: Inner = Inner()
  phases: Mapping[str, Inner] = dataclasses.field(default_factory=lambda: {"p": Inner(rate=0.25)})
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class FieldHelpTest(absltest.TestCase):
  """What `--config_help` prints comes from the dataclasses: each field's first docstring sentence, value and
  default."""

  def test_docs_of_shared_and_semicolon_entries(self):
    docs = typed_config.field_docs(Documented)
    self.assertEqual(docs["a"], "two fields at once (e.g. both numbers).")
    self.assertEqual(docs["b"], docs["a"])
    self.assertEqual(docs["c"], "one field")
    self.assertEqual(docs["d"], "two more in the same entry, over two lines.")
    self.assertEqual(docs["e"], docs["d"])
    self.assertNotIn("other", docs)

  def test_every_leaf_with_value_default_and_doc(self):
    cfg = dataclasses.replace(Documented(), a=7, inner=Inner(color=Color.BLUE), extra={"k": {"j": 3}})
    got = {h.key: h for h in typed_config.field_help(cfg)}
    self.assertEqual(list(got), ["a", "b", "c", "d", "e", "other", "inner.rate", "inner.color", "phases.p.rate",
                                 "phases.p.color", "extra.k.j"])
    self.assertEqual((got["a"].value, got["a"].default), (7, 1))
    self.assertEqual((got["inner.color"].value, got["inner.color"].default), ("blue", "red"))
    self.assertEqual((got["phases.p.rate"].value, got["phases.p.rate"].default), (0.25, 0.25))
    self.assertIs(got["extra.k.j"].default, typed_config.NO_DEFAULT)
    self.assertEqual(got["other"].doc, "A section without an entry for `other`.")  # the section's first line
    self.assertEqual(got["inner.rate"].doc, "")  # Inner has no docstring of its own


if __name__ == "__main__":
  absltest.main()
