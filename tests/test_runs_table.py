"""``qkv runs``: the table of the runs under folders (qkv.runs.table), its statuses, figures,
order and JSON, the overlaid curves, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import TINY_LM, refused, run_main

from qkv.errors import QkvError
from qkv.files import write_json
from qkv.runs.table import (
    COLUMNS,
    RunRow,
    curves_figure,
    read_metrics,
    run_table,
    sort_rows,
    trained_into,
    training_dirs,
)


def _run(
    path: Path,
    recipe: str,
    summary: dict | None = None,
    metrics: list[dict] | None = None,
    settings: dict | None = None,
    files: tuple[str, ...] = (),
) -> Path:
    """A hand-written run directory: ``train_config.json`` naming ``recipe`` (and ``settings``),
    the summary and metrics rows given, and empty ``files``."""
    path.mkdir(parents=True)
    write_json(path / "train_config.json", {"recipe": recipe, **(settings or {})})
    if summary is not None:
        write_json(path / "summary.json", summary)
    if metrics is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    for name in files:
        (path / name).write_bytes(b"")
    return path


CURVE = [
    {"step": 20, "epoch": 0, "train_loss": 3.0, "lr": 1e-3, "tokens_per_s": 900.0, "elapsed_min": 0.5},
    {"step": 20, "elapsed_min": 0.6, "val_loss": 2.9, "val_ppl": 18.2},
    {"step": 40, "epoch": 0, "train_loss": 2.5, "lr": 1e-3, "tokens_per_s": 950.0, "elapsed_min": 1.1},
    {"step": 40, "elapsed_min": 1.25, "val_loss": 2.4, "val_ppl": 11.0},
]


@pytest.fixture
def sweep(tmp_path) -> Path:
    """A folder of hand-written runs of each status and kind of summary, one nested a level
    deeper, and a file and a hidden folder that are no runs."""
    root = tmp_path / "sweep"
    _run(
        root / "mt",
        "translation",
        {
            "selected_weights": "best",
            "validation": {"val_loss": 2.1, "val_ppl": 8.2, "val_bleu": 30.5, "val_chrf": 55.0},
            "test2016": {"bleu": 35.25, "chrf": 60.0, "loss": 2.0},
            "train_minutes": 10.04,
            "steps": 1500,
            "cpu_share": {"cpus": 2, "others_cpus": 0.0, "quiet_share": 0.98, "estimated": False},
        },
        CURVE,
    )
    _run(
        root / "proteins" / "amp",
        "protein-cls",
        {
            "task": "amp",
            "score": "mcc",
            "validation": {"accuracy": 0.9, "mcc": 0.71},
            "test": {"accuracy": 0.88, "mcc": 0.66},
            "train_minutes": 3.0,
            "steps": 300,
        },
    )
    _run(root / "lm-stopped", "lm", metrics=CURVE, files=("train_state.pt",))
    _run(root / "encoder", "encoder", settings={"converted_from": "minilm"})
    _run(root / "lm-running", "lm", metrics=CURVE[:2])
    (root / "notes.txt").write_text("not a run\n")
    _run(root / ".hidden" / "x", "lm")
    return root


def test_the_rows_say_what_each_run_recorded(sweep):
    rows = {Path(r.run).name: r for r in run_table([sweep])}
    assert list(rows) == ["encoder", "lm-running", "lm-stopped", "mt", "amp"]  # sorted walk, no hidden
    assert rows["mt"] == RunRow(
        str(sweep / "mt"), "translation", "finished", 1500, 10.04, "bleu", 30.5, 35.25, 0.98
    )
    # the figure the run is scored by (its summary's "score"), on both splits
    assert rows["amp"] == RunRow(
        str(sweep / "proteins" / "amp"), "protein-cls", "finished", 300, 3.0, "mcc", 0.71, 0.66
    )
    # without a summary: the last step, the training clock and the last validation of metrics.jsonl
    assert rows["lm-stopped"] == RunRow(str(sweep / "lm-stopped"), "lm", "stopped", 40, 1.25, "loss", 2.4)
    assert rows["encoder"] == RunRow(str(sweep / "encoder"), "encoder", "converted")
    assert rows["lm-running"].status == "stopped"  # no process trains it
    assert (rows["lm-running"].steps, rows["lm-running"].val) == (20, 2.9)


def test_a_run_named_itself_is_one_row_and_a_run_found_twice_is_listed_once(sweep):
    rows = run_table([sweep / "mt", sweep, sweep / "mt"])
    assert [Path(r.run).name for r in rows] == ["mt", "encoder", "lm-running", "lm-stopped", "amp"]


def test_a_process_training_into_a_run_makes_it_running(sweep):
    """What a `qkv train ... --out` process looks like to the process table: its command line
    (here a sleeping python whose arguments say so) and its working directory (the --out is
    relative to it)."""
    assert trained_into(["/venv/bin/qkv", "train", "lm", "--out", "runs/a", "train.max_steps=5"]) == "runs/a"
    assert trained_into(["python", "-m", "qkv", "--debug", "train", "lm", "--out=/r/b"]) == "/r/b"
    assert trained_into(["torchrun", "--nproc-per-node", "2", "-m", "qkv", "train", "lm", "--ou", "c"]) == "c"
    assert trained_into(["qkv", "train", "lm", "--out", "d", "--dry-run"]) is None  # writes nothing there
    assert trained_into(["qkv", "generate", "runs/a", "--out", "x"]) is None
    assert trained_into(["python", "train.py", "--out", "runs/a"]) is None
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "qkv", "train", "lm", "--out", "lm-running"], cwd=sweep
    )
    try:
        deadline = time.monotonic() + 20
        while (sweep / "lm-running").resolve() not in training_dirs():
            assert time.monotonic() < deadline, "the process's command line was never seen"
            time.sleep(0.1)
        rows = {Path(r.run).name: r for r in run_table([sweep])}
        assert rows["lm-running"].status == "running"
        assert rows["lm-stopped"].status == "stopped"
    finally:
        proc.kill()
        proc.wait()
    assert run_table([sweep / "lm-running"])[0].status == "stopped"


def test_a_running_run_with_an_old_summary_shows_its_progress(sweep, monkeypatch):
    """A finished run resumed for more steps: its summary is the last run's, so the row
    reads metrics.jsonl while a process trains it."""
    import qkv.runs.table as table

    monkeypatch.setattr(table, "training_dirs", lambda: {(sweep / "mt").resolve()})
    row = run_table([sweep / "mt"])[0]
    assert (row.status, row.steps, row.minutes, row.metric, row.val, row.test) == (
        "running",
        40,
        1.25,
        "loss",
        2.4,
        None,
    )


def test_a_half_written_last_line_is_not_read_but_a_broken_line_is_refused(tmp_path):
    run = _run(tmp_path / "r", "lm", metrics=CURVE)
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 60, "epoch": 0, "train_l')
    assert read_metrics(run) == CURVE
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": \n{"step": 2}\n')
    with pytest.raises(QkvError, match=r"metrics.jsonl, line 2: not JSON"):
        read_metrics(run)
    (run / "metrics.jsonl").write_text('{"step": 1}\n["a list"]\n')
    with pytest.raises(QkvError, match=r"line 2: not a metrics row"):
        read_metrics(run)


def test_sort_orders_numbers_by_value_and_puts_missing_values_last():
    rows = [RunRow("a", steps=100, val=2.0), RunRow("b", steps=None), RunRow("c", steps=3, val=1.0)]
    rows.append(RunRow("d", steps=20, recipe="lm"))
    assert [r.run for r in sort_rows(rows, "steps")] == ["c", "d", "a", "b"]  # not "100" < "20" < "3"
    assert [r.run for r in sort_rows(rows, "steps", reverse=True)] == ["a", "d", "c", "b"]
    assert [r.run for r in sort_rows(rows, "val")] == ["c", "a", "b", "d"]
    assert [r.run for r in sort_rows(rows, "recipe")] == ["d", "a", "b", "c"]
    assert [r.run for r in sort_rows(rows, "run", reverse=True)] == ["d", "c", "b", "a"]
    with pytest.raises(QkvError, match="choose one of run, recipe"):
        sort_rows(rows, "bleu")


def test_the_table_and_json_of_the_command(sweep, capsys):
    code, out, err = run_main(capsys, "runs", str(sweep), "--sort", "steps", "--reverse")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert [line.split()[0] for line in lines[1:]] == [
        str(sweep / p) for p in ("mt", "proteins/amp", "lm-stopped", "lm-running", "encoder")
    ]
    assert lines[1].split()[1:] == [
        "translation",
        "finished",
        "1500",
        "10.04",
        "bleu",
        "30.5",
        "35.25",
        "98%",
    ]
    assert lines[5].split()[1:] == ["encoder", "converted", "-", "-", "-", "-", "-", "-"]
    assert len({len(line) for line in lines[:2]}) == 1  # aligned
    code, out, err = run_main(capsys, "runs", str(sweep), "--json", "--sort", "val")
    assert code == 0, err
    rows = json.loads(out)
    assert [Path(r["run"]).name for r in rows] == ["amp", "lm-stopped", "lm-running", "mt", "encoder"]
    assert rows[3] == {
        "run": str(sweep / "mt"),
        "recipe": "translation",
        "status": "finished",
        "steps": 1500,
        "minutes": 10.04,
        "metric": "bleu",
        "val": 30.5,
        "test": 35.25,
        "quiet": 0.98,
    }


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A folder of two tiny LM runs trained by `qkv train` (20 and 40 steps, validation every 10)."""
    from qkv.cli import main

    root = tmp_path_factory.mktemp("trained")
    for name, steps in (("lm-20", 20), ("lm-40", 40)):
        argv = ["train", "lm", "--out", str(root / name), "--quiet", f"train.max_steps={steps}", *TINY_LM]
        assert main([*argv, "train.eval_every=10", "train.threads=1"]) == 0
    return root


