"""A run directory is self-contained: copied, moved or renamed, it resumes from any working
directory, and a resumed copy touches only its own files (the original is hashed before and
after); a refused resume or preparation writes nothing.

Each case runs qkv as a user would (``python -m qkv`` in a subprocess), on real data.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from cli_runs import DATA, TINY_LM, TINY_TRANSLATION, digest, qkv, refused
from safetensors.torch import load_file

from qkv.data.images import read_idx
from qkv.data.protein import read_fasta
from qkv.data.translation import read_lines
from qkv.errors import QkvError
from qkv.files import save_weights
from qkv.runs.layout import remove_run_file, run_file
from qkv.train.checkpointer import Checkpointer, LoopState, average_weights
from qkv.train.train_settings import TrainSettings
from qkv.train.train_state import recorded_snapshot

FIXTURES = Path(__file__).parent / "fixtures" / "old_runs"
needs_shakespeare = pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)
needs_multi30k = pytest.mark.skipif(
    not (DATA / "multi30k" / "train.de.gz").is_file() and not os.environ.get("CI"),
    reason=f"Multi30k not found under {DATA} (set QKV_DATA_DIR)",
)
# a snapshot at every step, one kept: every step of a resumed run prunes the one before
SNAPSHOTS = ["train.snapshot_minutes=0", "train.keep_snapshots=1"]


def _ok(done) -> None:
    assert done.returncode == 0, done.stderr[-3000:]


def _snapshots(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "snapshots").iterdir())


def _loop_state(run: Path) -> dict:
    return torch.load(run / "train_state.pt", weights_only=True)["loop"]


def _copy_resume_and_check(original: Path, copy: Path, *args: str) -> None:
    """``cp -r original copy``, resume the copy with ``args``; the original stays byte-identical
    and the copy records its snapshots relative to itself, every one of them its own file."""
    shutil.copytree(original, copy)
    before = digest(original)
    _ok(qkv(*args))
    assert digest(original) == before
    recorded = _loop_state(copy)["snapshots"]
    assert recorded and all(r.startswith("snapshots/step_") for r in recorded), recorded
    assert [Path(r).name for r in recorded] == _snapshots(copy)


# --------------------------------------------------------------------------- one place for paths


def test_run_file_refuses_every_path_that_leaves_the_run_directory(tmp_path):
    run = tmp_path / "run"
    (run / "snapshots").mkdir(parents=True)
    outside = tmp_path / "precious.safetensors"
    outside.write_bytes(b"keep me")
    (run / "snapshots" / "link.safetensors").symlink_to(outside)
    assert run_file(run, "snapshots/step_3.safetensors") == run / "snapshots" / "step_3.safetensors"
    for bad in (str(outside), "../precious.safetensors", "snapshots/../../precious.safetensors", "."):
        with pytest.raises(QkvError, match="absolute path|leads outside the run directory"):
            remove_run_file(run, bad)
    with pytest.raises(QkvError, match="leads outside"):  # through a symbolic link
        remove_run_file(run, "snapshots/link.safetensors")
    assert outside.read_bytes() == b"keep me"


def test_snapshot_entries_of_earlier_versions_map_into_this_run_or_are_dropped(tmp_path):
    run = tmp_path / "copy"
    (run / "snapshots").mkdir(parents=True)
    (run / "snapshots" / "step_4.safetensors").write_bytes(b"")
    assert recorded_snapshot(run, "snapshots/step_4.safetensors") == "snapshots/step_4.safetensors"
    # absolute and cwd-relative paths of the run it was copied from: this run's file of that name
    assert (
        recorded_snapshot(run, "/elsewhere/orig/snapshots/step_4.safetensors")
        == "snapshots/step_4.safetensors"
    )
    assert recorded_snapshot(run, "runs/orig/snapshots/step_4.safetensors") == "snapshots/step_4.safetensors"
    assert recorded_snapshot(run, "/elsewhere/orig/snapshots/step_5.safetensors") is None  # not here
    assert recorded_snapshot(run, "/etc/passwd") is None and recorded_snapshot(run, "../x/step_4.bin") is None


def test_a_resumed_state_that_names_files_of_another_run_never_touches_them(tmp_path):
    """A training state (copied, or written by an earlier version) listing another directory's
    snapshots by absolute path: resuming and pruning remove only this run's files."""
    original, copy = tmp_path / "original", tmp_path / "copy"
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    for run in (original, copy):
        for step in (1, 2):
            save_weights(model, run / "snapshots" / f"step_{step}.safetensors")
    old_state = LoopState(
        step=2, snapshots=[str(original / "snapshots" / f"step_{s}.safetensors") for s in (1, 2)]
    )
    Checkpointer(model, opt, copy, TrainSettings()).save(old_state)
    before = digest(original)
    checkpoints = Checkpointer(model, opt, copy, TrainSettings(keep_snapshots=2))
    state = checkpoints.resume()
    assert state.snapshots == ["snapshots/step_1.safetensors", "snapshots/step_2.safetensors"]
    for step in (3, 4):
        state.step = step
        checkpoints.snapshot(state)
    assert digest(original) == before
    assert _snapshots(copy) == ["step_3.safetensors", "step_4.safetensors"]


