"""A run directory's layout: the names of its files, and the one place that turns what a run
records into a path.

The layout is Hugging Face's (``config.json``, ``model.safetensors``, ``tokenizer.json``) plus
the training run's own files: :data:`TRAIN_CONFIG` (the settings and provenance),
:data:`SUMMARY`, :data:`TASK` (a classifier's classes), :data:`DATA` (what a run trained on),
the training state and the snapshots.

A run directory is self-contained: every path it records into itself (the snapshots listed in
``train_state.pt``) is relative to the directory itself, so
the directory can be copied, moved or renamed and resumed from any working directory, and a
resumed copy touches only its own files. Every file the training loop removes, and every
recorded path it writes or reads, goes through :func:`run_file`, which refuses a path that
leaves the run directory: deleting or overwriting a file outside it is impossible by
construction, whatever a (possibly old, copied or edited) training state says.

Runs written before this rule recorded snapshots as ``--out`` was given (absolute, or relative
to the directory the command ran in); :func:`qkv.train.train_state.recorded_snapshot` maps such an entry
into the run as it is read.
"""

from __future__ import annotations

from pathlib import Path, PurePath

from ..errors import QkvError

CONFIG = "config.json"  # the model's config (Hugging Face's name)
TRAIN_CONFIG = "train_config.json"  # the recipe, its settings as resolved, provenance
SUMMARY = "summary.json"  # what the run scored, written at its end
TASK = "task.json"  # a classifier's task: classes, level, input
DATA = "data.json"  # what a run on shards or its own text trained on (checked on resume)
TRAIN_STATE = "train_state.pt"  # the training state a resume continues from
SNAPSHOTS = "snapshots"


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
    root, resolved = run_dir.resolve(), path.resolve()
    if resolved == root or not resolved.is_relative_to(root):
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