def test_real_runs_are_read_as_their_summaries_say(trained, tiny_vit_run, tiny_runs):
    rows = run_table([trained, tiny_vit_run])
    for row in rows[:2]:
        summary = json.loads((Path(row.run) / "summary.json").read_text())
        assert (row.recipe, row.status, row.metric) == ("lm", "finished", "loss")
        assert (row.steps, row.minutes) == (summary["steps"], summary["train_minutes"])
        assert row.val == summary["validation"]["val_loss"] and row.test is None
        assert row.quiet == summary["cpu_share"]["quiet_share"]
    assert [r.steps for r in rows[:2]] == [20, 40]
    vit = rows[2]
    summary = json.loads((tiny_vit_run / "summary.json").read_text())
    assert (vit.recipe, vit.status, vit.steps, vit.metric) == ("vit", "finished", 20, "accuracy")
    assert (vit.val, vit.test) == (summary["validation"]["accuracy"], summary["test"]["accuracy"])
    # the fixture's runs hold a model and settings, nothing of a training
    kinds = {r.recipe: r for r in run_table([tiny_runs["lm"].parent])}
    assert set(kinds) == {"translation", "translation-rnn", "lm", "diffusion-lm", "protein-cls"}
    assert {(r.status, r.steps, r.val) for r in kinds.values()} == {("stopped", None, None)}


