"""Every relative link of the front door and the docs resolves; the front door stays one.

The pages: README.md, docs/*.md, experiments/*/README.md, benchmarks/results/*/README.md. A
link `[text](target)` that is not a URL must name a file or folder that exists, relative to
the page; `target#anchor` into a Markdown page must name one of its headings, slugged as
GitHub slugs them (lower case; spaces → `-`; every character but letters, digits, `-` and `_`
dropped).
"""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def pages() -> list[str]:
  pats = ["README.md", "docs/*.md", "experiments/*/README.md", "benchmarks/results/*/README.md"]
  return sorted(p for pat in pats for p in glob.glob(os.path.join(ROOT, pat)))


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: `## The tiny default (3.11)` → `the-tiny-default-311`."""
  text = re.sub(r"[`*_]{1,2}(?=\S)|(?<=\S)[`*_]{1,2}", "", heading.strip()).lower()
  return re.sub(r"[^\w\- ]", "", text, flags=re.UNICODE).replace(" ", "-")


def anchors(path: str) -> set[str]:
  """The anchors of a Markdown file's headings (a repeated heading's copies get `-1`, `-2`)."""
  text = FENCE.sub("", open(path, encoding="utf-8").read())
  out, seen = set(), {}
  for h in re.findall(r"^#{1,6} +(.+?) *#* *$", text, re.M):
    s = slug(h)
    n = seen.get(s, 0)
    out.add(s if n == 0 else f"{s}-{n}")
    seen[s] = n + 1
  return out


def broken(path: str) -> list[str]:
  """The relative links of one page that do not resolve, as `target (why)`."""
  text = FENCE.sub("", open(path, encoding="utf-8").read())
  out = []
  for target in LINK.findall(text):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
      continue
    file, _, anchor = target.partition("#")
    dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
    if not os.path.exists(dest):
      out.append(f"{target} (no such file)")
    elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
      out.append(f"{target} (no heading #{anchor})")
  return out


def test_slugs_follow_github():
  assert slug("Page faults on CPU: glibc malloc and XLA's buffers (2026-12-02)") == (
      "page-faults-on-cpu-glibc-malloc-and-xlas-buffers-2026-12-02")
  assert slug("One 16 GB accelerator (Colab): LoRA") == "one-16-gb-accelerator-colab-lora"
  assert slug("The `tpu` extra") == "the-tpu-extra"


def test_a_broken_link_is_found(tmp_path):
  (tmp_path / "b.md").write_text("# Here\n")
  page = tmp_path / "a.md"
  page.write_text("[ok](b.md#here) [bad](b.md#there) [gone](c.md) [web](https://x.org/y)\n"
                  "```\n[in a fence](nowhere.md)\n```\n")
  assert broken(str(page)) == ["b.md#there (no heading #there)", "c.md (no such file)"]


def test_the_readme_is_a_front_door():
  """Issue 54: at most 250 lines and one table (the headline figures); results live on the
  pages it links to."""
  raw = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  assert len(raw.splitlines()) <= 250
  tables = re.findall(r"^\|[-|: ]+\|$", FENCE.sub("", raw), re.M)
  assert len(tables) <= 1, "one table at most: the headline"


@pytest.mark.parametrize("page", [os.path.relpath(p, ROOT) for p in pages()])
def test_relative_links_resolve(page):
  assert not broken(os.path.join(ROOT, page)), f"{page}: broken links"