# --------------------------------------------------------------------------- copy, move, resume


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    """A finished 6-step character LM run with a snapshot at every step."""
    if not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"):
        pytest.skip(f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)")
    run = tmp_path_factory.mktemp("lm") / "a"
    _ok(qkv("train", "lm", "--out", str(run), "--quiet", "train.max_steps=6", *TINY_LM, *SNAPSHOTS))
    return run


@needs_shakespeare
@pytest.mark.parametrize("out", ["relative", "absolute"])
def test_resuming_a_copied_lm_run_leaves_the_original_byte_identical(tmp_path, out):
    # the original trained with a relative --out, as the README's commands do
    work = tmp_path / "work"
    work.mkdir()
    _ok(qkv("train", "lm", "--out", "runs/a", "--quiet", "train.max_steps=6", *TINY_LM, *SNAPSHOTS, cwd=work))
    copy = work / "runs" / "b"
    target = "runs/b" if out == "relative" else str(copy)
    shutil.copytree(work / "runs" / "a", copy)
    before = digest(work / "runs" / "a")
    _ok(qkv("train", "lm", "--out", target, "--resume", "--quiet", "train.max_steps=10", cwd=work))
    assert digest(work / "runs" / "a") == before
    assert _snapshots(copy) == ["step_10.safetensors"] and _loop_state(copy)["step"] == 10


@needs_shakespeare
def test_a_copy_whose_snapshots_link_to_the_original_is_refused_before_anything_is_written(lm_run, tmp_path):
    """`cp -r` keeps a symbolic link as a link: a copy whose snapshots/ is the original's would
    prune the original's files, so its resume is refused and both stay as they were."""
    original = tmp_path / "original"
    shutil.copytree(lm_run, original)
    copy = tmp_path / "copy"
    shutil.copytree(original, copy, ignore=shutil.ignore_patterns("snapshots"))
    (copy / "snapshots").symlink_to(original / "snapshots")
    before, before_copy = digest(original), digest(copy)
    refused(
        qkv("train", "lm", "--out", str(copy), "--resume", "--quiet", "train.max_steps=9"), "leads outside"
    )
    assert digest(original) == before and digest(copy) == before_copy


@needs_shakespeare
def test_a_moved_run_resumes_from_another_working_directory(lm_run, tmp_path):
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.copytree(lm_run, tmp_path / "a")
    (tmp_path / "a").rename(moved)
    other = tmp_path / "another_cwd"
    other.mkdir()
    _ok(
        qkv(
            "train",
            "lm",
            "--out",
            "../elsewhere/renamed",
            "--resume",
            "--quiet",
            "train.max_steps=9",
            cwd=other,
        )
    )
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["steps"] == 9 and _snapshots(moved) == ["step_9.safetensors"]


