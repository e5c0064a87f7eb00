"""``qkv train ... --dry-run``: it writes nothing, reports the parameters of the model the real
run builds and, for a step budget, its exact number of steps; the estimate
(:meth:`qkv.train.schedule.Schedule.plan`) replays the loop's own schedule, so it counts what
the loop does."""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import pytest
import torch
from cli_runs import DATA, TINY_LM, TINY_TRANSLATION, digest, refused, run_main, tiny_mlm_run

from qkv.train.schedule import Schedule, Timings
from qkv.train.train_settings import TrainSettings


def plan_run(cfg: TrainSettings, steps_per_epoch: int, t: Timings, step_budget_key: str = "max_steps"):
    return Schedule.of(cfg).plan(t, steps_per_epoch, step_budget_key)


needs_multi30k = pytest.mark.skipif(  # in CI missing data must fail, not skip
    not (DATA / "multi30k" / "train.de.gz").is_file() and not os.environ.get("CI"),
    reason=f"Multi30k not found under {DATA} (set QKV_DATA_DIR)",
)

# the shared tiny run, with a validation every 4 steps and 2 snapshots kept, on one thread
TINY_TRANSLATION = [*TINY_TRANSLATION, "train.eval_every=4", "train.keep_snapshots=2", "train.threads=1"]


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """``(cwd, tmp)``: an empty working directory and an empty directory that ``tempfile``
    uses, to see everything a command leaves behind."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    return cwd, tmp


def _left(cwd: Path, tmp: Path) -> list[Path]:
    """What is left in ``cwd`` and ``tmp``, but torch's own cache folder (``torchinductor_USER``,
    which torch makes in the temporary directory for every process that trains)."""
    return [*cwd.iterdir(), *(p for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))]


def _dry_run(capsys, *args: str) -> dict:
    """``qkv train ARGS --dry-run --json``, which must succeed: its report."""
    code, out, err = run_main(capsys, "train", *args, "--dry-run", "--json", "--quiet")
    assert code == 0, err
    return json.loads(out)


def _train(capsys, *args: str) -> dict:
    """``qkv train ARGS --json``, which must succeed: its summary."""
    code, out, err = run_main(capsys, "train", *args, "--json", "--quiet")
    assert code == 0, err
    return json.loads(out)


def _same_model_and_steps(dry: dict, summary: dict) -> None:
    for key in ("steps", "parameters", "trainable_parameters"):
        assert dry[key] == summary[key], (key, dry[key], summary[key])


@needs_multi30k
def test_translation_dry_run_writes_nothing_and_predicts_the_run(capsys, isolated, tmp_path):
    cwd, tmp = isolated
    out = tmp_path / "run"
    dry = _dry_run(capsys, "translation", "--out", str(out), "--max-steps", "10", *TINY_TRANSLATION)
    assert not out.exists(), "--out is checked, never created"
    assert _left(cwd, tmp) == [], "the temporary run is removed"
    assert dry["recipe"] == "translation" and dry["bound"] == "max_steps" and dry["target_unit"] == "tokens"
    # 10 steps, validated after steps 4 and 8 and at the end; a snapshot after every step (the
    # last step's is the final one); saved first, after each validation and snapshot, and last
    assert (dry["validations"], dry["snapshots"], dry["checkpoints"]) == (3, 10, 2 + 2 + 10)
    assert dry["frozen_parameters"] == dry["adapter_parameters"] == 0
    assert dry["peak_rss_mib"] > 0 and dry["seconds_per_step"] > 0 and dry["targets_per_s"] > 0
    summary = _train(capsys, "translation", "--out", str(out), "--max-steps", "10", *TINY_TRANSLATION)
    _same_model_and_steps(dry, summary)
    assert dry["parameters"] == dry["trainable_parameters"]


@needs_multi30k
def test_a_dry_run_refuses_what_the_run_refuses_and_leaves_out_untouched(capsys, isolated, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    before = digest(out)
    args = ["train", "translation", "--dry-run", "--max-steps", "3", *TINY_TRANSLATION]
    refused(run_main(capsys, *args, "--out", str(out)), "not empty")
    refused(run_main(capsys, *args, "--out", str(out), "--resume"), "--resume")
    refused(run_main(capsys, *args, "model.d_model=15"), "divisible")
    assert digest(out) == before
    cwd, tmp = isolated
    assert _left(cwd, tmp) == []


def test_lm_dry_run_table_and_steps(capsys, isolated, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(
        "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(300))
    )
    args = ["lm", f"corpus={corpus}", "--max-steps", "7", *TINY_LM, "train.threads=1"]
    code, table, err = run_main(capsys, "train", *args, "--dry-run", "--quiet")
    assert code == 0, err
    rows = {line.split("  ")[0]: line for line in table.splitlines()}
    assert {"parameters", "peak memory", "speed", "steps", "validation", "estimated time", "dry run"} <= set(
        rows
    )
    assert "7 (" in rows["steps"] and "train.max_steps ends it" in rows["steps"]
    assert "3 passes of" in rows["validation"]  # after steps 3 and 6, and the last (7)
    dry = _dry_run(capsys, *args)
    summary = _train(capsys, *args, "--out", str(tmp_path / "run"))
    _same_model_and_steps(dry, summary)
    assert dry["validations"] == 3 and dry["total_minutes"] >= dry["train_minutes"]
    cwd, tmp = isolated
    assert _left(cwd, tmp) == []


@pytest.fixture
def protein_task(tmp_path) -> tuple[Path, Path]:
    """``(toy.csv, init run)``: a two-class protein task (lysine- vs glutamate-rich, with its
    own train/val/test split) and a tiny random protein-mlm run to start from."""
    rng = random.Random(0)
    lines = ["id,sequence,label,split"]
    for i in range(60):
        label = "pos" if i % 2 else "neg"
        rich = "K" if label == "pos" else "E"
        seq = "".join(rich if rng.random() < 0.4 else rng.choice("ACDGILMNPSTVWY") for _ in range(20))
        lines.append(f"t{i},{seq},{label},{'train' if i < 40 else 'val' if i < 50 else 'test'}")
    csv = tmp_path / "toy.csv"
    csv.write_text("\n".join(lines) + "\n")
    return csv, tiny_mlm_run(tmp_path / "mlm")


@pytest.mark.parametrize(
    ("mode", "extra"),
    [("probe", ["--freeze"]), ("lora", ["train.lora_rank=4", "train.lora_modules=qkv,o,ffn"])],
)
def test_fine_tuning_dry_runs_count_frozen_and_adapter_parameters(
    capsys, isolated, tmp_path, protein_task, mode, extra
):
    csv, init = protein_task
    args = ["protein-cls", "--task", str(csv), "--init", str(init), *extra]
    args += ["train.max_epochs=3", "max_tokens=256", "baseline=false", "train.threads=1"]
    dry = _dry_run(capsys, *args)
    summary = _train(capsys, *args, "--out", str(tmp_path / mode))
    _same_model_and_steps(dry, summary)
    assert dry["bound"] == "max_epochs" and dry["target_unit"] == "examples"
    head = 32 * 2 + 2
    encoder = summary["parameters"] - head
    if mode == "probe":
        assert dry["trainable_parameters"] == head and dry["frozen_parameters"] == encoder
        assert dry["adapter_parameters"] == 0
    else:  # rank 4 on Q/K/V 32 → 96, W_O 32 → 32, W_1 32 → 64, W_2 64 → 32; merged at the end
        adapters = 4 * ((32 + 96) + (32 + 32) + (32 + 64) + (64 + 32))
        assert dry["adapter_parameters"] == adapters and dry["trainable_parameters"] == adapters + head
        assert dry["frozen_parameters"] == encoder
    cwd, tmp = isolated
    assert _left(cwd, tmp) == []


# ---------------------------------------------------------------- the estimate's arithmetic
# 2 warm-up steps in 4 s, then 1 s a step; checkpoints 0.5 s, validation 10 s, snapshots 0.25 s
T = Timings(
    startup_s=2.0,
    prepare_s=3.0,
    batches_s=0.0,
    warmup_steps=2,
    warmup_s=4.0,
    timed_steps=5,
    step_s=1.0,
    targets_per_s=100.0,
    save_s=0.5,
    validation_s=10.0,
    snapshot_s=0.25,
    final_s=7.0,
)


def test_a_time_budget_counts_validations_and_stops_at_the_first_step_past_it():
    plan = plan_run(TrainSettings(max_minutes=1.0, eval_every=20, snapshot_minutes=10.0), 100, T)
    # step 40 ends at 0.5 + 4 + 38 + one validation and save (10.5) = 53 s < 60 s, so step 41
    # runs (after the second validation): it ends at 64.5 s
    assert (plan.steps, plan.bound, plan.step_budget) == (41, "max_minutes", None)
    assert plan.train_s == pytest.approx(64.5)
    assert (plan.validations, plan.snapshots, plan.checkpoints) == (3, 1, 4)
    assert plan.after_s == pytest.approx(10.0 + 0.25 + 0.5)  # last validation, snapshot, save
    assert plan.total_s == pytest.approx(3.0 + 64.5 + 10.75 + 7.0)
    assert plan.wall_s == pytest.approx(plan.total_s + 2.0)
    # a step budget that ends first binds instead
    short = plan_run(
        TrainSettings(max_steps=30, max_minutes=1.0, eval_every=20, snapshot_minutes=10.0), 100, T
    )
    assert (short.steps, short.bound, short.train_s) == (30, "max_steps", pytest.approx(0.5 + 4 + 28 + 10.5))


def test_epochs_snapshots_at_every_step_and_no_budget():
    plan = plan_run(TrainSettings(max_epochs=2, max_steps=50, eval_every=3, snapshot_minutes=0.0), 4, T)
    assert (plan.steps, plan.bound, plan.epochs) == (8, "max_epochs", 2.0)
    # a snapshot after each of the 8 steps (the last one is the final one); validations after
    # steps 3 and 6 and at the end; saves: first, 2 validations, 8 snapshots, last
    assert (plan.validations, plan.snapshots, plan.checkpoints) == (3, 8, 1 + 2 + 8 + 1)
    # a recipe that counts its epochs in steps (floor(4 * 2 / 3) = 2 steps of 3 accumulated
    # batches): the loop stops there, before the epochs' 2 * ceil(4 / 3) = 4
    accumulated = TrainSettings(max_epochs=2, max_steps=2, accum_steps=3)
    assert plan_run(accumulated, 2, T, step_budget_key="max_epochs").steps == 2
    # the recipe's own step count (a classifier's one epoch) names its bound
    assert plan_run(TrainSettings(max_steps=4), 4, T, step_budget_key="one_epoch").bound == "one_epoch"
    endless = plan_run(TrainSettings(), 4, T)
    assert endless.steps is None and endless.total_s is None and endless.epochs is None
    with pytest.raises(ValueError, match="steps_per_epoch"):
        plan_run(TrainSettings(max_steps=4), 0, T)


def test_the_steps_sample_every_length_and_the_longest_batch_is_found():
    from qkv.data.batching import make_batch
    from qkv.train.dry_run import batch_lengths, spread
    from qkv.train.run import padded_length

    lengths = [5, 1, 3, 9, 7]
    # lengths 1 and 9 (the shortest and the longest) first, then 5 (the middle)
    assert spread(lengths, 3, seed=0) == [1, 3, 0]
    everything = spread(lengths, 9, seed=1)
    assert everything[:2] == [1, 3] and sorted(everything) == [0, 1, 2, 3, 4]
    assert spread([4], 3, seed=0) == [0]
    pair = make_batch([([4, 5, 6], [7]), ([4], [7, 8, 9, 10])], [0, 1], pad_id=0, bos_id=1, eos_id=2)
    assert padded_length(pair) == 5  # bos + 4 target pieces, longer than the source + eos (4)
    assert padded_length([[1, 2], [3, 4, 5]]) == 3 and padded_length(torch.zeros(4, 7, dtype=torch.long)) == 7
    assert (
        padded_length(torch.arange(4)) is None and padded_length(torch.zeros(2, 3)) is None
    )  # indices, pixels
    assert batch_lengths([[[1]], [[1, 2]]], padded_length) == [1, 2]
    assert batch_lengths([[[1]], [[2]]], padded_length) is None, "all alike: no longest batch"
    assert batch_lengths([torch.arange(3)], padded_length) is None