def test_the_curves_are_each_runs_metrics(trained, sweep, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    runs = [trained / "lm-20", trained / "lm-40", sweep / "encoder"]  # the encoder: no curve, left out
    fig = curves_figure(runs)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert sorted(lines) == [f"lm-{n} {what} loss" for n in (20, 40) for what in ("train", "validation")]
    for n in (20, 40):
        rows = read_metrics(trained / f"lm-{n}")
        val = lines[f"lm-{n} validation loss"]
        assert (
            list(val.get_xdata())
            == [r["step"] for r in rows if "val_loss" in r]
            == list(range(10, n + 1, 10))
        )
        assert list(val.get_ydata()) == [r["val_loss"] for r in rows if "val_loss" in r]
        train = lines[f"lm-{n} train loss"]
        assert list(train.get_xdata()) == list(range(20, n + 1, 20))
        assert list(train.get_ydata()) == [r["train_loss"] for r in rows if "train_loss" in r]
        assert train.get_color() == val.get_color()
    assert lines["lm-20 train loss"].get_color() != lines["lm-40 train loss"].get_color()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert legend == ["lm-20", "lm-40", "train loss", "validation loss"]
    # two runs of one name are told apart by their paths
    (tmp_path / "a").mkdir()
    twin = tmp_path / "a" / "lm-20"
    twin.symlink_to(trained / "lm-20", target_is_directory=True)
    labels = {line.get_label() for line in curves_figure([trained / "lm-20", twin]).axes[0].get_lines()}
    assert f"{twin} train loss" in labels and f"{trained / 'lm-20'} train loss" in labels

    out = tmp_path / "curves.png"
    code, stdout, err = run_main(capsys, "runs", str(trained), "--plot", str(out))
    assert code == 0, err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and stdout.count("lm-") == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".curves")]  # no temporary left


