"""The docs' Python snippets run (in order, one namespace per page), their pictures, links and
anchors exist, and the README's quick start prints what it shows.

Only ```` ```python ```` blocks run; examples that need a trained run or would train for long
are fenced ```` ```py ```` (shown, never run) or ```` ```bash ````.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

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
    """``(path, anchor)`` of every relative Markdown link (no scheme, not a picture; a query
    string, the live page's ``?model=``, dropped); the path is empty for a link within the page."""
    targets = re.findall(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)", text)
    return [(t.partition("#")[0].partition("?")[0], t.partition("#")[2]) for t in targets if "://" not in t]


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


CHROMIUM = os.environ.get("QKV_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# A $...$ or $$...$$ pair left as text in a notebook's prose: an equation MathJax did not typeset.
RAW_MATH = re.compile(r"\$\$?[^$\s][^$]*\$")


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> Path:
    """The docs site: ``$QKV_DOCS_SITE`` where a built one is named (.ci/run names the site/ that
    ``make docs-build`` built just before the tests), else ``mkdocs build --strict`` into a
    temporary directory (seconds with mkdocs-jupyter's cache of converted notebooks)."""
    if os.environ.get("QKV_DOCS_SITE"):
        site = Path(os.environ["QKV_DOCS_SITE"])
        assert (site / "index.html").is_file(), f"QKV_DOCS_SITE={site} holds no built site"
        return site
    pytest.importorskip("mkdocs_jupyter", reason="the docs extra is not installed (pip install -e .[docs])")
    site = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    return site


def _serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the browser's requests are checked, not logged
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def _raw_math(page) -> list[str]:
    """``$...$`` pairs left as text in a notebook page's Markdown cells, code spans excepted."""
    code = page.locator(".jp-MarkdownCell code").all_inner_texts()
    found = [m for text in page.locator(".jp-MarkdownCell").all_inner_texts() for m in RAW_MATH.findall(text)]
    return [m for m in found if not any(m in c for c in code)]  # `$QKV_DATA_DIR` is no math


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (Debian: apt-get install chromium)")
def test_the_site_asks_no_other_host_and_typesets_the_notebooks_math(built_site):
    """In Chromium, the home page, a guide and every notebook page load everything they ask for
    from the site's own host (no fonts, MathJax or scripts from a CDN), nothing fails to load,
    and the notebooks' equations are typeset (by the vendored MathJax 3) with none left raw."""
    playwright = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    notebooks = sorted(p.parent.name for p in (built_site / "notebooks").glob("*/index.html"))
    assert "01_attention_by_hand" in notebooks
    pages = ["", "guides/translation/"] + [f"notebooks/{name}/" for name in notebooks]
    server, base = _serve(built_site)
    requests: list[str] = []
    failed: list[str] = []
    errors: list[str] = []
    math: dict[str, tuple[int, int, list[str]]] = {}  # notebook page -> (typeset, MathJax errors, raw)
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.on("request", lambda req: requests.append(req.url))
            page.on("requestfailed", lambda req: failed.append(req.url))
            page.on("response", lambda res: res.status >= 400 and failed.append(f"{res.status} {res.url}"))
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            for path in pages:
                page.goto(base + path)
                if path.startswith("notebooks/"):
                    try:  # a selector, not an evaluated condition (docs/javascripts/mathjax.js sets it)
                        page.wait_for_selector(
                            'html[data-mathjax="typeset"]', state="attached", timeout=30_000
                        )
                    except playwright.TimeoutError:
                        math[path] = (0, 0, ["(MathJax never finished)"])
                        break  # the requests so far say why
                page.wait_for_load_state("networkidle")  # MathJax's fonts, the search index
                if path.startswith("notebooks/"):
                    typeset = page.locator(".jp-MarkdownCell mjx-container").count()
                    math[path] = (typeset, page.locator("mjx-merror").count(), _raw_math(page))
            browser.close()
    finally:
        server.shutdown()
    own = urlsplit(base).netloc
    elsewhere = [
        u for u in requests if urlsplit(u).scheme not in ("data", "blob") and urlsplit(u).netloc != own
    ]
    assert not elsewhere, f"the site asked other hosts: {elsewhere}"
    assert len(requests) > 2 * len(pages), "every page asks for its styles and scripts"
    assert any(u.endswith("/javascripts/mathjax/tex-chtml.js") for u in requests)
    assert any(u.endswith(".woff") for u in requests), "MathJax's fonts come from the site"
    assert not failed, failed
    assert not errors, errors
    for path, (_, merrors, raw) in math.items():
        assert merrors == 0 and not raw, f"{path}: {merrors} MathJax errors, left raw: {raw}"
    assert math["notebooks/01_attention_by_hand/"][0] >= 30  # Eq. 1 and its pieces, 38 equations
