"""Paths inside a run directory: the one place that turns what a run records into a file.

A run directory is self-contained: every path it records into itself (the snapshots listed in
``train_state.pt``) is relative to the directory itself, so
the directory can be copied, moved or renamed and resumed from any working directory, and a
resumed copy touches only its own files. Every file the training loop removes, and every
recorded path it writes or reads, goes through :func:`run_file`, which refuses a path that
leaves the run directory: deleting or overwriting a file outside it is impossible by
construction, whatever a (possibly old, copied or edited) training state says.

Runs written before this rule recorded snapshots as ``--out`` was given (absolute, or relative
to the directory the command ran in); :func:`recorded_snapshot` maps such an entry to the file
of the same name in this run's ``snapshots/`` when it is there, and drops it otherwise (the
file it named, in another directory, is never touched).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path, PurePath

from ..errors import QkvError

logger = logging.getLogger(__name__)

SNAPSHOTS = "snapshots"
_SNAPSHOT_NAME = re.compile(r"step_\d+\.safetensors")


def run_file(run_dir: Path, name: str | PurePath) -> Path:
    """``run_dir / name`` for a ``name`` recorded relative to the run directory, checked to stay
    inside it once symbolic links and ``..`` are resolved.

    Raises:
        QkvError: ``name`` is absolute or leads outside ``run_dir`` (named in one line).
    """
    run_dir = Path(run_dir)
    if PurePath(name).is_absolute():
        raise QkvError(f"{name} is an absolute path; a run directory records paths relative to itself")
    path = run_dir / name
    root = run_dir.resolve()
    if not path.resolve().is_relative_to(root) or path.resolve() == root:
        raise QkvError(f"{name} leads outside the run directory {run_dir}; qkv never touches it")
    return path


def remove_run_file(run_dir: Path, name: str | PurePath) -> None:
    """Delete the file ``name`` of the run directory if it exists (:func:`run_file` checks
    that it is inside; a missing file is not an error)."""
    run_file(run_dir, name).unlink(missing_ok=True)


def snapshot_name(step: int) -> str:
    """What a run records for the snapshot of optimizer step ``step``:
    ``snapshots/step_<step>.safetensors``, relative to the run directory."""
    return f"{SNAPSHOTS}/step_{step}.safetensors"


def recorded_snapshot(run_dir: Path, recorded: str) -> str | None:
    """A snapshot entry of any version's training state as today's name (:func:`snapshot_name`).

    Today's entries (``snapshots/step_N.safetensors``) are returned as they are. An earlier
    version's entry (absolute, or relative to another working directory) becomes
    ``snapshots/<its file name>`` when that file is in this run's ``snapshots/``; otherwise
    ``None``: the entry is dropped, and the file it named is never read or removed.
    """
    path = PurePath(recorded)
    if not _SNAPSHOT_NAME.fullmatch(path.name) or path.parent.name != SNAPSHOTS:
        logger.warning(f"{run_dir}: ignoring the snapshot entry {recorded!r} (not a snapshot of a run)")
        return None
    name = f"{SNAPSHOTS}/{path.name}"
    if recorded == name:
        return name
    if run_file(run_dir, name).is_file():
        return name
    logger.warning(
        f"{run_dir}: the snapshot {recorded} recorded by an earlier qkv is not in this run directory; "
        "it is left out of averaging and never touched"
    )
    return None
