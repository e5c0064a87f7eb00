"""Creating and recording a run directory: the checks before a run writes anything
(:func:`prepare_run_dir`), the record of what it trained on (:func:`prepared_data_record`,
:func:`refuse_other_data`), and its settings with their provenance (:func:`write_settings`).

A resumed run must be the run it continues: the same recipe, processes, model, data and the
settings that define its data, its vocabulary and which weights train (each recipe's settings
class lists them as ``FIXED_ON_RESUME``, :func:`refuse_changed_settings`); each difference is
refused in one line before anything is written.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import distributed
from ..compat import check_format_version
from ..errors import ConfigError, QkvError
from ..files import folder_obstacle, write_json
from ..models.config import ModelConfig
from ..settings import to_dict
from .info import resumed_json, run_header
from .layout import CONFIG, DATA, SNAPSHOTS, TOKENIZER, TRAIN_CONFIG, TRAIN_STATE, run_file

if TYPE_CHECKING:
    from ..data.shards import PreparedData


def prepare_run_dir(
    run_dir: str | Path, resume: bool, recipe: str, check_state: Callable[[Path], Any]
) -> Path:
    """Check that ``run_dir`` can take this run, writing nothing: a new run needs it absent or
    empty (nothing saved is overwritten); ``resume`` needs a run of the same ``recipe``, trained
    on as many processes, with a training state that ``check_state`` (the training package's
    :func:`qkv.train.train_state.check_state`) reads. The directory is created by the run's
    first write, once its data and settings are checked too. Under torchrun only rank 0 checks
    (the others never write).

    Raises:
        QkvError: a non-empty directory without ``resume``; with it: nothing to resume, a run
            of another recipe or number of processes, a truncated or corrupt training state, a
            ``snapshots`` folder that links outside the run (pruning would delete another
            directory's files).
    """
    run_dir = Path(run_dir)
    if not distributed.is_main():
        return run_dir
    kind = folder_obstacle(run_dir)[0]
    if kind == "file":
        raise QkvError(f"--out {run_dir} is a file, not a directory")
    if not resume:
        if kind == "not empty":
            raise QkvError(
                f"run directory {run_dir} is not empty; use --resume to continue it or choose another --out"
            )
        return run_dir
    if not (run_dir / TRAIN_STATE).is_file():
        raise QkvError(
            f"nothing to resume in {run_dir}: no {TRAIN_STATE} (it stopped before its first "
            "checkpoint); start it again without --resume, into an empty --out"
        )
    saved = resumed_json(run_dir, TRAIN_CONFIG)
    if saved.get("recipe") != recipe:
        raise QkvError(
            f"{run_dir} is a {saved.get('recipe')!r} run, not {recipe!r}: resume it with "
            f"`qkv train {saved.get('recipe')} --out {run_dir} --resume`"
        )
    before = saved.get("resolved", {}).get("processes", 1)
    now = distributed.context().world_size
    if before != now:
        raise QkvError(
            f"{run_dir} was trained on {before} process(es); resume it on as many (its "
            f"random streams are per process), not {now}"
        )
    check_state(run_dir / TRAIN_STATE)
    run_file(run_dir, SNAPSHOTS)  # a link out (a copy sharing the original's): refused, not pruned
    return run_dir


NOT_THE_RUNS_DATA = (
    "is not the data this run started on (prepared again, or other inputs): resume it on its own data"
)


def prepared_data_record(run_dir: Path, prepared: PreparedData, resume: bool, given: str) -> dict:
    """What a run trained on token shards keeps as ``data.json``: where they are (absolute: a new
    run's directory is empty, so they are never inside it), and what the prepared directory's
    ``meta.json`` says of its sources, settings, counts and BPE sample (not its per-token counts
    or shard list).

    ``resume``: the run's own data must be the same (:func:`refuse_other_data`), and so must
    its tokenizer: the run's ``tokenizer.json`` has the bytes of the prepared directory's. The
    caller writes the record when a new run starts.

    Raises:
        QkvError: ``resume`` on other data (``given``: the ``data=`` value, named), before
            anything is written.
    """
    record = {
        "path": str(prepared.path.resolve()),
        **{k: v for k, v in prepared.meta.items() if k not in ("token_counts", "splits")},
    }
    if resume:
        refuse_other_data(run_dir, DATA, record, {"data": given})
        own, theirs = run_dir / TOKENIZER, prepared.tokenizer_path
        if own.is_file() and theirs.is_file() and own.read_bytes() != theirs.read_bytes():
            raise QkvError(f"cannot resume {run_dir}: data={given} {NOT_THE_RUNS_DATA}")
    return record


def refuse_other_data(
    run_dir: Path,
    name: str,
    record: dict,
    given: dict[str, object],
    explain: Callable[[dict, dict], list[str]] | None = None,
) -> None:
    """A resumed run's own data record ``run_dir / name`` (``data.json``, ``pairs.json``) must
    describe the data ``record`` describes: they are compared without their ``path`` entries (at
    any depth), so a moved run or moved data resumes. A run saved without the record (by an
    older qkv) must name the same inputs in ``train_config.json``.

    ``given``: the settings that name the data and their values now (``{"data": "pairs.tsv",
    "test_data": ...}``); the message names those whose part of the record (``record[key]`` or
    ``record["files"][key]``) differs, all of them when no part tells. ``explain``: a
    recipe's own reading of which of ``given`` a difference is due to, ``(saved record, record
    now) → keys``, where its settings do not each own a part of the record.

    Raises:
        QkvError: other data, before anything is written.
    """
    if (run_dir / name).is_file():
        saved = _what_data(resumed_json(run_dir, name))
        now = _what_data(record)
        if saved == now:
            return
        differ = explain(saved, now) if explain else [k for k in given if _part(saved, k) != _part(now, k)]
        differ = differ or [k for k, v in given.items() if v is not None] or list(given)
    else:  # an older run: the inputs its settings named
        settings = resumed_json(run_dir, TRAIN_CONFIG)
        differ = [
            k
            for k, v in given.items()
            if settings.get(k) != (recorded_input(v, k) if isinstance(v, str) else v)
        ]
        if not differ:
            return
    shown = " ".join(f"{k}={given[k]}" for k in differ)
    raise QkvError(f"cannot resume {run_dir}: {shown} {NOT_THE_RUNS_DATA}")


def _part(record: dict, key: str) -> object:
    return record.get("files", {}).get(key, record.get(key))


def _what_data(record: dict) -> dict:
    return {k: _what_data(v) if isinstance(v, dict) else v for k, v in record.items() if k != "path"}


# what train_config.json records beside the settings (provenance, not settings)
PROVENANCE = ("recipe", "model_type", "format_version", "resolved", "git_commit", "torch")


def git_commit() -> str | None:
    """The qkv source's git commit (provenance in ``train_config.json``), if known: only from
    a checkout of qkv itself, never from a repository an installed wheel happens to sit in (a
    virtual environment inside the user's own project)."""
    package = Path(__file__).resolve().parents[1]
    try:
        top, commit = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"],
            capture_output=True,
            text=True,
            cwd=package,
            timeout=5,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError, ValueError):  # no git, not a repository
        return None
    return commit if Path(top).resolve() / "src" / "qkv" == package else None


def write_settings(
    run_dir: Path,
    recipe: str,
    settings: Any,
    model_config: ModelConfig,
    resolved: dict | None = None,
    resume: bool = False,
) -> None:
    """``config.json`` (the model's config, vocabulary filled in) and ``train_config.json``
    (the recipe name, the settings tree as given with the same model config, what the run
    ``resolved`` them to on this machine (device, precision, processes), the git commit and
    torch version).

    Inputs given as paths (:data:`INPUT_PATHS`: a corpus, a prepared directory, an ``init``
    run) are recorded absolute, so ``--resume`` finds them from any working directory.

    ``resume``: the model must be the one saved in ``config.json`` (its training state holds
    that model's weights); the settings that define the run's data, vocabulary and trained
    weights were checked when the run started (:func:`refuse_changed_settings`); only
    ``train_config.json`` is rewritten, with today's settings (a longer budget, say).

    Raises:
        QkvError: ``resume`` with a model config that differs from the saved one (the keys
            named), before anything is written.
    """
    tree = {**to_dict(settings), "model": model_config.to_dict()}
    for key in INPUT_PATHS:
        if isinstance(tree.get(key), str):
            tree[key] = recorded_input(tree[key], key)
    if resume:
        _check_same_model(run_dir, model_config)
    else:
        model_config.save(run_dir / CONFIG)
    write_json(
        run_dir / TRAIN_CONFIG,
        {  # what kind of run, the settings tree, + PROVENANCE
            **run_header(recipe, model_config),
            **tree,
            **({"resolved": resolved} if resolved is not None else {}),
            "git_commit": git_commit(),
            "torch": torch.__version__,
        },
    )


# Recipe settings that name an input, either by a name qkv knows (a data set, a pretrained
# model) or by a path; a path is recorded absolute (a run is resumed from anywhere).
INPUT_PATHS = ("corpus", "val_corpus", "data", "init", "task", "labels")


def recorded_input(value: str, key: str | None = None) -> str:
    """How ``train_config.json`` records input setting ``key``: a name the setting knows
    (:func:`input_names`: a corpus, a task), which its loader reads before
    any file of that name, as given; else an existing path made absolute (where it points does
    not depend on the working directory); anything else as given."""
    if not value or value in input_names(key) or not Path(value).exists():
        return value
    return str(Path(value).resolve())


def input_names(key: str | None) -> tuple[str, ...]:
    """The names input setting ``key`` knows that win over a file of the same name (a corpus, a
    task; a pretrained ``init`` is the other way round: a path that exists wins, as
    :func:`qkv.hub.pretrained.load` reads it)."""
    from ..data.protein_tasks import TASKS
    from ..data.text import CORPORA
    from ..data.text_tasks import TEXT_TASKS

    return {"corpus": CORPORA, "val_corpus": CORPORA, "task": TASKS + TEXT_TASKS}.get(key or "", ())


_ABSENT = object()  # a key a settings tree does not have


def refuse_changed_settings(run_dir: Path, settings: Any) -> None:
    """A resumed run's settings that its settings class lists as ``FIXED_ON_RESUME`` (what
    defines its data, its vocabulary and which weights train; dotted into sections,
    ``"train.lora_rank"``) must have the values its ``train_config.json`` saved: its tokenizer,
    data record and training state hold what those values made. A key an older run did not save
    had the class's default; an input path (:data:`INPUT_PATHS`) is compared as
    :func:`recorded_input` records it. The class's ``BY_CONTENT`` (optional): keys the run's
    data record compares by content instead (:func:`refuse_other_data`,
    :func:`prepared_data_record`: the same data moved or copied resumes), left to that check.
    The budget, the optimizer and the evaluation may change.

    Raises:
        QkvError: one line naming each key that differs, its saved and its given value, before
            anything is written.
    """
    saved = resumed_json(run_dir, TRAIN_CONFIG)
    now, default = to_dict(settings), to_dict(type(settings)())
    by_content = getattr(type(settings), "BY_CONTENT", ())
    changed = []
    for key in type(settings).FIXED_ON_RESUME:
        if key in by_content:
            continue
        value = _comparable(_setting(now, key), key)
        was = _setting(saved, key)
        was = _comparable(_setting(default, key) if was is _ABSENT else was, key)
        if was != value:
            changed.append(f"{key}: {was!r} saved, {value!r} now")
    if changed:
        raise QkvError(
            f"cannot resume {run_dir} with other settings ({', '.join(changed)}): they define the data, "
            "vocabulary or trained weights its files hold; resume with the run's own settings"
        )


def _setting(tree: dict, key: str) -> Any:
    """The value of dotted ``key`` in a settings tree (:data:`_ABSENT` where it has none)."""
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _comparable(value: Any, key: str) -> Any:
    """``value`` as ``train_config.json`` holds it: JSON's types (a tuple is a list), an input
    path as :func:`recorded_input` records it."""
    if key in INPUT_PATHS and isinstance(value, str):
        return recorded_input(value, key)
    return value if value is _ABSENT else json.loads(json.dumps(value))


def _check_same_model(run_dir: Path, model_config: ModelConfig) -> None:
    model = model_config.to_dict()
    saved = check_format_version(resumed_json(run_dir, CONFIG), str(run_dir / CONFIG))
    # The saved model as it loads (a field an earlier qkv did not write gets its default); one
    # that cannot load as this family is compared as written, the keys that differ named.
    with contextlib.suppress(ConfigError):
        saved = type(model_config).from_dict(saved).to_dict()
    changed = sorted(k for k in set(saved) | set(model) if saved.get(k) != model.get(k))
    if changed:
        diff = ", ".join(f"model.{k}: {saved.get(k)!r} saved, {model.get(k)!r} now" for k in changed[:5])
        raise QkvError(
            f"cannot resume {run_dir} with another model ({diff}"
            f"{', ...' if len(changed) > 5 else ''}): resume with the run's own settings"
        )