@pytest.fixture(scope="module")
def translation_run(tmp_path_factory) -> Path:
    """A finished 6-step translation run made with a relative --out (``rel_t``), three snapshots."""
    if not (DATA / "multi30k" / "train.de.gz").is_file() and not os.environ.get("CI"):
        pytest.skip(f"Multi30k not found under {DATA} (set QKV_DATA_DIR)")
    work = tmp_path_factory.mktemp("translation")
    _ok(
        qkv(
            "train",
            "translation",
            "--out",
            "rel_t",
            "--quiet",
            "train.max_steps=6",
            *TINY_TRANSLATION,
            cwd=work,
        )
    )
    return work / "rel_t"


@needs_multi30k
def test_translation_copy_averages_only_its_own_snapshots(translation_run, tmp_path):
    copy = tmp_path / "copy_t"
    resume = ("train", "translation", "--out", str(copy), "--resume", "--quiet", "train.max_steps=9")
    _copy_resume_and_check(translation_run, copy, *resume)
    assert _snapshots(copy) == ["step_7.safetensors", "step_8.safetensors", "step_9.safetensors"]
    average_weights(sorted((copy / "snapshots").iterdir()), tmp_path / "expected.safetensors")
    got, expected = load_file(copy / "averaged.safetensors"), load_file(tmp_path / "expected.safetensors")
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert json.loads((copy / "summary.json").read_text())["steps"] == 9


@needs_multi30k
def test_a_translation_run_moved_after_a_relative_out_resumes_from_anywhere(translation_run, tmp_path):
    shutil.copytree(translation_run, tmp_path / "rel_t")
    (tmp_path / "rel_t").rename(tmp_path / "moved")
    _ok(
        qkv(
            "train", "translation", "--out", "moved", "--resume", "--quiet", "train.max_steps=8", cwd=tmp_path
        )
    )
    assert json.loads((tmp_path / "moved" / "summary.json").read_text())["steps"] == 8


@needs_multi30k
def test_an_old_run_with_absolute_snapshot_paths_resumes_correctly(tmp_path):
    """tests/fixtures/old_runs/translation_absolute: written by qkv at 4fbefe8 with an absolute
    --out (/tmp/oldfx/translation_absolute), snapshots 4-6 recorded by that path."""
    run = tmp_path / "old"
    shutil.copytree(FIXTURES / "translation_absolute", run)
    recorded = _loop_state(run)["snapshots"]
    assert all(r.startswith("/tmp/oldfx/translation_absolute/snapshots/") for r in recorded)
    done = qkv(
        "train", "translation", "--out", str(run), "--resume", "--quiet", "train.max_steps=8", "test=false"
    )
    _ok(done)
    # the old entries were mapped to this directory's files, then pruned like its own
    assert _loop_state(run)["snapshots"] == [f"snapshots/step_{s}.safetensors" for s in (6, 7, 8)]
    assert _snapshots(run) == ["step_6.safetensors", "step_7.safetensors", "step_8.safetensors"]
    assert json.loads((run / "summary.json").read_text())["steps"] == 8


@needs_shakespeare
def test_a_copied_run_on_token_shards_resumes_on_the_copied_shards(tmp_path):
    """A project directory holding prepared shards and a run trained on them, copied whole: the
    copy resumes on its own shards (the data is compared by content, not by where it was)."""
    project = tmp_path / "a"
    _ok(
        qkv(
            "prepare",
            "lm",
            "tinyshakespeare",
            "--out",
            str(project / "data"),
            "--quiet",
            "--shard-tokens",
            "100000",
        )
    )
    train = ("train", "lm", "--out", "run", "--quiet", "data=data")
    _ok(qkv(*train, "train.max_steps=6", *TINY_LM, *SNAPSHOTS, cwd=project))
    copy = tmp_path / "b"
    shutil.copytree(project, copy)
    before = digest(project)
    _ok(qkv(*train, "--resume", "train.max_steps=9", cwd=copy))
    assert digest(project) == before and _snapshots(copy / "run") == ["step_9.safetensors"]


