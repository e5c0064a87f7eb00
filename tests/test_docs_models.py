"""The docs site's model files (``docs/live/NAME/``) are what their manifest says, within their
size budget, and ``make docs-models RUN=...`` (``docs/live_models.py``) writes them that way.

They are the bulk of the repository and every export stays in its history: CONTRIBUTING.md,
"The docs site's model files".
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from cli_runs import digest

from qkv.errors import QkvError

ROOT = Path(__file__).resolve().parent.parent
LIVE = ROOT / "docs" / "live"
SHARED = {"index.html", "live.js", "ort", "tokenizers"}  # the package's page and runtimes, linked


def _live_models():
    spec = importlib.util.spec_from_file_location("qkv_docs_live_models", ROOT / "docs" / "live_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


live_models = _live_models()
MODELS = live_models.read_manifest(LIVE)["models"]


def test_the_manifest_lists_every_model_folder_and_every_file_in_it():
    assert set(MODELS) == {"lm", "translation", "caption", "vit"}
    folders = {p.name for p in LIVE.iterdir() if p.name not in SHARED and p.name != live_models.MANIFEST}
    assert folders == set(MODELS), "a folder in docs/live that models.json does not list, or the reverse"
    for name, model in MODELS.items():
        on_disk = {p.name for p in (LIVE / name).iterdir()}
        assert on_disk == set(model["files"]), f"docs/live/{name}: files not in models.json or missing"
        assert {"run", "weights", "qkv", "date"} <= set(model), f"{name}: where it came from"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_file_has_the_size_and_sha256_the_manifest_records(name):
    for file, recorded in MODELS[name]["files"].items():
        data = (LIVE / name / file).read_bytes()
        assert len(data) == recorded["bytes"], f"docs/live/{name}/{file}"
        assert hashlib.sha256(data).hexdigest() == recorded["sha256"], f"docs/live/{name}/{file} changed"
    # the export's own manifest agrees about the files it lists
    own = json.loads((LIVE / name / "onnx.json").read_text(encoding="utf-8"))["files"]
    assert {f: MODELS[name]["files"][f] for f in own} == own


def test_the_models_are_within_their_budget():
    total = live_models.total_bytes(MODELS)
    on_disk = sum(p.stat().st_size for name in MODELS for p in (LIVE / name).iterdir())
    assert total == on_disk
    assert total <= live_models.BUDGET_MB * 1e6, (
        f"docs/live holds {total / 1e6:.1f} MB of models, over the budget of {live_models.BUDGET_MB} MB"
    )


def test_the_make_target_runs_the_exporter_with_a_named_run():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^docs-models:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert recipe and "docs/live_models.py $(RUN)" in recipe.group(1)
    unnamed = subprocess.run(
        ["make", "-n", "docs-models"], cwd=ROOT, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert unnamed.returncode != 0 and "RUN=" in unnamed.stderr


def test_an_export_writes_the_folder_and_its_checksums_and_an_export_over_budget_changes_nothing(
    tiny_runs, tmp_path
):
    live = tmp_path / "live"
    # the manifest and the small files: the other models' entries stand as they are
    shutil.copytree(LIVE, live, ignore=shutil.ignore_patterns("*.onnx", *SHARED))
    assert live_models.export(tiny_runs["lm"], live) == "lm"
    manifest = live_models.read_manifest(live)
    entry = manifest["models"]["lm"]
    assert entry["run"] == str(tiny_runs["lm"]) and entry["weights"] == "float32"
    assert {p.name for p in (live / "lm").iterdir()} == set(entry["files"]) >= {"decoder.onnx", "onnx.json"}
    for file, recorded in entry["files"].items():
        data = (live / "lm" / file).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (recorded["bytes"], recorded["sha256"])
    assert manifest["models"]["translation"] == MODELS["translation"]  # the others as they were
    assert not [p for p in live.iterdir() if p.name.startswith("tmp")]

    before = digest(live)
    with pytest.raises(QkvError, match=r"over their budget of 0\.001 MB .*nothing was replaced"):
        live_models.export(tiny_runs["lm"], live, budget_mb=0.001)
    assert digest(live) == before
