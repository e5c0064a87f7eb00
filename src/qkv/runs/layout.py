"""A run directory's layout: the names of its files, and the one place that turns what a run
records into a path.

The layout is Hugging Face's (:data:`CONFIG`, :data:`WEIGHTS`, :data:`TOKENIZER`) plus the
training run's own files: :data:`TRAIN_CONFIG` (the settings and provenance), :data:`SUMMARY`,
:data:`TASK` (a classifier's classes), :data:`DATA` (what a run trained on), the weights kept
while training (:data:`BEST`, :data:`LAST`; :func:`select_weights` says which one the final
model is), the training state and the snapshots.

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
WEIGHTS = "model.safetensors"  # the final model's weights, what every command loads (Hugging Face's name)
TOKENIZER = "tokenizer.json"  # the tokenizer (Hugging Face's name and format)
BEST = "best.safetensors"  # the best weights on validation so far, saved while training
LAST = "last.safetensors"  # the weights of the latest checkpoint
AVERAGED = "averaged.safetensors"  # the average of the last snapshots (translation, §6.1)
TRAIN_CONFIG = "train_config.json"  # the recipe, its settings as resolved, provenance
SUMMARY = "summary.json"  # what the run scored, written at its end
TASK = "task.json"  # a classifier's task: classes, level, input
DATA = "data.json"  # what a run on shards or its own text trained on (checked on resume)
TRAIN_STATE = "train_state.pt"  # the training state a resume continues from
METRICS = "metrics.jsonl"  # the training curve, one JSON object per line (qkv.train.metrics)
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


def select_weights(run_dir: Path) -> Path:
    """The weights file a finished run's final model (:data:`WEIGHTS`) comes from: :data:`BEST`,
    the best on validation, when validation ran, else :data:`LAST` (whether or not it exists:
    the caller that loads it names a missing file)."""
    best = Path(run_dir) / BEST
    return best if best.is_file() else Path(run_dir) / LAST


def snapshot_name(step: int) -> str:
    """What a run records for the snapshot of optimizer step ``step``:
    ``snapshots/step_<step>.safetensors``, relative to the run directory."""
    return f"{SNAPSHOTS}/step_{step}.safetensors"