@pytest.mark.skipif(
    not (DATA / "refseq_proteomes" / "mgenitalium_proteins.faa").is_file() and not os.environ.get("CI"),
    reason=f"RefSeq proteomes not found under {DATA} (set QKV_DATA_DIR)",
)
def test_a_protein_mlm_run_resumes_on_its_own_shards_only(tmp_path):
    proteome = str(DATA / "refseq_proteomes" / "mgenitalium_proteins.faa")
    for name, fraction in (("data", "0.05"), ("other", "0.1")):
        prepare = ("prepare", "protein-mlm", proteome, "--out", str(tmp_path / name), "--quiet")
        _ok(qkv(*prepare, "--val-fraction", fraction))
    tiny = ["model.d_model=16", "model.n_heads=2", "model.d_ff=32", "model.n_layers=1", "model.max_len=64"]
    tiny += ["max_tokens=1024", "train.eval_every=2", "train.warmup_steps=1", "train.precision=fp32"]
    run = tmp_path / "run"
    _ok(
        qkv(
            "train",
            "protein-mlm",
            "--out",
            str(run),
            "--quiet",
            f"data={tmp_path / 'data'}",
            "train.max_steps=2",
            *tiny,
        )
    )
    assert json.loads((run / "data.json").read_text())["settings"]["val_fraction"] == 0.05
    before = digest(run)
    resume = ("train", "protein-mlm", "--out", str(run), "--resume", "--quiet", "train.max_steps=4")
    refused(qkv(*resume, f"data={tmp_path / 'other'}"), "is not the data this run started on")
    assert digest(run) == before
    (tmp_path / "data").rename(tmp_path / "moved")  # the same data elsewhere: resumed
    _ok(qkv(*resume, f"data={tmp_path / 'moved'}"))


@pytest.fixture(scope="module")
def lora_run(lm_run, tmp_path_factory) -> Path:
    """A 6-step LoRA run (rank 4) on the LM run, and a full-weight run from the same init."""
    root = tmp_path_factory.mktemp("lora")
    for name, extra in (("lora", ["train.lora_rank=4"]), ("full", [])):
        args = (
            "train",
            "lm",
            "--out",
            str(root / name),
            "--init",
            str(lm_run),
            "--quiet",
            "train.max_steps=6",
        )
        # the tiny LM's settings but its architecture, which init fixes
        settings = [a for a in TINY_LM if not a.startswith("model.") or a.startswith("model.max_len")]
        _ok(qkv(*args, *settings, *SNAPSHOTS, *extra))
    return root


@needs_shakespeare
def test_resuming_a_copied_lora_run_leaves_the_original_byte_identical(lora_run, tmp_path):
    copy = tmp_path / "copy"
    _copy_resume_and_check(
        lora_run / "lora", copy, "train", "lm", "--out", str(copy), "--resume", "--quiet", "train.max_steps=9"
    )
    assert (copy / "adapter_model.safetensors").is_file()


@needs_shakespeare
@pytest.mark.parametrize(
    ("run", "change", "named"),
    [
        ("lora", "train.lora_rank=8", "train.lora_rank: 4 saved, 8 now"),
        ("lora", "train.lora_modules=qkv,o,ffn", "train.lora_modules: 'qkv,o' saved, 'qkv,o,ffn' now"),
        ("full", "train.lora_rank=8", "train.lora_rank: 0 saved, 8 now"),
    ],
)
def test_a_refused_resume_with_other_adapters_leaves_the_run_byte_identical(
    lora_run, tmp_path, run, change, named
):
    copy = tmp_path / run
    shutil.copytree(lora_run / run, copy)
    before = digest(copy)
    refused(
        qkv("train", "lm", "--out", str(copy), "--resume", "--quiet", "train.max_steps=9", change),
        "cannot resume",
        named,
    )
    assert digest(copy) == before
    _ok(qkv("train", "lm", "--out", str(copy), "--resume", "--quiet", "train.max_steps=9"))  # still resumable


# --------------------------------------------------------------------------- refused inputs


