"""What a run reports while it trains: ``metrics.jsonl``, the progress bar and ``loss.png``.

``metrics.jsonl`` has one JSON object per line, each with its ``"step"``: every 20 steps a
training row (``epoch``, ``train_loss`` (summed loss over target tokens, over those 20 steps),
``lr``, ``tokens_per_s``, ``elapsed_min``), and whatever rows the loop adds (validation scores,
skipped non-finite steps). On a run whose CPU load is measured (a
:class:`~qkv.cpu_share.CpuShare`, CPU-bound work), the training row also holds ``quiet_share``,
the share of a quiet machine's steps the run makes, as the progress bar shows it. Only rank 0
writes it, and streams each row to the run's trackers (``train.log_to``,
:mod:`qkv.train.trackers`). ``loss.png`` needs the ``plot`` extra (matplotlib); without it the
run trains and draws none.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from .. import distributed, extras
from ..files import atomic_write, write_text
from ..runs.layout import METRICS
from .checkpointer import LoopState
from .step import StepStats
from .train_settings import TrainSettings

if TYPE_CHECKING:
    from ..cpu_share import CpuShare
    from .trackers import Trackers

logger = logging.getLogger(__name__)

TRAIN_ROW_EVERY = 20  # steps


class TrainMetrics:
    """The run's ``metrics.jsonl``, progress bar and ``loss.png``; a context manager that
    closes the bar and draws ``loss.png`` when the loop ends, however it ends.

    Built at the start of a run: a fresh run (``resumed`` false) deletes an earlier
    ``metrics.jsonl``; a resumed one drops the rows after ``state.step``, which it will write
    again. The bar fills by seconds under a time budget alone (its ETA is then exact), else by
    steps; ``progress`` false (or a rank other than 0) hides it. On a busy machine (the run's
    ``cpu``, :class:`~qkv.cpu_share.CpuShare`, says so) it warns as training starts, and the bar
    says what share of a quiet run's steps the run makes (:meth:`~qkv.cpu_share.CpuShare.report`).
    ``trackers`` (the run's :class:`~qkv.train.trackers.Trackers`, opened here at the loop's
    first step) get every row too; their owner closes them.
    """

    def __init__(
        self,
        run_dir: Path,
        cfg: TrainSettings,
        state: LoopState,
        resumed: bool,
        progress: bool = True,
        cpu: CpuShare | None = None,
        trackers: Trackers | None = None,
    ) -> None:
        self.path = Path(run_dir) / METRICS
        self.plot_path = Path(run_dir) / "loss.png"
        self.cfg = cfg
        self.main = distributed.is_main()
        self.trackers = trackers
        if self.main and trackers is not None:  # first: a tracker that cannot start changes nothing
            trackers.start(state.step)
        if self.main:
            if resumed:
                _truncate_metrics(self.path, state.step)
            else:
                self.path.unlink(missing_ok=True)
        time_budget = cfg.max_minutes if cfg.max_steps is None else None
        self.by_time = time_budget is not None
        self.bar = tqdm(
            total=cfg.max_steps if time_budget is None else round(time_budget * 60),
            initial=round(state.elapsed_s) if self.by_time else state.step,
            disable=not (progress and self.main),
            unit="s" if self.by_time else "step",
            dynamic_ncols=True,
            desc="train",
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining}{postfix}"
            if self.by_time
            else None,
        )
        self._window_loss, self._window_tokens, self._window_t = 0.0, 0, time.perf_counter()
        self.cpu = cpu
        self._cpu_since = 0 if cpu is None else cpu.mark()
        if self.main and cpu is not None:
            cpu.warn_if_busy()

    def log(self, row: dict[str, Any]) -> None:
        """Append ``row`` to ``metrics.jsonl`` and log it to the trackers (rank 0)."""
        if self.main:
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            if self.trackers is not None:
                self.trackers.log(row)

    def train_step(self, state: LoopState, stats: StepStats) -> None:
        """Count an applied step (``state`` already updated by it): advance the bar and, every
        :data:`TRAIN_ROW_EVERY` steps, write the training row and show it on the bar."""
        self._window_loss += stats.loss_sum
        self._window_tokens += stats.tokens
        bar = self.bar
        bar.update(min(round(state.elapsed_s), bar.total) - bar.n if self.by_time else 1)
        if state.step % TRAIN_ROW_EVERY:
            return
        dt = time.perf_counter() - self._window_t
        row = {
            "step": state.step,
            "epoch": state.epoch,
            "train_loss": self._window_loss / max(self._window_tokens, 1),
            "lr": stats.lr,
            "tokens_per_s": self._window_tokens / max(dt, 1e-9),
            "elapsed_min": round(state.elapsed_s / 60, 2),
        }
        share = {} if self.cpu is None else self.cpu.report(since=self._cpu_since)
        if share.get("quiet_share") is not None:
            row["quiet_share"] = share["quiet_share"]
        self.log(row)
        max_minutes = self.cfg.max_minutes
        left = "" if max_minutes is None else f" left {max(0.0, max_minutes - state.elapsed_s / 60):.1f}m"
        busy = f" busy: {100 * share['quiet_share']:.0f}% of quiet" if share.get("busy") else ""
        bar.set_postfix_str(
            f"loss {row['train_loss']:.3f} lr {row['lr']:.2e} "
            f"tok/s {row['tokens_per_s']:.0f} ep {state.epoch}"
            + (f" step {state.step}" if self.by_time else left)
            + busy
        )
        self._window_loss, self._window_tokens, self._window_t = 0.0, 0, time.perf_counter()

    def __enter__(self) -> TrainMetrics:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.bar.close()
        finally:
            if self.main and self.path.exists():
                _plot_curves(self.path, self.plot_path)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop the rows a resumed run will write again (those after its checkpoint's step)."""
    if path.exists():
        rows = [
            r
            for r in path.read_text(encoding="utf-8").splitlines()
            if r.strip() and json.loads(r).get("step", 0) <= step
        ]
        write_text(path, "".join(r + "\n" for r in rows))


def _plot_curves(metrics_path: Path, out: Path) -> None:
    if extras.missing("plot"):  # a core install trains; the curve is an extra
        logger.info(f"no {out.name}: drawing it needs matplotlib: pip install 'qkv[plot]'")
        return
    # The object API draws without pyplot, so no global matplotlib backend is touched.
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    train = [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    fig = Figure(figsize=(6, 4), layout="tight")
    ax = fig.subplots()
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss (the training objective)")
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss (NLL)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    if train or val:
        ax.legend()
    ax.grid(alpha=0.3)
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
