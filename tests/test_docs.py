"""The docs' Python snippets run (in order, one namespace per page), their pictures, links and
anchors exist, and the README's quick start prints what it shows.

Only ```` ```python ```` blocks run; examples that need a trained run or would train for long
are fenced ```` ```py ```` (shown, never run) or ```` ```bash ````.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
# docs/notebooks links to notebooks/, which has its own tests (tests/test_notebooks.py).
PAGES = sorted(p for p in DOCS.rglob("*.md") if "notebooks" not in p.relative_to(DOCS).parts)
MAX_README_LINES = 150


def _ids(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _snippets(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S)


def test_docs_exist_and_have_snippets():
    names = {str(p.relative_to(DOCS)) for p in PAGES}
    assert {"index.md", "walkthrough.md", "guides/translation.md", "api/nn.md"} <= names
    assert sum(len(_snippets(p)) for p in PAGES) >= 8


@pytest.mark.parametrize("page", [p for p in PAGES if _snippets(p)], ids=_ids)
def test_snippets_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for i, code in enumerate(_snippets(page)):
        exec(compile(code, f"{page.name} snippet {i + 1}", "exec"), namespace)  # noqa: S102


def _text(page: Path) -> str:
    """The page's Markdown with its ``--8<-- "FILE"`` lines (pymdownx.snippets, paths from the
    repository root) replaced by the file."""
    return re.sub(
        r'^--8<-- "([^"]+)"$',
        lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"),
        page.read_text(encoding="utf-8"),
        flags=re.M,
    )


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens (the site
    makes the same ones: mkdocs.yml's toc slugify)."""
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", _text(page), flags=re.M)
    }


def _links(text: str) -> list[tuple[str, str]]:
    """``(path, anchor)`` of every relative Markdown link (no scheme, not a picture); the path
    is empty for a link within the page."""
    targets = re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text)
    return [(t.partition("#")[0], t.partition("#")[2]) for t in targets if "://" not in t]


@pytest.mark.parametrize("page", [*PAGES, README], ids=_ids)
def test_linked_files_pictures_and_anchors_exist(page):
    """What GitHub shows: every picture, linked file and section exists (mkdocs build --strict
    checks the same on the site, the README excepted). Anchors into the API reference name
    objects, not headings: the strict build checks those."""
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text):
        assert (page.parent / target).is_file(), f"{page.name} shows a missing picture {target}"
    for path, anchor in _links(text):
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name} links to a missing file {path}"
        if anchor and target.suffix == ".md" and target.parent != DOCS / "api":
            assert anchor in _anchors(target), f"{page.name} links to a missing section {path}#{anchor}"


def test_readme_links_each_equation_to_its_docs_section():
    """One hop from the README: the paper -> code table links its rows into the walkthrough."""
    links = [
        (p, a) for p, a in _links(README.read_text(encoding="utf-8")) if a and p == "docs/walkthrough.md"
    ]
    assert len({a for _, a in links}) >= 8
    assert all(a in _anchors(DOCS / "walkthrough.md") for _, a in links)


def test_readme_is_short_and_links_every_guide():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= MAX_README_LINES
    linked = {p for p, _ in _links(text)}
    guides = {f"docs/guides/{p.name}" for p in (DOCS / "guides").glob("*.md")}
    assert guides and guides <= linked, f"guides the README does not link: {sorted(guides - linked)}"


def test_readme_quick_start_prints_what_it_shows(tmp_path, monkeypatch):
    """Each ```python block of the README is followed by a ```text block: what it prints."""
    monkeypatch.chdir(tmp_path)
    pairs = re.findall(r"```python\n(.*?)```\s*```text\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert pairs
    for i, (code, shown) in enumerate(pairs):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, f"README snippet {i + 1}", "exec"), {})  # noqa: S102
        assert out.getvalue() == shown


def _hooks():
    spec = importlib.util.spec_from_file_location("qkv_docs_hooks", DOCS / "hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_nav_lists_the_notebooks_that_exist_in_file_name_order(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    cells = {
        "02_b.ipynb": [{"cell_type": "code", "source": ["# not a title\n"]}],
        "01_a.ipynb": [{"cell_type": "markdown", "source": ["Intro\n", "# 1 · Attention by hand\n"]}],
    }
    for name, content in cells.items():
        (folder / name).write_text(json.dumps({"cells": content}), encoding="utf-8")
    hooks = _hooks()
    notebooks = [{"1 · Attention by hand": "notebooks/01_a.ipynb"}, {"02 b": "notebooks/02_b.ipynb"}]
    assert hooks.notebook_nav(tmp_path) == notebooks
    (folder / "README.md").write_text("# Notebooks\n", encoding="utf-8")
    config = {"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"}, {"Walk": "walkthrough.md"}, "api.md"]}
    nav = hooks.on_config(config)["nav"]
    assert nav[2] == {"Notebooks": ["notebooks/README.md", *notebooks]}
    assert nav[3] == "api.md"


def test_the_contributing_page_is_contributing_md_with_its_links_into_docs_made_relative():
    hooks = _hooks()
    page = type("Page", (), {"file": type("File", (), {"src_uri": "contributing.md"})()})()
    text = hooks.on_page_markdown("stub", page, {"docs_dir": str(DOCS)}, None)
    assert text.startswith("# Contributing to qkv") and "](architecture.md" in text and "](docs/" not in text