@pytest.mark.parametrize(("text", "reason"), [("", "is empty"), ("x", "leaves a split empty")])
def test_prepare_refusals_write_nothing(tmp_path, text, reason):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text)
    refused(qkv("prepare", "lm", str(corpus), "--out", str(tmp_path / "out"), "--quiet"), reason)
    assert not (tmp_path / "out").exists()


def _truncated_gzip(path: Path, text: str) -> Path:
    whole = gzip.compress(text.encode())
    path.write_bytes(whole[: len(whole) // 2])
    return path


def test_a_truncated_gzip_fasta_is_one_line_naming_the_file_and_prepare_writes_nothing(tmp_path):
    fasta = _truncated_gzip(
        tmp_path / "p.fasta.gz", "".join(f">p{i}\nMKTAYIAKQRQISFVKSHFSRQ\n" for i in range(300))
    )
    refused(
        qkv("prepare", "protein-mlm", str(fasta), "--out", str(tmp_path / "out"), "--quiet"),
        f"cannot read FASTA file {fasta}: truncated",
    )
    assert not (tmp_path / "out").exists()
    with pytest.raises(QkvError, match="truncated"):
        read_fasta(fasta)


def test_truncated_gzip_inputs_of_every_reader_are_one_line_naming_the_file(tmp_path):
    lines = _truncated_gzip(tmp_path / "train.de.gz", "Ein Hund läuft.\n" * 2000)
    with pytest.raises(QkvError, match=f"cannot read {lines}: truncated"):
        read_lines(lines)
    idx = tmp_path / "t10k-images-idx3-ubyte.gz"
    idx.write_bytes(b"not compressed at all")
    with pytest.raises(QkvError, match=f"cannot read {idx}: corrupt gzip data"):
        read_idx(idx)


@needs_multi30k
def test_a_truncated_multi30k_file_is_a_one_line_error(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(DATA / "multi30k", data / "multi30k")
    whole = (data / "multi30k" / "train.de.gz").read_bytes()
    (data / "multi30k" / "train.de.gz").write_bytes(whole[: len(whole) // 2])
    done = qkv("train", "translation", "--out", str(tmp_path / "t"), "--quiet", *TINY_TRANSLATION, data=data)
    refused(done, "train.de.gz: truncated")
    assert not (tmp_path / "t").exists()


def test_fasta_with_text_before_the_first_header_is_refused_by_every_reader_alike(tmp_path):
    fasta = tmp_path / "notes.fasta"
    fasta.write_text("exported by a tool\n>p1\nMKTAYIAKQR\n>p2\nMKTAYIAKQRQ\n")
    reason = "text before the first '>' header"
    with pytest.raises(QkvError, match=reason):
        read_fasta(fasta)
    refused(qkv("prepare", "protein-mlm", str(fasta), "--out", str(tmp_path / "out"), "--quiet"), reason)
    assert not (tmp_path / "out").exists()


def test_a_name_the_setting_knows_is_recorded_as_a_name_even_beside_a_file_of_that_name(
    tmp_path, monkeypatch
):
    """The corpus and task loaders read their names (tinyshakespeare, sst2, signalp) before any
    file: a run started beside a file of that name records the name, as it was read; a name
    the setting does not know that is a file here is recorded as an absolute path."""
    from qkv.runs.record import recorded_input

    monkeypatch.chdir(tmp_path)
    for name in ("tinyshakespeare", "sst2", "signalp", "mine.txt"):
        (tmp_path / name).write_text("a file of the same name\n")
    assert recorded_input("tinyshakespeare", "corpus") == "tinyshakespeare"
    assert recorded_input("sst2", "task") == "sst2" and recorded_input("signalp", "task") == "signalp"
    assert recorded_input("mine.txt", "corpus") == str(tmp_path / "mine.txt")
    assert recorded_input("tinyshakespeare", "data") == str(tmp_path / "tinyshakespeare")  # data= is a path
    assert recorded_input("absent.txt", "corpus") == "absent.txt"
