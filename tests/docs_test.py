"""The docs' structure: README's layout table against the tree, README's size budget, and every relative link.

One home per fact (docs/design/README.md): README points and never copies, so it stays small, and its layout table
names exactly the packages there are. The links of README.md and every docs/**/*.md must lead to files that exist,
so a page that moves or splits takes its links along. A measured figure has one home too: a figure written in two
of those files fails unless docs/figures_shared.txt lists it as a coincidence (the same digits, different facts),
and that list only shrinks.
"""

import pathlib
import re
import subprocess

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README_BUDGET_BYTES = 11_000
# Top-level folders that builds and runs make (.gitignore), used when the checkout has no git to ask.
_GENERATED = {"runs", "out", "build", "dist", "__pycache__"}
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# A figure: a number with a thousands comma (1,287), three or more decimals (0.889), or two decimals after a nonzero
# integer part (26.44, 1.60x). Two-decimal fractions (0.25, 0.97) are left out: a hundred values that recur by chance
# as different facts. Not a figure: a part of a version, section number or dotted name (0.10.2, 3.1.4, a1.23), whose
# neighbours are a digit-dot pair or a word character, nor a mantissa (1.97e11); units may follow (1.60x, 0.99 ms).
_FIGURE = re.compile(r"(?<![\w.,])(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d{3,}|[1-9]\d*\.\d{2})(?![.,]?\d|[eE][+-]?\d)")
SHARED_FIGURES = ROOT / "docs/figures_shared.txt"


def layout_paths(readme: str) -> list[str]:
  """The paths named (in backticks) in the first column of README's "## Layout" table."""
  if "\n## Layout\n" not in readme:
    raise AssertionError("README.md has no '## Layout' section.")
  section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
  paths = []
  for line in section.splitlines():
    if not line.startswith("|") or line.startswith("|---"):
      continue
    first = line.strip("|").split("|", 1)[0]
    paths += re.findall(r"`([^`]+)`", first)
  return paths


def top_level_folders() -> set[str]:
  """The repository's top-level folders: those holding a tracked file, or without git the visible ones that are
  not build or run outputs."""
  try:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    names = {p.split("/", 1)[0] for p in out.decode().split("\0") if "/" in p}
  except (OSError, subprocess.CalledProcessError):
    names = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in _GENERATED
             and not p.name.endswith(".egg-info")}
  return {n for n in names if not n.startswith(".")}


def relative_links(text: str) -> list[str]:
  """The targets of the markdown links of `text` that point into the repository (no scheme, not a bare anchor),
  code blocks and code spans left out, each without its #anchor."""
  text = _CODE_SPAN.sub("", _FENCE.sub("", text))
  targets = _INLINE_LINK.findall(text) + _REFERENCE_LINK.findall(text)
  return [t.split("#", 1)[0] for t in targets if not _SCHEME.match(t) and not t.startswith("#")]


def figures(text: str) -> set[str]:
  """The figures of `text` (see `_FIGURE`), code blocks and code spans left out."""
  return set(_FIGURE.findall(_CODE_SPAN.sub("", _FENCE.sub("", text))))


def shared_figures(texts: dict[str, str]) -> dict[str, tuple[str, ...]]:
  """{figure: the names (sorted) of the texts that hold it} for each figure in two or more of `texts` ({name: text})."""
  holders: dict[str, set[str]] = {}
  for name, text in texts.items():
    for figure in figures(text):
      holders.setdefault(figure, set()).add(name)
  return {f: tuple(sorted(names)) for f, names in sorted(holders.items()) if len(names) > 1}


def read_shared_list(text: str, source: str) -> dict[str, tuple[str, ...]]:
  """The allowed shared figures of a list like docs/figures_shared.txt: `figure<TAB>file,file<TAB>why`, `#` comments
  and blank lines skipped. Raises ValueError naming `source` and the line on a malformed or repeated line."""
  allowed: dict[str, tuple[str, ...]] = {}
  for number, line in enumerate(text.splitlines(), 1):
    if not line.strip() or line.startswith("#"):
      continue
    fields = line.split("\t")
    if len(fields) != 3 or not fields[2].strip() or not _FIGURE.fullmatch(fields[0]):
      raise ValueError(f"{source}:{number}: want 'figure<TAB>file,file<TAB>why it is a coincidence', got {line!r}")
    if fields[0] in allowed:
      raise ValueError(f"{source}:{number}: figure {fields[0]} is listed twice")
    allowed[fields[0]] = tuple(sorted(fields[1].split(",")))
  return allowed


def figure_violations(shared: dict[str, tuple[str, ...]], allowed: dict[str, tuple[str, ...]]) -> list[str]:
  """What breaks the one-home rule: a shared figure not allowed with exactly its files, and a stale allowed line (the
  figure no longer shared, or shared by other files), so that the list can only shrink."""
  out = [f"{f} in {', '.join(files)}: keep it in one file and point to it there, or list it as a coincidence"
         for f, files in shared.items() if allowed.get(f) != files]
  out += [f"{f} ({','.join(files)}) is allowed but not shared so: remove its line" for f, files in allowed.items()
          if shared.get(f) != files]
  return out


def doc_files() -> list[pathlib.Path]:
  """README.md and every markdown page under docs/, at any depth."""
  return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


class ReadmeTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.readme = (ROOT / "README.md").read_text(encoding="utf-8")

  def test_readme_within_budget(self):
    size = len(self.readme.encode("utf-8"))
    self.assertLessEqual(size, README_BUDGET_BYTES,
                         f"README.md is {size} bytes, over its budget of {README_BUDGET_BYTES}: move the detail to the "
                         "module docstrings, docs/usage.md or the design pages and link to it.")

  def test_layout_table_names_every_package_and_nothing_else(self):
    paths = layout_paths(self.readme)
    missing_paths = [p for p in paths if not (ROOT / p).exists()]
    self.assertEmpty(missing_paths, f"README's layout table names paths that do not exist: {missing_paths}")
    listed = {p.strip("/") for p in paths}
    packages = {f"c2jax/{d.name}" for d in (ROOT / "c2jax").iterdir() if (d / "__init__.py").is_file()}
    self.assertEmpty(sorted(packages - listed), "README's layout table lacks a row for these packages of c2jax/")
    listed_packages = {p for p in listed if re.fullmatch(r"c2jax/[^/]+", p) and (ROOT / p).is_dir()}
    self.assertEmpty(sorted(listed_packages - packages),
                     "README's layout table lists directories of c2jax/ that are not packages (no __init__.py)")
    listed_top = {p.split("/", 1)[0] for p in listed}
    self.assertEmpty(sorted(top_level_folders() - listed_top), "README's layout table lacks these top-level folders")

  def test_layout_parser_reads_the_first_column_only(self):
    text = ("# x\n\n## Layout\n\n| path | what |\n|---|---|\n| `c2jax/model/` | uses `c2jax/nowhere/` |\n"
            "| `a.py`, `b.py` | two |\n\n## Next\n\n| `c2jax/later/` | x |\n")
    self.assertEqual(layout_paths(text), ["c2jax/model/", "a.py", "b.py"])


class LinksTest(absltest.TestCase):

  def test_relative_links_resolve(self):
    broken = []
    for path in doc_files():
      text = path.read_text(encoding="utf-8")
      for target in relative_links(text):
        if not target:
          continue
        resolved = ROOT / target.lstrip("/") if target.startswith("/") else path.parent / target
        if not resolved.exists():
          broken.append(f"{path.relative_to(ROOT)} -> {target}")
    self.assertEmpty(broken, "links to files that do not exist:\n" + "\n".join(broken))

  def test_link_parser(self):
    text = ("See [usage](docs/usage.md#mesh), [paper](https://arxiv.org/abs/1), [top](#links), ![p](img/a.png \"t\").\n"
            "`[not](a/link.md)` and\n```\n[nor](this.md)\n```\n[ref]: design/page.md\n")
    self.assertEqual(relative_links(text), ["docs/usage.md", "img/a.png", "design/page.md"])


class FiguresTest(absltest.TestCase):

  def test_each_figure_has_one_home(self):
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in doc_files()}
    allowed = read_shared_list(SHARED_FIGURES.read_text(encoding="utf-8"), "docs/figures_shared.txt")
    violations = figure_violations(shared_figures(texts), allowed)
    self.assertEmpty(violations, "figures in more than one doc (docs/figures_shared.txt):\n" + "\n".join(violations))

  def test_figure_parser(self):
    text = ("pass@1 0.696 -> 0.889, 1,287 tokens, ppl 26.44, 1.60x, 0.25 and 0.5, jax 0.10.2, section 3.1.4,"
            " 2026-12-01, commit a1.234b, 1.97e11 FLOPs, `0.777` in code\n```\n0.888\n```\n1.000 and 12,345.6\n")
    self.assertEqual(figures(text), {"0.696", "0.889", "1,287", "26.44", "1.60", "1.000", "12,345.6"})

  def test_planted_copy_fails_and_a_stale_line_fails(self):
    home = "Seed 0: pass@1 0.475 -> 0.679, 92,500 tokens; a coincidence 1.000."
    copy = "The main job reached 0.679 (see main_job.md); best-of-8 1.000."
    shared = shared_figures({"docs/a.md": home, "docs/b.md": copy})
    self.assertEqual(shared, {"0.679": ("docs/a.md", "docs/b.md"), "1.000": ("docs/a.md", "docs/b.md")})
    allowed = read_shared_list("# header\n1.000\tdocs/a.md,docs/b.md\tbest-of-8 vs a coincidence\n", "t.txt")
    self.assertEqual(figure_violations(shared, allowed),
                     ["0.679 in docs/a.md, docs/b.md: keep it in one file and point to it there, or list it as a "
                      "coincidence"])
    fixed = shared_figures({"docs/a.md": home, "docs/b.md": "The main job: main_job.md, section 8; best-of-8 1.000."})
    self.assertEmpty(figure_violations(fixed, allowed))
    stale = shared_figures({"docs/a.md": home, "docs/b.md": "The main job: main_job.md, section 8."})
    self.assertEqual(figure_violations(stale, allowed),
                     ["1.000 (docs/a.md,docs/b.md) is allowed but not shared so: remove its line"])

  def test_shared_list_rejects_a_malformed_line(self):
    with self.assertRaisesRegex(ValueError, "t.txt:2: want"):
      read_shared_list("# x\n1.000 docs/a.md\n", "t.txt")
    with self.assertRaisesRegex(ValueError, "t.txt:2: figure 1.000 is listed twice"):
      read_shared_list("1.000\ta.md,b.md\tx\n1.000\ta.md,c.md\ty\n", "t.txt")


if __name__ == "__main__":
  absltest.main()
