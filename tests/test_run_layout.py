"""One name, one rule (issue 70): a run directory's file names come from ``qkv.runs.layout``
(no module above ``runs/`` spells them), the weights a finished run's model comes from are
chosen by one function (:func:`qkv.runs.layout.select_weights`), every command that writes a
folder asks one rule what stands there (:func:`qkv.files.folder_obstacle`) and keeps its own
wording, and the sentence a training summary ends with is written once
(:mod:`qkv.recipes.common`)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from test_imports import LAYERS

from qkv.cli.options import check_new_folder
from qkv.errors import QkvError
from qkv.files import folder_obstacle, refuse_nonempty
from qkv.recipes import lm, protein_mlm, text_cls
from qkv.recipes.common import closing_sentence, run_directory, trained_for
from qkv.runs import layout
from qkv.runs.layout import BEST, LAST, select_weights
from qkv.runs.record import prepare_run_dir

PKG = Path(__file__).resolve().parents[1] / "src" / "qkv"
# a run's file names (SNAPSHOTS is also a key of the loop's state, so it is left out)
FILE_NAMES = {
    value: name
    for name, value in vars(layout).items()
    if name.isupper() and isinstance(value, str) and "." in value
}


def _below_runs() -> set[str]:
    """The top-level modules and folders of the layers under ``runs/`` (they cannot import it)."""
    tops = [top for layer in LAYERS for top in layer]
    return set(tops[: tops.index("runs")])


def test_no_module_above_runs_spells_a_run_file_name():
    """``"tokenizer.json"``, ``"model.safetensors"``, ``"best.safetensors"``... as a string of
    their own appear only in ``runs/layout.py`` and in the layers below ``runs/`` (``data/``
    writes a prepared folder's tokenizer), which cannot import it."""
    below = _below_runs()
    spelled = []
    for path in sorted(PKG.rglob("*.py")):
        top = path.relative_to(PKG).parts[0].removesuffix(".py")
        if top in below or path == PKG / "runs" / "layout.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in FILE_NAMES:
                spelled.append(f"{path.relative_to(PKG)}:{node.lineno} {node.value!r}")
    assert "tokenizer.json" in FILE_NAMES and "model.safetensors" in FILE_NAMES
    assert not spelled, f"use qkv.runs.layout's names: {spelled}"


def test_select_weights_is_the_best_on_validation_else_the_last(tmp_path):
    """What ``keep_best`` loads and what the PEFT export reads ``W0`` from: ``best.safetensors``
    when validation ran, else ``last.safetensors`` (named even when missing, so that loading it
    names the missing file)."""
    assert select_weights(tmp_path) == tmp_path / LAST
    (tmp_path / LAST).write_bytes(b"last")
    assert select_weights(tmp_path) == tmp_path / LAST
    (tmp_path / BEST).write_bytes(b"best")
    assert select_weights(str(tmp_path)) == tmp_path / BEST
    (tmp_path / BEST).unlink()
    (tmp_path / BEST).mkdir()  # not a file: not a checkpoint
    assert select_weights(tmp_path) == tmp_path / LAST


def _obstacles(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a.txt").write_text("a")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("f")
    return {
        "absent": tmp_path / "new" / "deeper",
        "empty": tmp_path / "empty",
        "not empty": tmp_path / "full",
        "file": tmp_path / "file",
        "under a file": tmp_path / "file" / "sub" / "deeper",
    }


def test_folder_obstacle_names_what_stands_there(tmp_path):
    paths = _obstacles(tmp_path)
    assert folder_obstacle(paths["absent"]) == ("", paths["absent"])
    assert folder_obstacle(paths["empty"]) == ("", paths["empty"])
    assert folder_obstacle(paths["not empty"]) == ("not empty", paths["not empty"])
    assert folder_obstacle(str(paths["file"])) == ("file", paths["file"])
    assert folder_obstacle(paths["under a file"]) == ("under a file", tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "file", "full"]  # touched nothing


def test_every_folder_check_follows_the_one_rule_in_its_own_words(tmp_path):
    """The exports' check, the command line's ``--out``/``--html`` folders and ``qkv train``'s
    run directory accept the same folders and refuse the same ones, each in its own words."""
    paths = _obstacles(tmp_path)
    for kind in ("absent", "empty"):
        refuse_nonempty(paths[kind], "folder")
        assert check_new_folder(paths[kind], "--out") == paths[kind]
        assert prepare_run_dir(paths[kind], False, "lm", lambda _: None) == paths[kind]
    full, file, under = paths["not empty"], paths["file"], paths["under a file"]
    words = {
        (refuse_nonempty, "not empty"): f"{full} already exists and is not empty; choose a new folder",
        (refuse_nonempty, "file"): f"{file} already exists and is not empty; choose a new folder",
        (refuse_nonempty, "under a file"): f"{under}: cannot make a folder there, {file} is a file",
        (check_new_folder, "not empty"): f"--out {full} already exists and is not empty; choose a new folder",
        (check_new_folder, "file"): f"--out {file} is a file; give a folder",
        (check_new_folder, "under a file"): f"--out {under}: {file} is a file, not a folder",
    }
    for (check, kind), message in words.items():
        with pytest.raises(QkvError) as refused:
            check(paths[kind], "folder" if check is refuse_nonempty else "--out")
        assert str(refused.value) == message
    assert check_new_folder(full, "--out", overwrite=True) == full
    with pytest.raises(QkvError, match=r"is not empty; use --resume to continue it or choose another --out$"):
        prepare_run_dir(full, False, "lm", lambda _: None)
    with pytest.raises(QkvError, match=r"^--out .* is a file, not a directory$"):
        prepare_run_dir(file, False, "lm", lambda _: None)


def test_the_closing_sentence_is_written_once(tmp_path):
    summary = {"train_minutes": 12.345, "total_minutes": 20.0, "steps": 400}
    where = tmp_path.resolve()
    assert trained_for(summary) == "12.3 min and 400 steps"
    assert trained_for(summary, of_training=True) == "12.3 min of training, 400 steps"
    assert run_directory(tmp_path) == f"run directory: {where}"
    assert run_directory(tmp_path, "summary.json", "confusion.png") == (
        f"run directory: {where} (summary.json, confusion.png)"
    )
    closing = closing_sentence(summary, tmp_path)
    assert closing == f"after 12.3 min and 400 steps; run directory: {where}"
    val = {"val_loss": 1.0, "val_ppl": 2.0, "val_bits_per_char": 1.5}
    assert lm.summary_text({**summary, "validation": val, "samples": ["x"]}, tmp_path).endswith(
        f") {closing}"
    )
    assert protein_mlm.summary_text({**summary, "validation": val}, tmp_path).endswith(f") {closing}")
    both = {**summary, "task": "t", "mode": "probe", "init": "minilm", "test": {"accuracy": 0.5, "mcc": 0.1}}
    assert text_cls.summary_text(both, tmp_path) == (
        "t test accuracy 0.5000 (MCC 0.100), probe of minilm, after 12.3 min and 400 steps\n"
        f"run directory: {where} (summary.json, confusion.png)"
    )


def test_inference_weight_layout_is_the_cpu_weight_layout_module():
    """``qkv.inference.weight_layout`` (the weights' memory layout for CPU decoding) is not
    ``qkv.runs.layout`` (a run directory's file names): the old ambiguous name is gone."""
    module = importlib.import_module("qkv.inference.weight_layout")
    assert callable(module.prepare_for_inference) and hasattr(module, "PackedLinear")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("qkv.inference.layout")
