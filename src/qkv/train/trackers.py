"""Experiment tracking: a run's ``metrics.jsonl`` rows, settings and summary, streamed as it
trains to the trackers ``train.log_to`` names, each through its own library.

* ``tensorboard``: event files in ``RUN/tensorboard/`` (``torch.utils.tensorboard.SummaryWriter``),
  so ``tensorboard --logdir runs/`` shows every run under ``runs/``; the settings are the run's
  hyper-parameters in TensorBoard's HPARAMS tab.
* ``wandb``: a Weights & Biases run in ``RUN/wandb/``, offline (``wandb sync`` uploads it later)
  unless the environment chooses a mode (``WANDB_MODE``, or ``wandb offline`` / ``wandb
  disabled`` in this folder); project and entity are wandb's own (``WANDB_PROJECT``, ...).
* ``mlflow``: a run in MLflow's tracking store: ``MLFLOW_TRACKING_URI`` where it is set, else
  MLflow's default local store in the current folder (``./mlruns`` up to MLflow 2.x,
  ``sqlite:///mlflow.db`` from 3.x, as ``mlflow ui`` opens by default there); the experiment is
  MLflow's (``MLFLOW_EXPERIMENT_NAME`` / ``MLFLOW_EXPERIMENT_ID``, else its default one).

Each tracker gets every numeric key of every ``metrics.jsonl`` row (``train_loss``, ``lr``,
``tokens_per_s``, ``quiet_share``, validation scores, ...) at the row's ``step``, the settings
as hyper-parameters (dotted keys: ``train.lr``), the summary's numbers at the end (keys
``summary/<dotted key>``: ``summary/validation.val_loss``), and the run directory's name as the
run's name. ``metrics.jsonl`` stays the record; the trackers are views of it. Only rank 0 logs.

A resumed run continues the same tracker runs (their ids are kept in ``RUN/trackers.json``):
TensorBoard hides the events after the checkpoint's step (``purge_step``), wandb and MLflow
reopen the same run. Steps the resumed run makes again are logged again: wandb keeps the first
values (it drops steps it has already seen), MLflow keeps both in a metric's history (equal but
for ``tokens_per_s`` and ``elapsed_min``: resuming repeats the steps exactly).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from .. import distributed, extras
from ..errors import ConfigError, QkvError
from ..files import write_json
from ..settings import flatten

__all__ = ["RECORD", "TRACKERS", "Trackers", "check_trackers", "numbers", "tracker_names"]

logger = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "wandb", "mlflow")
RECORD = "trackers.json"  # in the run directory: the tracker runs' ids, for --resume
SUMMARY_PREFIX = "summary/"


def tracker_names(log_to: str) -> list[str]:
    """The trackers of a ``train.log_to`` value (``"tensorboard,wandb"``; ``""``: none), in
    order, each once.

    Raises:
        ConfigError: a name that is not one of :data:`TRACKERS`.
    """
    names = list(dict.fromkeys(n.strip() for n in log_to.split(",") if n.strip()))
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ConfigError(
            f"train.log_to={log_to!r}: {', '.join(unknown)} is not a tracker; choose among "
            f"{', '.join(TRACKERS)}, comma-separated (tensorboard,wandb), or leave it empty"
        )
    return names


def check_trackers(names: list[str]) -> None:
    """Refuse, writing nothing, trackers whose library is not installed (one line naming the
    extra to install; ``qkv[mlflow]`` brings SQLAlchemy and Alembic too, which MLflow 3's
    default local store ``sqlite:///mlflow.db`` needs and ``mlflow-skinny`` leaves out).

    Raises:
        QkvError: (:class:`qkv.extras.MissingExtra`) ``pip install 'qkv[NAME]'`` is needed.
    """
    for name in names:
        extras.require(name, f"train.log_to={name}")


def numbers(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric values of ``row`` (nested dicts flattened to dotted keys, ``prefix`` before
    each key), ``step`` and booleans left out: what a tracker plots."""
    return {
        key: float(value)
        for key, value in flatten(row, prefix)
        if isinstance(value, int | float) and not isinstance(value, bool) and key != prefix + "step"
    }


def hyperparameters(settings: dict[str, Any]) -> dict[str, str | int | float | bool]:
    """The settings tree as flat hyper-parameters: dotted keys, values a tracker takes (``None``,
    lists and paths written as JSON text)."""
    return {
        key: value if isinstance(value, str | int | float | bool) else json.dumps(value, default=str)
        for key, value in flatten(settings)
    }


class _TensorBoard:
    """Event files in ``RUN/tensorboard`` through ``torch.utils.tensorboard.SummaryWriter``."""

    def __init__(self, run_dir: Path, params: dict, resumed_at: int | None, record: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        # purge_step: TensorBoard hides the events a resumed run writes again (after its step)
        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge, flush_secs=10)
        # the session's start alone: the HPARAMS tab then lists every scalar as a metric
        _, self._start, self._end = hparams(params, {})
        self.events: Any = cast(Any, self.writer).file_writer  # its own file, for the hparams records
        self.events.add_summary(self._start)
        self.where = f"tensorboard: {run_dir / 'tensorboard'}"

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def summary(self, step: int, values: dict[str, float]) -> None:
        self.log(step, values)
        self.events.add_summary(self._end)

    def close(self, status: str) -> None:
        self.writer.close()


class _Wandb:
    """A Weights & Biases run in ``RUN/wandb``, offline unless the environment chooses a mode,
    silent (nothing printed, the console not captured)."""

    def __init__(self, run_dir: Path, params: dict, resumed_at: int | None, record: dict) -> None:
        import wandb

        with _silent_wandb():
            # a mode the environment chose: WANDB_MODE, `wandb offline` / `wandb disabled` here
            found = getattr(wandb.setup().settings, "model_fields_set", ())  # pydantic's: set, not default
            chosen = os.environ.get("WANDB_MODE") or "mode" in found
            settings = wandb.Settings(silent=True, console="off")
            if not chosen:
                settings.mode = "offline"
            self.run = wandb.init(
                dir=run_dir,
                name=run_dir.name,
                id=record.get("id"),  # None: wandb makes one
                resume="allow",
                config=params,
                settings=settings,
            )
        record["id"] = self.run.id
        later = "; `wandb sync` uploads it" if self.run.settings.mode == "offline" else ""
        self.where = f"wandb: {self.run.settings.mode} run {self.run.id} in {run_dir / 'wandb'}{later}"

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def summary(self, step: int, values: dict[str, float]) -> None:
        self.run.summary.update(values)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)


