"""The docs' structure: README's layout table against the tree, README's size budget, and every relative link.

One home per fact (docs/design/README.md): README points and never copies, so it stays small, and its layout table
names exactly the packages there are. The links of README.md, docs/*.md, docs/design/*.md and docs/experiments/*.md
must lead to files that exist, so a page that moves or splits takes its links along.
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


def doc_files() -> list[pathlib.Path]:
  return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
          *sorted((ROOT / "docs/design").glob("*.md")), *sorted((ROOT / "docs/experiments").glob("*.md"))]


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


if __name__ == "__main__":
  absltest.main()