def test_a_malformed_run_among_many_is_unreadable_and_named_itself_refused(sweep, capsys):
    (sweep / "mt" / "summary.json").write_text("{not json")
    code, out, err = run_main(capsys, "runs", str(sweep), "--json")
    assert code == 0
    rows = {Path(r["run"]).name: r for r in json.loads(out)}
    assert rows["mt"]["status"] == "unreadable" and "summary.json" in rows["mt"]["error"]
    assert rows["amp"]["status"] == "finished"
    assert f"warning: cannot read {sweep / 'mt' / 'summary.json'}" in err
    refused(run_main(capsys, "runs", str(sweep / "mt")), "cannot read", str(sweep / "mt" / "summary.json"))
    (sweep / "lm-stopped" / "metrics.jsonl").write_text("[]\n{}\n")
    refused(run_main(capsys, "runs", str(sweep / "lm-stopped")), "metrics.jsonl, line 1: not a metrics row")
    (sweep / "encoder" / "train_config.json").write_text("[1, 2]")
    refused(run_main(capsys, "runs", str(sweep / "encoder")), str(sweep / "encoder" / "train_config.json"))


def test_refusals(sweep, tmp_path, capsys):
    refused(run_main(capsys, "runs", str(tmp_path / "missing")), "missing: no such folder")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    refused(run_main(capsys, "runs", str(sweep), str(tmp_path / "empty")), "no qkv runs under", "empty")
    refused(run_main(capsys, "runs", str(sweep / "notes.txt")), "is a file, not a folder of runs")
    with pytest.raises(SystemExit) as parser_exit:  # argparse's refusal, in one line too
        run_main(capsys, "runs", str(sweep), "--sort", "bleu")
    refused((parser_exit.value.code, *capsys.readouterr()), "--sort", "invalid choice: 'bleu'")
    # no curve at all: refused before the PNG is written
    out = tmp_path / "c.png"
    refused(run_main(capsys, "runs", str(sweep / "encoder"), "--plot", str(out)), "no curves to draw")
    assert not out.exists()


def test_plot_needs_the_plot_extra(sweep, tmp_path, capsys, monkeypatch):
    import qkv.extras

    monkeypatch.setattr(qkv.extras, "missing", lambda extra: ["matplotlib"] if extra == "plot" else [])
    out = tmp_path / "c.png"
    refused(
        run_main(capsys, "runs", str(sweep), "--plot", str(out)), "qkv runs --plot", "pip install 'qkv[plot]'"
    )
    assert not out.exists()
