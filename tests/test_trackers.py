"""Experiment tracking (``train.log_to``): each tracker, read back through its own library,
holds what ``metrics.jsonl`` holds; the settings as hyper-parameters; the summary; one tracker
run continued by ``--resume``; a missing library refused before anything is written."""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runs import TINY_LM, refused, run_main

from qkv.errors import ConfigError
from qkv.extras import EXTRAS
from qkv.train.train_settings import TrainSettings


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(
            "".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(200))
        )
    return corpus


def _lm_run(tmp_path: Path, log_to: str, steps: int = 20, resume: bool = False) -> tuple[Path, dict]:
    """A tiny LM run of ``steps`` steps (validation every 3) logged to ``log_to``."""
    from qkv.recipes.registry import get
    from qkv.settings import resolve

    recipe = get("lm")
    overrides = [
        f"corpus={_corpus(tmp_path)}",
        *TINY_LM,
        f"train.max_steps={steps}",
        f"train.log_to={log_to}",
    ]
    settings = resolve(recipe.settings, overrides=overrides)
    run = tmp_path / "run"
    return run, recipe.train(settings, run, resume=resume, progress=False)


def _series(run: Path) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as the trackers should show it: key → [(step, value)] of its numbers."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        for key, value in row.items():
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool):
                out.setdefault(key, []).append((row["step"], float(value)))
    return out


def test_tensorboard_event_files_hold_the_metrics_the_settings_and_the_summary(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    run, summary = _lm_run(tmp_path, "tensorboard")
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    expected = _series(run)
    assert {"train_loss", "lr", "tokens_per_s", "val_loss"} <= set(expected)
    for key, points in expected.items():
        shown = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in shown] == [s for s, _ in points], key
        assert [v for _, v in shown] == [float(np.float32(v)) for _, v in points], key  # float32
    assert [s for s, _ in expected["val_loss"]] == [3, 6, 9, 12, 15, 18, 20]
    last = {tag: events.Scalars(tag)[-1] for tag in events.Tags()["scalars"] if tag.startswith("summary/")}
    assert last["summary/steps"].value == 20 and last["summary/steps"].step == 20
    assert last["summary/validation.val_loss"].value == pytest.approx(summary["validation"]["val_loss"])
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    assert hparams["train.lr"].number_value == pytest.approx(1e-3)
    assert hparams["train.log_to"].string_value == "tensorboard" and hparams["recipe"].string_value == "lm"


def test_mlflow_run_holds_the_metric_histories_the_settings_and_the_summary(tmp_path, monkeypatch):
    for module in EXTRAS["mlflow"]:  # what qkv[mlflow] installs
        pytest.importorskip(module)
    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)  # MLflow's default store is in the current folder
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    run, summary = _lm_run(tmp_path, "mlflow")
    record = json.loads((run / "trackers.json").read_text())["mlflow"]
    import mlflow

    assert record["tracking_uri"] == mlflow.get_tracking_uri()  # MLflow's own choice of store
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    found = client.get_run(record["run_id"])
    assert found.info.run_name == "run" and found.info.status == "FINISHED"
    for key, points in _series(run).items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(record["run_id"], key))
        assert history == points, key
    assert found.data.params["train.max_steps"] == "20" and found.data.params["model.d_model"] == "32"
    assert found.data.metrics["summary/validation.val_ppl"] == pytest.approx(summary["validation"]["val_ppl"])


def _wandb_records(path: Path) -> list:
    """The records of an offline run's ``.wandb`` file (a LevelDB-style log of 32 KiB blocks,
    each record's chunks behind a 7-byte header: CRC32, length, type), parsed by wandb's own
    protocol buffers."""
    from wandb.proto import wandb_internal_pb2

    data, block, out, pending = path.read_bytes(), 32768, [], b""
    pos = 7  # the file's header: ":W&B", a magic number, a version
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # the end of what is written so far
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            out.append(wandb_internal_pb2.Record.FromString(pending))
            pending = b""
    return out


