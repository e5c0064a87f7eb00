"""MkDocs hooks for the qkv site (mkdocs.yml `hooks:`).

The notebooks live in notebooks/ (docs/notebooks links there) and are added or renamed by people
who do not edit mkdocs.yml: the nav lists notebooks/README.md and whichever notebooks/*.ipynb
exist when the site is built, in file-name order (01_..., 02_...), each titled by its first
Markdown heading.

CONTRIBUTING.md is written for the repository root, where GitHub shows it: the site's
contributing page is that file, with its links into docs/ made relative to the page.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS_AFTER = "walkthrough.md"


def notebook_title(path: Path) -> str:
    """The first ``# heading`` of the notebook's Markdown cells, else its file name."""
    cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    for cell in cells:
        if cell.get("cell_type") == "markdown":
            source = "".join(cell.get("source", []))
            match = re.search(r"^#\s+(.+)$", source, flags=re.M)
            if match:
                return match.group(1).strip()
    return path.stem.replace("_", " ")


def notebook_nav(docs_dir: Path) -> list[str | dict[str, str]]:
    """The README (the section's index) then ``{title: "notebooks/NAME.ipynb"}`` for every
    notebook, in file-name order."""
    folder = docs_dir / "notebooks"
    entries: list[str | dict[str, str]] = ["notebooks/README.md"] if (folder / "README.md").is_file() else []
    for path in sorted(folder.glob("*.ipynb")):
        entries.append({notebook_title(path): f"notebooks/{path.name}"})
    return entries


def on_config(config):
    entries = notebook_nav(Path(config["docs_dir"]))
    if entries and config["nav"] is not None:
        nav = config["nav"]
        at = next((i for i, item in enumerate(nav) if NOTEBOOKS_AFTER in item.values()), len(nav) - 1)
        nav.insert(at + 1, {"Notebooks": entries})
    return config


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "contributing.md":
        root = Path(config["docs_dir"]).parent
        return re.sub(r"\]\(docs/", "](", (root / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    return markdown
