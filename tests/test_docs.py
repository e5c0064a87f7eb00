"""The docs' Python snippets run (in order, one namespace per page) and their pictures exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.glob("*.md"))


def _snippets(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def test_docs_exist_and_have_snippets():
    assert PAGES and sum(len(_snippets(p)) for p in PAGES) >= 8


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_snippets_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, code in enumerate(_snippets(page)):
        exec(compile(code, f"{page.name} snippet {i + 1}", "exec"), namespace)  # noqa: S102


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", page.read_text(encoding="utf-8"), flags=re.M)
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_linked_pictures_and_anchors_exist(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (page.parent / target).is_file(), f"{page.name} shows a missing picture {target}"
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in _anchors(page), f"{page.name} links to a missing section #{anchor}"


def test_readme_links_each_equation_to_its_docs_section():
    """One hop from the README: every docs link it has points at a section that exists."""
    readme = (DOCS.parent / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(docs/([\w.]+)#([^)]+)\)", readme)
    assert len(links) >= 8
    for page, anchor in links:
        assert anchor in _anchors(DOCS / page), f"README links to a missing section {page}#{anchor}"