def test_wandb_offline_run_in_the_run_directory_holds_the_metrics_and_settings(tmp_path, monkeypatch, capfd):
    pytest.importorskip("wandb")
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_SILENT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no wandb settings file of this checkout is read
    records: list[logging.LogRecord] = []
    listener = logging.Handler()
    listener.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("qkv").addHandler(listener)
    try:
        run, result = _lm_run(tmp_path, "wandb")
    finally:
        logging.getLogger("qkv").removeHandler(listener)
    # wandb printed nothing: every line on the terminal is one of qkv's log records (a CLI test
    # earlier in this process may have left qkv's console handler on its logger)
    out, err = capfd.readouterr()
    said = {r.getMessage() for r in records}
    unsaid = [line for line in err.splitlines() if line not in said and line.split(": ", 1)[-1] not in said]
    assert out == "" and unsaid == []
    assert "WANDB_SILENT" not in os.environ  # and the environment is as it was
    ident = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    (offline,) = (run / "wandb").glob(f"offline-run-*-{ident}")  # offline: `wandb sync` uploads it
    for _ in range(100):  # wandb's service may still be writing the file as finish() returns
        records = _wandb_records(offline / f"run-{ident}.wandb")
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.1)
    first = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert first.display_name == "run" and first.run_id == ident
    history: dict[str, list[tuple[int, float]]] = {}
    summary: dict[str, float] = {}
    for r in records:
        items = {"history": r.history.item, "summary": r.summary.update}.get(r.WhichOneof("record_type"), [])
        for item in items:
            key, value = item.key or "/".join(item.nested_key), json.loads(item.value_json)
            if r.HasField("history") and not key.startswith("_"):  # not wandb's own _step, _runtime
                history.setdefault(key, []).append((r.history.step.num, value))
            elif r.HasField("summary"):
                summary[key] = value
    # wandb merges a step's rows into one (the validation row's elapsed_min overwrites the
    # training row's at step 20): the last value of each key at each step
    assert history == {key: list(dict(points).items()) for key, points in _series(run).items()}
    assert summary["summary/steps"] == 20
    assert summary["summary/validation.val_loss"] == result["validation"]["val_loss"]
    config = {item.key: json.loads(item.value_json) for item in first.config.update}
    assert config["train.max_steps"] == 20 and config["train.log_to"] == "wandb" and config["recipe"] == "lm"


def test_a_resumed_run_continues_the_same_tracker_runs(tmp_path, monkeypatch):
    for module in ("tensorboard", *EXTRAS["mlflow"]):
        pytest.importorskip(module)
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())
    run, _ = _lm_run(tmp_path, "tensorboard,mlflow")
    ids = json.loads((run / "trackers.json").read_text())
    _lm_run(tmp_path, "tensorboard,mlflow", steps=26, resume=True)
    assert json.loads((run / "trackers.json").read_text()) == ids
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    steps = [s for s, _ in _series(run)["val_loss"]]
    assert steps == [3, 6, 9, 12, 15, 18, 20, 21, 24, 26]
    assert [e.step for e in events.Scalars("val_loss")] == steps  # one curve, no step twice
    client = MlflowClient(tracking_uri=ids["mlflow"]["tracking_uri"])
    history = client.get_metric_history(ids["mlflow"]["run_id"], "val_loss")
    assert sorted(m.step for m in history) == steps
    assert client.get_run(ids["mlflow"]["run_id"]).info.status == "FINISHED"


def test_a_missing_tracker_library_is_refused_in_one_line_before_anything_is_written(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec says None
    out = tmp_path / "run"
    args = ["train", "lm", "--out", str(out), f"corpus={_corpus(tmp_path)}", *TINY_LM, "train.max_steps=2"]
    line = refused(run_main(capsys, *args, "train.log_to=tensorboard,wandb"), "train.log_to=wandb")
    assert "pip install 'qkv[wandb]'" in line
    assert not out.exists()
    line = refused(run_main(capsys, *args, "train.log_to=tensorbord"), "tensorbord")
    assert "tensorboard, wandb, mlflow" in line and not out.exists()


def test_log_to_names_trackers_once_each_and_refuses_unknown_ones():
    assert TrainSettings().trackers == []
    assert TrainSettings(log_to=" mlflow,tensorboard,mlflow ").trackers == ["mlflow", "tensorboard"]
    with pytest.raises(ConfigError, match=r"'comet' is not a tracker|comet is not a tracker"):
        TrainSettings(log_to="tensorboard,comet")


def test_without_matplotlib_a_run_draws_no_loss_png_and_says_how_to_get_it(tmp_path, monkeypatch, qkv_logs):
    from qkv.train.checkpointer import LoopState
    from qkv.train.metrics import TrainMetrics

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with TrainMetrics(tmp_path, TrainSettings(max_steps=2), LoopState(), resumed=False, progress=False) as m:
        m.log({"step": 1, "val_loss": 2.0})
    assert (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "loss.png").exists()
    said = [r.getMessage() for r in qkv_logs.records if r.levelno == logging.INFO]
    assert any("pip install 'qkv[plot]'" in s for s in said)
