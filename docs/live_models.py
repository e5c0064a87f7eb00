"""The docs site's model files: the graphs its live page runs in the reader's browser, one
folder per model in ``docs/live/NAME/``.

They are most of the repository's bytes, and every export stays in every clone's history for
good, so they change only with a release, from a named run, by one command (CONTRIBUTING.md,
"The docs site's model files")::

    make docs-models RUN=runs/demo     # = .venv/bin/python docs/live_models.py runs/demo

NAME is the run's recipe (``lm``, ``translation``, ``caption``, ``vit``: the families the live
page runs, ``?model=NAME``). The folder is what ``qkv explain RUN --live DIR`` writes in
``DIR/model/`` (the translator's with float16 weights, :data:`WEIGHTS`), and
``docs/live/models.json`` records for each model the run it came from, the qkv version and date
of the export, and every file's size and sha256. An export that would take the models past
:data:`BUDGET_MB` is refused before anything is replaced. ``tests/test_docs_models.py`` holds
the committed folders to the manifest and to the budget.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
import tempfile
from pathlib import Path

LIVE = Path(__file__).resolve().parent / "live"
MANIFEST = "models.json"
# The site's four models took 25.6 MB on 2026-12-07 (the translator 14.1 MB of it). Raising the
# budget is a decision of its own, in its own commit.
BUDGET_MB = 30.0
WEIGHTS = {"translation": "float16"}  # half the download, the same translations (docs/guides/deploy.md)
NOTE = (
    "The docs site's model files (docs/live/NAME/), written only by `make docs-models RUN=DIR` "
    "(docs/live_models.py) with a release; tests/test_docs_models.py checks every file against "
    'this list. CONTRIBUTING.md: "The docs site\'s model files".'
)


def file_entries(folder: Path) -> dict[str, dict]:
    """``{file name: {"bytes", "sha256"}}`` of every file in ``folder``, by name."""
    from qkv.data.sources import sha256sum

    return {
        p.name: {"bytes": p.stat().st_size, "sha256": sha256sum(p)}
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def total_bytes(models: dict) -> int:
    """The bytes of every file the manifest's ``models`` list."""
    return sum(entry["bytes"] for model in models.values() for entry in model["files"].values())


def read_manifest(live: Path = LIVE) -> dict:
    """``live/models.json``, or an empty manifest where there is none yet."""
    path = live / MANIFEST
    if not path.is_file():
        return {"note": NOTE, "models": {}}
    return json.loads(path.read_text(encoding="utf-8"))


def export(run: str | Path, live: Path = LIVE, budget_mb: float = BUDGET_MB) -> str:
    """Export the run in ``run`` to ``live/NAME/`` (NAME: its recipe) and record it in
    ``live/models.json``; returns NAME. The folder and the manifest change together, and only
    once the export succeeded within the budget.

    Raises:
        QkvError: ``run`` is not a run directory, or of a family the live page does not run
            (what :func:`qkv.explain.live.write_live_page` raises), or the models would take
            more than ``budget_mb`` MB with this export.
    """
    from qkv import __version__
    from qkv.errors import QkvError
    from qkv.explain.live import write_live_page
    from qkv.files import write_json
    from qkv.runs.info import RunInfo

    name = RunInfo.read(run).recipe
    weights = WEIGHTS.get(name, "float32")
    with tempfile.TemporaryDirectory(dir=live) as tmp:
        write_live_page(run, Path(tmp) / "page", weights=weights)
        staged = Path(tmp) / "page" / "model"
        manifest = read_manifest(live)
        entry = {
            "run": str(run),
            "weights": weights,
            "qkv": __version__,
            "date": datetime.date.today().isoformat(),
            "files": file_entries(staged),
        }
        models = dict(sorted({**manifest["models"], name: entry}.items()))
        total = total_bytes(models)
        if total > budget_mb * 1e6:
            raise QkvError(
                f"with this {name} export the docs site's models would take {total / 1e6:.1f} MB, over "
                f"their budget of {budget_mb:g} MB (BUDGET_MB in docs/live_models.py); nothing was replaced"
            )
        if (live / name).exists():
            shutil.rmtree(live / name)
        shutil.move(str(staged), str(live / name))
        write_json(live / MANIFEST, {**manifest, "models": models})
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="the run directory to export (its recipe names the folder)")
    args = parser.parse_args(argv)
    from qkv.errors import QkvError

    try:
        name = export(args.run)
    except QkvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = total_bytes(read_manifest()["models"]) / 1e6
    print(f"docs/live/{name}/ from {args.run}; the site's models: {total:.1f} of {BUDGET_MB:g} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
