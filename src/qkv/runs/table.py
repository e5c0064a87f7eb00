"""Comparing runs: the rows of ``qkv runs`` (:func:`run_table`: every run directory under some
folders, one :class:`RunRow` each, read from what the run recorded) and their training curves
overlaid (:func:`curves_figure`, :func:`plot_curves`).

A run directory is a folder holding one of the files of qkv's training record (:data:`RECORD`:
``train_config.json``, ``summary.json``, ``metrics.jsonl``, ``train_state.pt``); a folder given
is either one, or searched at any depth (hidden folders and the inside of a run are not).

A row's status, in this order:

- ``running``: a process on this machine is ``qkv train ... --out`` this directory (its command
  line and working directory, read with psutil: :func:`training_dirs`). The process table is
  the truth: a run killed a second ago is no longer running, whatever its files' times say. A
  run trained from Python (``Recipe.train``) or on another machine is not seen: it shows as
  stopped until its ``summary.json`` is written.
- ``finished``: ``summary.json`` is written (the run's last file).
- ``converted``: a checkpoint converted from Hugging Face (``qkv convert hf``: its
  ``train_config.json`` says ``converted_from``), never trained here.
- ``stopped``: any other run; it resumes (``qkv train RECIPE --out RUN --resume``) when it holds
  ``train_state.pt``.
- ``unreadable``: a run found under a folder whose record cannot be read (logged as a warning
  naming the file); a run directory named itself is refused instead (:class:`~qkv.errors.QkvError`).

The figures come from ``summary.json`` for a finished run (the final model's validation and
test scores, ``steps``, ``train_minutes``, ``cpu_share``) and from ``metrics.jsonl`` for the
others (its last step, the training clock and its last validation row; no test score). Each
run's headline metric is the figure the run says it is scored by (``summary.json``'s ``score``,
which the protein tasks write), else the first of :data:`HEADLINE` that its scores hold: exact
match for captions, BLEU for translation, accuracy for classifiers, the loss for language
models. This module sits below the recipes (it reads runs, it does not know their code), so it
reads what the run recorded rather than asking a recipe.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import QkvError
from ..files import atomic_write
from .info import RunInfo, run_json, run_settings
from .layout import METRICS, SUMMARY, TRAIN_CONFIG, TRAIN_STATE

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "COLUMNS",
    "HEADLINE",
    "RECORD",
    "RunRow",
    "curves_figure",
    "find_runs",
    "is_run",
    "plot_curves",
    "read_metrics",
    "read_row",
    "run_table",
    "sort_rows",
    "trained_into",
    "training_dirs",
]

logger = logging.getLogger(__name__)

RECORD = (TRAIN_CONFIG, SUMMARY, METRICS, TRAIN_STATE)  # any of them makes a folder a run
# the table's columns, in order: what --sort takes and the keys of --json's objects
COLUMNS = ("run", "recipe", "status", "steps", "minutes", "metric", "val", "test", "quiet")
# the headline metric of a run whose summary names none: the first its scores hold
HEADLINE = ("exact_match", "bleu", "accuracy", "loss")


@dataclass(frozen=True)
class RunRow:
    """One run of the table (the module docstring says where each figure comes from).

    Attributes:
        run: the run directory, as found (the folder given, joined with the path below it).
        recipe: the recipe that trained it (``None``: unreadable).
        status: ``running``, ``finished``, ``converted``, ``stopped`` or ``unreadable``.
        steps: optimizer steps made (a run in progress: the last step ``metrics.jsonl`` recorded).
        minutes: minutes of training (the loop's clock: ``train_minutes``, or ``elapsed_min``).
        metric: the headline metric's name (``"bleu"``, ``"accuracy"``, ``"loss"``, ...).
        val: its value on the validation split (a run in progress: its last validation).
        test: its value on the test split (``None`` when the run scored none).
        quiet: the share of a quiet machine's steps the run made, 0 to 1
            (``summary.json``'s ``cpu_share.quiet_share``; ``None`` before the end, on a GPU).
        error: why the run is ``unreadable`` (one line naming the file), else ``None``.
    """

    run: str
    recipe: str | None = None
    status: str = "stopped"
    steps: int | None = None
    minutes: float | None = None
    metric: str | None = None
    val: float | None = None
    test: float | None = None
    quiet: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON object: the :data:`COLUMNS`, and ``error`` for an unreadable run."""
        row = asdict(self)
        return row if self.error else {k: row[k] for k in COLUMNS}


def is_run(folder: str | Path) -> bool:
    """Whether ``folder`` holds a file of qkv's training record (:data:`RECORD`)."""
    return any((Path(folder) / name).is_file() for name in RECORD)


def find_runs(folder: str | Path) -> list[Path]:
    """The run directories of ``folder``: itself when it is one, else every run below it, in
    sorted order (hidden folders and the inside of a run are not searched).

    Raises:
        QkvError: ``folder`` does not exist, is a file, or holds no run.
    """
    folder = Path(folder)
    if not folder.exists():
        raise QkvError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise QkvError(f"{folder} is a file, not a folder of runs")
    if is_run(folder):
        return [folder]
    found = []
    for parent, dirs, _ in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if is_run(parent):
            found.append(Path(parent))
            dirs[:] = []  # its snapshots are no runs
    if not found:
        raise QkvError(f"no qkv runs under {folder} (a run directory holds {TRAIN_CONFIG} or {SUMMARY})")
    return found


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of a run's ``metrics.jsonl`` (``[]`` when it has none). The last line of a run
    in progress may be half written: without its newline, a line that is not JSON is left out.

    Raises:
        QkvError: the file cannot be read, or a line is not a JSON object with an integer
            ``step`` (the file and line named).
    """
    path = Path(run_dir) / METRICS
    if not path.is_file():
        return []
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise QkvError(f"cannot read {path}: {exc}") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            if n == len(lines):  # no newline after it: the row being appended
                break
            raise QkvError(f"{path}, line {n}: not JSON") from None
        if not isinstance(row, dict) or type(row.get("step")) is not int:
            raise QkvError(f"{path}, line {n}: not a metrics row (a JSON object with an integer step)")
        rows.append(row)
    return rows


def run_table(folders: Iterable[str | Path]) -> list[RunRow]:
    """One :class:`RunRow` per run under ``folders`` (:func:`find_runs`; a run found twice is
    listed once), in the order found. A run that cannot be read is an ``unreadable`` row when
    it was found under a folder; one named itself is refused.

    Raises:
        QkvError: a folder that does not exist or holds no run, or a run named itself whose
            record cannot be read (one line naming the file).
    """
    found = [(run, run == Path(folder)) for folder in folders for run in find_runs(folder)]
    training = training_dirs()
    rows, seen = [], set()
    for run, named in found:
        where = run.resolve()
        if where not in seen:
            seen.add(where)
            rows.append(read_row(run, running=where in training, strict=named))
    return rows


def read_row(run_dir: str | Path, running: bool = False, strict: bool = True) -> RunRow:
    """The row of one run directory. ``running``: a process trains it now (:func:`training_dirs`).

    Raises:
        QkvError: (``strict`` only; else an ``unreadable`` row) a ``train_config.json``,
            ``summary.json`` or ``metrics.jsonl`` that cannot be read, named in one line.
    """
    try:
        return _read_row(Path(run_dir), running)
    except QkvError as exc:
        if strict:
            raise
        logger.warning(f"{exc}; {run_dir} is listed as unreadable")
        return RunRow(str(run_dir), status="unreadable", error=str(exc))


def _read_row(run_dir: Path, running: bool) -> RunRow:
    settings = run_settings(run_dir)  # a malformed one is named here, before RunInfo reads it
    recipe = RunInfo.read(run_dir).recipe
    # a resumed run's summary.json is its previous end's: while it trains, its metrics say more
    summary = None if running else run_json(run_dir, SUMMARY, missing=None)
    if summary is None:
        status = "running" if running else "converted" if "converted_from" in settings else "stopped"
        return RunRow(str(run_dir), recipe, status, **_progress(read_metrics(run_dir)))
    figures = _final(summary)
    if figures["steps"] is None or figures["minutes"] is None:  # a summary of the first versions
        progress = _progress(read_metrics(run_dir))
        figures = {**figures, **{k: progress[k] for k in ("steps", "minutes") if figures[k] is None}}
    return RunRow(str(run_dir), recipe, "finished", **figures)


def _final(summary: dict) -> dict[str, Any]:
    """A finished run's figures, from its summary."""
    val = _scores(summary.get("validation", summary.get("val")))
    test_key = "test" if "test" in summary else next((k for k in summary if k.startswith("test")), "")
    test = _scores(summary.get(test_key))
    score = summary.get("score")
    metric = score if isinstance(score, str) else _headline(val, test)
    cpu = summary.get("cpu_share")
    return {
        "steps": _int(summary.get("steps")),
        "minutes": _number(summary.get("train_minutes")),
        "metric": metric,
        "val": _value(val, metric),
        "test": _value(test, metric),
        "quiet": _number(cpu.get("quiet_share")) if isinstance(cpu, dict) else None,
    }


def _progress(rows: list[dict]) -> dict[str, Any]:
    """A run's figures so far, from its ``metrics.jsonl`` rows."""
    clock = [r["elapsed_min"] for r in rows if _number(r.get("elapsed_min")) is not None]
    val: dict = next((r for r in reversed(rows) if any(k.startswith("val_") for k in r)), {})
    metric = _headline(val)
    return {
        "steps": max((r["step"] for r in rows), default=None),
        "minutes": clock[-1] if clock else None,
        "metric": metric,
        "val": _value(val, metric),
    }


def _scores(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _number(value: Any) -> float | None:
    """``value`` when it is a number (JSON's ``true`` is not one), else ``None``."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _value(scores: dict, metric: str | None) -> float | None:
    """``metric`` in a split's scores: ``val_<metric>`` (the validation rows' names) or ``metric``."""
    if metric is None:
        return None
    found = _number(scores.get(f"val_{metric}"))
    return found if found is not None else _number(scores.get(metric))


def _headline(*scores: dict) -> str | None:
    return next((m for m in HEADLINE if any(_value(s, m) is not None for s in scores)), None)


def sort_rows(rows: Sequence[RunRow], key: str, reverse: bool = False) -> list[RunRow]:
    """``rows`` ordered by column ``key`` (one of :data:`COLUMNS`): numbers by value, anything
    else as text, ``reverse`` from the largest; rows without a value come last either way, and
    equal ones keep their order.

    Raises:
        QkvError: ``key`` is not a column.
    """
    if key not in COLUMNS:
        raise QkvError(f"--sort {key}: choose one of {', '.join(COLUMNS)}")
    present = [r for r in rows if getattr(r, key) is not None]
    numeric = all(_number(getattr(r, key)) is not None for r in present)
    order = sorted(
        present, key=lambda r: getattr(r, key) if numeric else str(getattr(r, key)), reverse=reverse
    )
    return order + [r for r in rows if getattr(r, key) is None]


def trained_into(cmdline: Sequence[str]) -> str | None:
    """The ``--out`` of a ``qkv train`` command line (``qkv train``, ``python -m qkv train``,
    ``torchrun ... -m qkv train``; ``--out=DIR`` and argparse's abbreviations too), as written
    on it; ``None`` for any other command, a dry run among them (it writes nothing there)."""
    start = next((i for i, arg in enumerate(cmdline) if Path(arg).stem == "qkv"), None)
    if start is None:
        return None
    rest = list(cmdline[start + 1 :])
    if "train" not in rest or "--dry-run" in rest:
        return None
    for i, arg in enumerate(rest):
        flag, equals, value = arg.partition("=")
        if len(flag) >= 3 and "--out".startswith(flag):
            if equals:
                return value
            return rest[i + 1] if i + 1 < len(rest) else None
    return None


def training_dirs() -> set[Path]:
    """The run directories that processes on this machine are training now, resolved: each
    ``qkv train`` process's ``--out`` (:func:`trained_into`), taken from its working directory
    when relative. A process whose command line or working directory this user may not read
    (another user's) is left out, unless its ``--out`` is absolute."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        out = trained_into(proc.info["cmdline"] or [])
        if out is None:
            continue
        if not Path(out).is_absolute():
            try:
                out = os.path.join(proc.cwd(), out)
            except (psutil.Error, OSError):
                continue
        found.add(Path(out).resolve())
    return found


def curves_figure(run_dirs: Sequence[str | Path]) -> Figure:
    """The runs' training curves on one axes: the train loss (solid) and the validation loss
    (dashed, dotted at each validation) of ``metrics.jsonl`` against the optimizer step, one
    colour per run, labelled by the run directory's name (its path where two share a name).
    Each line's label is ``"<name> train loss"`` or ``"<name> validation loss"``; the legend
    shows the runs' colours and the two line styles. A run without a curve is left out (a
    warning names it).

    Raises:
        QkvError: no run has a curve, or a ``metrics.jsonl`` cannot be read (named).
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    read = [(Path(run), read_metrics(run)) for run in run_dirs]
    curves = [(run, rows) for run, rows in read if _curve(rows, "train_loss") or _curve(rows, "val_loss")]
    if not curves:
        raise QkvError(f"no curves to draw: none of the runs has a {METRICS} with a train or validation loss")
    kept = {run for run, _ in curves}
    for run in (run for run, _ in read if run not in kept):
        logger.warning(f"{run} has no loss curve in {METRICS}; it is left out of the plot")
    names = [run.name for run, _ in curves]
    many = len(curves) > 10  # tab10's colours run out: spread them over viridis instead
    cmap = colormaps["viridis" if many else "tab10"]
    fig = Figure(figsize=(8, 5), layout="tight")
    ax = fig.subplots()
    handles = []
    for i, (run, rows) in enumerate(curves):
        name = str(run) if names.count(run.name) > 1 else run.name
        color = cmap(i / (len(curves) - 1)) if many else cmap(i)
        for key, style, what in (("train_loss", "-", "train"), ("val_loss", "o--", "validation")):
            if points := _curve(rows, key):
                ax.plot(
                    *zip(*points, strict=True), style, color=color, markersize=3, label=f"{name} {what} loss"
                )
        handles.append(Line2D([], [], color=color, label=name))
    handles += [
        Line2D([], [], color="black", linestyle="-", label="train loss"),
        Line2D([], [], color="black", linestyle="--", marker="o", markersize=3, label="validation loss"),
    ]
    ax.legend(handles=handles, fontsize="small")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per target)")
    ax.grid(alpha=0.3)
    return fig


def _curve(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in rows if _number(r.get(key)) is not None]


def plot_curves(run_dirs: Sequence[str | Path], out: str | Path) -> Figure:
    """Draw :func:`curves_figure` of ``run_dirs`` into the PNG ``out``, written whole or not at
    all (:func:`qkv.files.atomic_write`); returns the figure.

    Raises:
        QkvError: what :func:`curves_figure` raises, before ``out`` is written.
    """
    fig = curves_figure(run_dirs)
    atomic_write(Path(out), lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    return fig