class _Mlflow:
    """A run in MLflow's tracking store (:func:`mlflow.get_tracking_uri`), through
    ``MlflowClient`` (no global active run is touched)."""

    def __init__(self, run_dir: Path, params: dict, resumed_at: int | None, record: dict) -> None:
        import mlflow
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        record.setdefault("tracking_uri", mlflow.get_tracking_uri())  # a resumed run's own store
        with _quieter("mlflow", "alembic"):  # their INFO lines as a local store is made
            self.client = MlflowClient(tracking_uri=record["tracking_uri"])
        if "run_id" in record:
            self.client.update_run(record["run_id"], status="RUNNING")
            logged = self.client.get_run(record["run_id"]).data.params
        else:
            run = self.client.create_run(_experiment_id(self.client), run_name=run_dir.name)
            record["run_id"], logged = run.info.run_id, {}
        self.run_id = record["run_id"]
        # MLflow refuses to change a logged parameter: a resumed run adds only new ones
        new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in logged]
        self.client.log_batch(self.run_id, params=new)
        self.where = f"mlflow: run {self.run_id} in {record['tracking_uri']}"

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def summary(self, step: int, values: dict[str, float]) -> None:
        self.log(step, values)

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


def _experiment_id(client: Any) -> str:
    """MLflow's experiment for a new run: ``MLFLOW_EXPERIMENT_ID``, else ``MLFLOW_EXPERIMENT_NAME``
    (made if new), else its default experiment ("0")."""
    from mlflow.environment_variables import MLFLOW_EXPERIMENT_ID, MLFLOW_EXPERIMENT_NAME

    name = MLFLOW_EXPERIMENT_NAME.get()
    if MLFLOW_EXPERIMENT_ID.get() or not name:
        return MLFLOW_EXPERIMENT_ID.get() or "0"
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


