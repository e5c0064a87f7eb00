"""Every bad input a one-line refusal, nothing already saved lost.

Each refusal is run as a user would (``python -m qkv ...`` in a subprocess) and must print one
line, ``error: ...``, exit with status 2 and leave every file of the run directory byte for
byte as it was (the directory is hashed before and after). A bug, by contrast, is never
disguised as a user error: it says so and exits with status 1.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from cli_runs import DATA, TINY_LM, digest, qkv, refused
from pretrained_marks import needs_minilm

from qkv.cli import main


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    """A finished 6-step character LM run (with train_state.pt and its .prev)."""
    if not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"):
        pytest.skip(f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)")  # in CI: fail
    run = tmp_path_factory.mktemp("refusals") / "lm"
    done = qkv("train", "lm", "--out", str(run), "--quiet", "train.max_steps=6", *TINY_LM)
    assert done.returncode == 0, done.stderr[-2000:]
    return run


@pytest.fixture
def lm_copy(lm_run, tmp_path) -> Path:
    run = tmp_path / "lm"
    shutil.copytree(lm_run, run)
    return run


def test_resuming_with_another_recipe_is_refused_and_changes_nothing(lm_copy):
    before = digest(lm_copy)
    done = qkv("train", "protein-mlm", "--out", str(lm_copy), "--resume", "--quiet", "train.max_steps=8")
    refused(done, "is a 'lm' run, not 'protein-mlm'", f"qkv train lm --out {lm_copy} --resume")
    assert digest(lm_copy) == before
    assert qkv("generate", str(lm_copy), "--max-new-tokens", "3", "--seed", "1").returncode == 0


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda b: b[: len(b) // 2], "is truncated"),
        (lambda b: b"", "is empty"),
        (lambda b: os.urandom(4096), "is not a PyTorch checkpoint"),
    ],
)
def test_resuming_a_damaged_state_is_refused_changes_nothing_and_offers_the_previous_one(
    lm_copy, damage, reason
):
    state = lm_copy / "train_state.pt"
    state.write_bytes(damage(state.read_bytes()))
    before = digest(lm_copy)
    line = refused(
        qkv("train", "lm", "--out", str(lm_copy), "--resume", "--quiet", "train.max_steps=8", *TINY_LM),
        reason,
        "train_state.prev.pt (step 6) is readable: mv ",
    )
    assert "weights_only" not in line  # never a hint to load it unsafely
    assert digest(lm_copy) == before


def test_a_state_from_a_newer_qkv_is_refused_in_one_line_and_changes_nothing(lm_copy):
    """train_state.pt carries its own format_version: one this qkv does not know (written by a
    newer qkv, as the previous state is too) is refused, not misread."""
    import torch

    from qkv.train.train_state import STATE_FORMAT_VERSION

    for name in ("train_state.pt", "train_state.prev.pt"):
        state = torch.load(lm_copy / name, weights_only=True)
        assert state["format_version"] == STATE_FORMAT_VERSION
        torch.save({**state, "format_version": STATE_FORMAT_VERSION + 1}, lm_copy / name)
    before = digest(lm_copy)
    refused(
        qkv("train", "lm", "--out", str(lm_copy), "--resume", "--quiet", "train.max_steps=8", *TINY_LM),
        f"was written by a newer qkv (format_version {STATE_FORMAT_VERSION + 1}; this qkv reads up to",
    )
    assert digest(lm_copy) == before


def test_a_state_that_would_run_code_is_refused_unread(lm_copy):
    import pickle

    (lm_copy / "train_state.pt").write_bytes(pickle.dumps({"loop": os.system}))
    before = digest(lm_copy)
    line = refused(
        qkv("train", "lm", "--out", str(lm_copy), "--resume", "--quiet", *TINY_LM), "train_state.pt"
    )
    assert "weights_only" not in line
    assert digest(lm_copy) == before


def test_resume_alone_continues_with_the_runs_own_settings(lm_copy):
    """`--resume` starts from the settings in train_config.json; key=value still overrides."""
    import json

    done = qkv("train", "lm", "--out", str(lm_copy), "--resume", "--quiet", "train.max_steps=8")
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((lm_copy / "train_config.json").read_text())
    assert saved["model"]["d_model"] == 32 and saved["batch_size"] == 4 and saved["train"]["max_steps"] == 8
    assert json.loads((lm_copy / "summary.json").read_text())["steps"] == 8


def test_resuming_with_another_model_is_refused_and_changes_nothing(lm_copy):
    before = digest(lm_copy)
    settings = [s for s in TINY_LM if not s.startswith("model.d_model")] + ["model.d_model=64"]
    refused(
        qkv("train", "lm", "--out", str(lm_copy), "--resume", "--quiet", *settings),
        "cannot resume",
        "model.d_model: 32 saved, 64 now",
    )
    assert digest(lm_copy) == before


def test_resuming_with_unreadable_settings_is_refused_and_changes_nothing(lm_copy):
    (lm_copy / "train_config.json").write_text("{ not json")
    before = digest(lm_copy)
    refused(
        qkv("train", "lm", "--out", str(lm_copy), "--resume", "--quiet", *TINY_LM),
        "train_config.json is missing or unreadable",
    )
    assert digest(lm_copy) == before


def test_a_new_run_into_a_used_directory_is_refused_and_changes_nothing(lm_copy):
    before = digest(lm_copy)
    refused(qkv("train", "lm", "--out", str(lm_copy), "--quiet", *TINY_LM), "is not empty; use --resume")
    assert digest(lm_copy) == before


def test_a_refused_new_run_leaves_no_directory(lm_run, tmp_path):
    run = tmp_path / "new"
    refused(qkv("train", "lm", "--out", str(run), "--quiet", f"corpus={tmp_path / 'missing.txt'}", *TINY_LM))
    assert not run.exists()
    refused(
        qkv("train", "lm", "--out", str(run), "--quiet", "train.max_steps=0"), "max_steps (0) must be >= 1"
    )
    assert not run.exists()


@pytest.mark.parametrize(
    "recipe, setting",
    [
        ("text-cls", "max_tokens=0"),
        ("protein-cls", "max_tokens=0"),
        ("protein-mlm", "max_tokens=0"),
        ("translation", "max_tokens=0"),
        ("lm", "num_samples=0"),
        ("lm", "temperature=0"),
    ],
)
def test_sizes_that_mean_nothing_are_refused_before_a_run_exists(tmp_path, recipe, setting):
    run = tmp_path / "r"
    refused(qkv("train", recipe, "--out", str(run), "--quiet", setting), setting.split("=")[0])
    assert not run.exists()


def test_a_bug_is_reported_as_a_bug_not_as_a_user_error(monkeypatch, capsys):
    """Only QkvError (and OSError: files, disk) are user errors; anything else says it is a bug."""
    import qkv.cli as cli

    def broken(args):
        raise ValueError("an internal invariant failed")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["evaluate"].set_defaults(func=broken)
    assert main(["evaluate", "somewhere"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("internal error (a bug in qkv") and "ValueError: an internal invariant failed" in err
    )
    assert "--debug" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError):
        main(["--debug", "evaluate", "somewhere"])


def test_user_errors_and_missing_files_are_one_line_with_status_2(tmp_path, capsys):
    assert main(["evaluate", str(tmp_path / "nowhere")]) == 2
    assert main(["classify", str(tmp_path / "nowhere"), "x.fasta"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("error: ") for line in lines)


@needs_minilm
def test_empty_texts_are_refused_by_search_and_similarity(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("A dog runs.\nA cat sleeps.\n")
    for query in ("", "   "):
        refused(qkv("search", query, "--corpus", str(corpus), "--device", "cpu"), "query is empty")
    refused(qkv("similarity", "", "A dog.", "--device", "cpu"), "input 1 is empty")
    refused(qkv("similarity", "A dog.", " \t", "--device", "cpu"), "input 2 is empty (only white space)")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bogus"], "invalid choice: 'bogus'"),
        (["train", "lm", "--max-steps", "abc"], "invalid int value: 'abc'"),
        (["train", "lm", "--out", "R", "train.seed=-1"], "seed (-1) must be in [0, 2**32)"),
        (
            ["train", "lm", "--out", "R", "model.d_model=99999999999999999999999"],
            "must be an integer in [-2**63, 2**63)",
        ),
        (["translate", "{translation}", "--beam", "0", "Hallo"], "beam size must be between 1 (greedy) and"),
        (
            ["translate", "{translation}", "--beam", "99999999999999999999", "Hallo"],
            "beam size must be between 1",
        ),
        (["translate", "{translation}", "--alpha", "nan", "Hallo"], "alpha must be a finite number"),
        (["translate", "{translation}", "--batch-size", "0", "Hallo"], "--batch-size must be an integer"),
        (["evaluate", "{translation}", "--limit", "0"], "--limit must be >= 1"),
        (["generate", "{lm}", "--num-samples", "0"], "--num-samples must be >= 1"),
        (
            ["explain", "{lm}", "--input", "ab", "--out", "R", "--layer", "99"],
            "--layer 99 is outside the model's layers",
        ),
        (
            ["explain", "{lm}", "--input", "ab", "--out", "R", "--head", "0"],
            "--head 0 is outside the model's heads 1..2",
        ),
        (
            ["explain", "{lm}", "--input", "ab", "--out", "R", "--temperature", "nan"],
            "--temperature must be a finite",
        ),
    ],
)
def test_bad_options_are_one_line_with_status_2(tiny_runs, tmp_path, monkeypatch, capsys, argv, needle):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(**tiny_runs) for a in argv]
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        code = stop.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (tmp_path / "R").exists()


def test_a_deeply_nested_config_file_is_refused(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["train", "lm", "--out", str(tmp_path / "R"), "--config", str(deep)]) == 2
    assert "cannot read config file" in capsys.readouterr().err and not (tmp_path / "R").exists()


# options that name a directory the verb fills (a run, prepared shards, protein embeddings,
# PNG files), each with its own rule for one that exists; every other file option is a
# file_output_option
DIRECTORY_OPTIONS = {("train", "out"), ("prepare", "out"), ("embed", "out"), ("explain", "out")}
FILE_OPTION_NAMES = {"out", "heatmap", "html", "trajectory", "head_out", "plot"}


def _verbs():
    import argparse

    from qkv.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices.items()


def _file_options():
    return [(verb, dest) for verb, parser in _verbs() for dest in parser.get_default("file_outputs") or ()]


def test_every_file_a_verb_writes_goes_through_the_one_rule():
    found = {
        (verb, action.dest)
        for verb, parser in _verbs()
        for action in parser._actions
        if action.dest in FILE_OPTION_NAMES
    }
    declared = set(_file_options())
    assert found - DIRECTORY_OPTIONS == declared, "declare file outputs with file_output_option"
    assert len(declared) >= 7


@pytest.mark.parametrize(("verb", "dest"), _file_options())
def test_an_existing_file_is_refused_before_any_work_unless_overwrite(verb, dest, tmp_path, capsys):
    """Each verb's file options, with placeholders for its other arguments (the check comes
    before they are read): a file that exists is kept byte for byte and named in one line; a
    directory, or a folder that does not exist, is refused too; --overwrite lets the verb go on
    (to its next error here, the placeholder model)."""
    parser = dict(_verbs())[verb]
    argv = [verb]
    for action in parser._actions:
        if not action.option_strings and action.dest not in ("help",):
            argv.append(str(tmp_path / "no-model"))
        elif action.required:
            argv += [action.option_strings[0], str(tmp_path / "placeholder")]
    flag = "--" + dest.replace("_", "-")
    mine = tmp_path / "mine.txt"
    mine.write_text("the user's own file\n")
    for target, needle in (
        (mine, "already exists"),
        (tmp_path, "is a directory"),
        (tmp_path / "missing" / "f.png", "does not exist"),
    ):
        refused((main([*argv, flag, str(target)]), *capsys.readouterr()), flag, str(target), needle)
    assert mine.read_text() == "the user's own file\n"
    status = main([*argv, flag, str(mine), "--overwrite"])
    err = capsys.readouterr().err
    assert "already exists" not in err and status != 0  # refused later, for the placeholder model


def test_embed_sentences_refuse_an_existing_file(tmp_path, capsys):
    mine = tmp_path / "e.safetensors"
    mine.write_bytes(b"mine")
    (tmp_path / "s.txt").write_text("a sentence\n")
    argv = ["embed", "--model", "minilm", str(tmp_path / "s.txt"), "--out", str(mine)]
    refused((main(argv), *capsys.readouterr()), "--out", "already exists")
    assert mine.read_bytes() == b"mine"
