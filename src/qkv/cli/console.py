"""What the command line writes to stderr (messages, the library's log records, the one
line that says why a command failed, with its exit status), and the cleanup of a refused
command (it leaves nothing behind)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ..errors import QkvError
from ..runs.layout import TRAIN_STATE


def log(msg: str) -> None:
    """One message for the person at the terminal, on stderr (stdout holds results only)."""
    sys.stderr.write(f"{msg}\n")
    sys.stderr.flush()


class _StderrHandler(logging.Handler):
    """Log records to stderr through ``tqdm.write``, so a progress bar is redrawn below them
    instead of being broken; warnings and errors say so."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        msg = record.getMessage()
        if record.name == "py.warnings":  # "file:line: Category: message" and the source line
            msg = msg.strip().splitlines()[0]
        if record.levelno >= logging.WARNING:
            msg = f"{record.levelname.lower()}: {msg}"
        tqdm.write(msg, file=sys.stderr)


def setup_logging(quiet: bool, debug: bool) -> None:
    """The library logs to ``logging.getLogger("qkv")``; the CLI shows INFO and up on stderr
    (``--quiet``: warnings only, ``--debug``: everything), and Python warnings the same way."""
    handler = _StderrHandler()
    for name in ("qkv", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO)
    logging.captureWarnings(True)


def report(exc: Exception) -> int:
    """Say in one line on stderr why a command failed, and return its exit status: 2 for a
    problem the user can act on (their input, files, disk, sizes this machine cannot hold),
    1 for a bug in qkv."""
    if isinstance(exc, (QkvError, OSError)):  # the user's input, or the environment (files, disk)
        log(f"error: {_one_line(exc)}")
        return 2
    if isinstance(exc, (MemoryError, OverflowError)) or (
        isinstance(exc, RuntimeError) and _out_of_memory(exc)
    ):  # a size or number the user chose that this machine cannot hold
        log(
            f"error: {'a number is too large' if isinstance(exc, OverflowError) else 'out of memory'}: "
            f"{_one_line(exc)[:300]} (choose smaller sizes: model, batch, max_len, vocabulary)"
        )
        return 2
    # anything else is a bug: say so, never disguise it as a user error
    log(
        f"internal error (a bug in qkv, not a problem with your input): {type(exc).__name__}: "
        f"{_one_line(exc)[:300]}; run the same command with `qkv --debug ...` for the traceback and "
        "report it to the qkv developers"
    )
    return 1


def _out_of_memory(exc: RuntimeError) -> bool:
    """Whether torch failed to allocate memory: the CPU allocator's message, or CUDA's
    (``torch.OutOfMemoryError`` is a ``RuntimeError`` that says "out of memory")."""
    return "can't allocate memory" in str(exc) or "out of memory" in str(exc)


def _one_line(exc: BaseException) -> str:
    """An exception as one line: its message's lines joined (an ``OSError``: the file and why)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def remove_unstarted(out: Path, started_by: str | None = TRAIN_STATE) -> None:
    """Remove a directory this command created if it was refused before the file
    ``started_by`` was written (a refused command leaves nothing behind); a run with a training
    state is kept. ``None``: removed whatever it holds."""
    import shutil

    if out.is_dir() and not (started_by and (out / started_by).exists()):
        shutil.rmtree(out, ignore_errors=True)