@contextmanager
def _silent_wandb() -> Iterator[None]:
    """``WANDB_SILENT`` for a while: wandb reads it as it loads its settings files, before a
    setting passed to it applies; the environment is then given back as it was."""
    before = os.environ.get("WANDB_SILENT")
    os.environ["WANDB_SILENT"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["WANDB_SILENT"]
        else:
            os.environ["WANDB_SILENT"] = before


@contextmanager
def _quieter(*names: str) -> Iterator[None]:
    """Raise the named loggers to WARNING for a while, then give them back their levels."""
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


ADAPTERS = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _Mlflow}


class Trackers:
    """The trackers of one run (rank 0; elsewhere none): a context manager that closes them
    however the run ends (MLflow's status ``FINISHED``, ``KILLED`` on Ctrl-C, ``FAILED``; wandb's
    exit code 0 or 1).

    Built before the run starts, opened by :meth:`start` once the loop knows its first step (the
    training loop's :class:`~qkv.train.metrics.TrainMetrics` calls it), fed every
    ``metrics.jsonl`` row (:meth:`log`) and the summary (:meth:`summary`).

    Args:
        names: trackers among :data:`TRACKERS` (:func:`tracker_names`), checked by
            :func:`check_trackers`.
        run_dir: the run directory (its name is the tracker runs' name).
        settings: the run's settings tree (nested dicts), logged as hyper-parameters.
        resume: continue the tracker runs whose ids ``RUN/trackers.json`` keeps.
    """

    def __init__(self, names: list[str], run_dir: Path, settings: dict[str, Any], resume: bool) -> None:
        self.names = names if distributed.is_main() else []
        self.run_dir, self.resume = Path(run_dir), resume
        self.params = hyperparameters(settings)
        self.open: list[Any] = []
        self.started = False

    def start(self, step: int) -> None:
        """Open the trackers (once): new tracker runs, or, resumed at ``step``, the run's own.

        Raises:
            QkvError: a tracker's library could not start a run (not logged in, a store that
                cannot open, a server out of reach), in one line naming it.
        """
        if self.started or not self.names:
            return
        self.started = True
        path = self.run_dir / RECORD
        records = json.loads(path.read_text(encoding="utf-8")) if self.resume and path.is_file() else {}
        for name in self.names:
            record = records.setdefault(name, {})
            try:
                self.open.append(
                    ADAPTERS[name](self.run_dir, self.params, step if self.resume else None, record)
                )
            except Exception as exc:
                self.close("FAILED")
                first = (str(exc).strip().splitlines() or [""])[0]
                raise QkvError(f"train.log_to={name}: {type(exc).__name__}: {first}") from exc
        write_json(path, records)
        for tracker in self.open:
            logger.info(tracker.where)

    def log(self, row: dict[str, Any]) -> None:
        """Log a ``metrics.jsonl`` row's numbers at its ``step``."""
        values = numbers(row)
        for tracker in self.open:
            tracker.log(row["step"], values)

    def summary(self, summary: dict[str, Any], step: int) -> None:
        """Log the summary's numbers (``summary/<dotted key>``) at the run's last ``step``."""
        values = numbers(summary, SUMMARY_PREFIX)
        for tracker in self.open:
            tracker.summary(step, values)

    def close(self, status: str = "FINISHED") -> None:
        """Close every open tracker, each even when another fails to."""
        opened, self.open = self.open, []
        errors = []
        for tracker in opened:
            try:
                tracker.close(status)
            except Exception as exc:  # the others still close
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Trackers:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close("FINISHED")
            return
        try:
            self.close("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")
        except Exception as error:  # the run's own exception is the one to see
            logger.warning(f"a tracker did not close: {error}")
