"""The one ``--overwrite`` rule for the folders ``qkv explain`` writes and for ``qkv contacts
--fit``'s head at its default place (issue 69): a folder that holds files, a path that is a file
or lies under one, and an existing head are refused in one line (exit 2) before any work, the
files byte for byte as they were; ``--overwrite`` lets the command go on."""

from __future__ import annotations

import argparse
import shutil

import pytest
from cli_runs import digest, refused, run_main

from qkv.errors import QkvError


def _verbs() -> dict[str, argparse.ArgumentParser]:
    from qkv.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _folder_options() -> list[tuple[str, str, bool]]:
    return [
        (verb, dest, new)
        for verb, parser in _verbs().items()
        for dest, new in parser.get_default("folder_outputs") or ()
    ]


def test_explain_declares_its_folders():
    assert set(_folder_options()) == {("explain", "out", False), ("explain", "live", True)}


WORK = "the command started its work"
# what the verbs need beside a folder option to reach their work
OTHER_ARGUMENTS = {("explain", "out"): ["--input", "a"]}


@pytest.fixture
def no_work(monkeypatch):
    """A model load or an export answers :data:`WORK` instead: a refusal must come before them
    (the review's ``--live FILE/page`` came after a 21-second export)."""

    def work(*args, **kwargs):
        raise QkvError(WORK)

    monkeypatch.setattr("qkv.recipes.loading.load_explainer", work)
    monkeypatch.setattr("qkv.explain.live.write_live_page", work)


@pytest.mark.parametrize(("verb", "dest", "new"), _folder_options())
def test_a_folder_option_is_checked_before_any_work(verb, dest, new, tmp_path, capsys, no_work):
    """Each folder option, with placeholders for the verb's other arguments: a folder that holds
    files (kept byte for byte), a file, and a path under a file are refused naming the path;
    ``--overwrite`` lets a non-empty folder through (to the placeholder model's own refusal),
    except for an option that writes a new folder."""
    flag = "--" + dest.replace("_", "-")
    argv = [verb, str(tmp_path / "run"), *OTHER_ARGUMENTS.get((verb, dest), [])]
    full = tmp_path / "full"
    full.mkdir()
    (full / "attention_decoder.png").write_bytes(b"an earlier picture")
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own file\n")
    before = digest(tmp_path)
    for target, needles in (
        (full, ("already exists and is not empty", "choose a new folder" if new else "--overwrite")),
        (mine, ("is a file; give a folder",)),
        (mine / "page", (f"{mine} is a file, not a folder",)),
        (mine / "a" / "b", (f"{mine} is a file, not a folder",)),
    ):
        refused(run_main(capsys, *argv, flag, str(target)), flag, str(target), *needles)
    assert digest(tmp_path) == before
    (tmp_path / "empty").mkdir()
    fine = [[tmp_path / "empty"], [tmp_path / "new" / "deeper"]]  # an empty or a new folder
    for target in [*fine, *([] if new else [[full, "--overwrite"]])]:
        refused(run_main(capsys, *argv, flag, *map(str, target)), WORK)


@pytest.mark.filterwarnings("ignore:context longer than the model's max_len")
def test_explain_out_keeps_earlier_pictures_unless_overwrite(tiny_runs, tmp_path, capsys):
    """The review's case: a second ``explain --out DIR`` over DIR's earlier pictures."""
    pics = tmp_path / "pics"
    pics.mkdir()  # an empty folder is a new one
    argv = ["explain", str(tiny_runs["lm"]), "--input", "ROMEO:", "--max-new-tokens", "2"]
    code, out, _ = run_main(capsys, *argv, "--out", str(pics))
    assert code == 0 and (pics / "attention_decoder.png").is_file()
    earlier = digest(pics)
    refused(run_main(capsys, *argv, "--out", str(pics), "--seed", "1"), f"--out {pics}", "--overwrite")
    assert digest(pics) == earlier
    code, out, _ = run_main(capsys, *argv, "--out", str(pics), "--overwrite")
    assert code == 0 and str(pics / "attention_decoder.png") in out and set(digest(pics)) == set(earlier)


def test_contacts_fit_keeps_the_head_at_its_default_place_unless_overwrite(
    tiny_runs, tmp_path, capsys, monkeypatch
):
    """``contacts RUN --fit`` writes RUN/contact_head.safetensors: one there is the user's
    earlier fit, refused as an existing ``--head-out`` is."""
    from qkv.inference.contacts import HEAD_FILE

    run = shutil.copytree(tiny_runs["protein"], tmp_path / "run")
    (run / HEAD_FILE).write_bytes(b"an earlier fit")
    before = digest(run)

    def structures(*args, **kwargs):
        raise QkvError("reached the structures")

    monkeypatch.setattr("qkv.data.structures.shared_chains", structures)
    refused(
        run_main(capsys, "contacts", str(run), "--fit"), str(run / HEAD_FILE), "--overwrite", "--head-out"
    )
    assert digest(run) == before
    refused(run_main(capsys, "contacts", str(run), "--fit", "--overwrite"), "reached the structures")
    refused(
        run_main(capsys, "contacts", str(run), "--fit", "--head-out", str(tmp_path / "other.safetensors")),
        "reached the structures",
    )
    (run / HEAD_FILE).unlink()
    refused(run_main(capsys, "contacts", str(run), "--fit"), "reached the structures")
