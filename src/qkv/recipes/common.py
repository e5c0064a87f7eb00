"""What every recipe shares: run directory checks, the settings file, provenance, and the
start of a run (threads, device, precision, seed)."""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import cpu_share
from ..compat import check_format_version
from ..device import resolve_device, resolve_precision
from ..errors import ConfigError, QkvError
from ..files import load_weights, save_weights, write_json
from ..run_files import SNAPSHOTS, run_file
from ..runs import run_header
from ..settings import to_dict
from ..train import distributed
from ..train.adapters import LoraSettings, add_lora, merge_lora, save_adapters
from ..train.checkpoint import check_state
from ..train.settings import TrainSettings

if TYPE_CHECKING:
    from ..data.shards import PreparedData
    from ..models.encoder import EncoderModel

logger = logging.getLogger(__name__)


def require_at_least_one(settings: object, *names: str) -> None:
    """Raise :class:`~qkv.errors.ConfigError` naming every field of ``settings`` among ``names``
    that is set (not ``None``) and below 1: counts and sizes that mean nothing at 0 (a
    ``max_tokens=0`` would make batches of nothing)."""
    bad = [
        f"{n} ({getattr(settings, n)}) must be >= 1"
        for n in names
        if getattr(settings, n) is not None and getattr(settings, n) < 1
    ]
    if bad:
        raise ConfigError("; ".join(bad))


def prepare_run_dir(run_dir: str | Path, resume: bool, recipe: str) -> Path:
    """Check that ``run_dir`` can take this run, writing nothing: a new run needs it absent or
    empty (nothing saved is overwritten); ``resume`` needs a run of the same ``recipe``, trained
    on as many processes, with a readable ``train_state.pt``. The directory is created by the
    run's first write, once its data and settings are checked too. Under torchrun only rank 0
    checks (the others never write).

    Raises:
        QkvError: a non-empty directory without ``resume``; with it: nothing to resume, a run
            of another recipe or number of processes, a truncated or corrupt training state, a
            ``snapshots`` folder that links outside the run (pruning would delete another
            directory's files).
    """
    run_dir = Path(run_dir)
    if not distributed.is_main():
        return run_dir
    if run_dir.exists() and not run_dir.is_dir():
        raise QkvError(f"--out {run_dir} is a file, not a directory")
    if not resume:
        if run_dir.exists() and any(run_dir.iterdir()):
            raise QkvError(
                f"run directory {run_dir} is not empty; use --resume to continue it or choose another --out"
            )
        return run_dir
    if not (run_dir / "train_state.pt").is_file():
        raise QkvError(
            f"nothing to resume in {run_dir}: no train_state.pt (it stopped before its first "
            "checkpoint); start it again without --resume, into an empty --out"
        )
    saved = read_run_json(run_dir, "train_config.json")
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
    check_state(run_dir / "train_state.pt")
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
        refuse_other_data(run_dir, "data.json", record, {"data": given})
        own, theirs = run_dir / "tokenizer.json", prepared.tokenizer_path
        if own.is_file() and theirs.is_file() and own.read_bytes() != theirs.read_bytes():
            raise QkvError(f"cannot resume {run_dir}: data={given} {NOT_THE_RUNS_DATA}")
    return record


def refuse_other_data(run_dir: Path, name: str, record: dict, given: dict[str, object]) -> None:
    """A resumed run's own data record ``run_dir / name`` (``data.json``, ``pairs.json``) must
    describe the data ``record`` describes: they are compared without their ``path`` entries (at
    any depth), so a moved run or moved data resumes. A run saved without the record (by an
    older qkv) must name the same inputs in ``train_config.json``.

    ``given``: the settings that name the data and their values now (``{"data": "pairs.tsv",
    "test_data": ...}``); the message names those whose part of the record (``record[key]`` or
    ``record["files"][key]``) differs, all of them when no part tells.

    Raises:
        QkvError: other data, before anything is written.
    """
    if (run_dir / name).is_file():
        saved = _what_data(read_run_json(run_dir, name))
        now = _what_data(record)
        if saved == now:
            return
        differ = [k for k in given if _part(saved, k) != _part(now, k)]
        differ = differ or [k for k, v in given.items() if v is not None]
    else:  # an older run: the inputs its settings named
        settings = read_run_json(run_dir, "train_config.json")
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


def read_run_json(run_dir: Path, name: str) -> dict:
    """The JSON object ``run_dir / name`` (``train_config.json``, ``config.json``) of a run to
    resume. Raises :class:`QkvError` if it is missing, unreadable or not an object."""
    path = Path(run_dir) / name
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QkvError(
            f"cannot resume {run_dir}: {name} is missing or unreadable "
            f"({getattr(exc, 'strerror', None) or exc})"
        ) from None
    if not isinstance(saved, dict):
        raise QkvError(f"cannot resume {run_dir}: {name} is not a JSON object")
    return saved


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


@dataclass(frozen=True)
class RunContext:
    """What :func:`start_run` resolved for a run: ``device``, ``precision`` (``"fp32"`` or
    ``"bf16"``, what the training loop's autocast uses) and ``why`` that precision."""

    device: torch.device
    precision: str
    why: str

    def to_dict(self) -> dict:
        return {
            "device": str(self.device),
            "precision": self.precision,
            "why": self.why,
            "processes": distributed.context().world_size,
        }


def write_settings(
    run_dir: Path, recipe: str, settings, model_config, run: RunContext | None = None, resume: bool = False
) -> None:
    """``config.json`` (the model's config, vocabulary filled in) and ``train_config.json``
    (the recipe name, the settings tree as given with the same model config, what ``run``
    resolved them to on this machine under ``"resolved"``, the git commit and torch version).

    Inputs given as paths (:data:`INPUT_PATHS`: a corpus, a prepared directory, an ``init``
    run) are recorded absolute, so ``--resume`` finds them from any working directory.

    ``resume``: the model must be the one saved in ``config.json`` (its training state holds
    that model's weights), and so must the settings that choose which weights train
    (:data:`FIXED_ON_RESUME`); only ``train_config.json`` is rewritten, with today's settings
    (a longer budget, say).

    Raises:
        QkvError: ``resume`` with a model config or one of :data:`FIXED_ON_RESUME` that differs
            from the saved one (the keys named), before anything is written.
    """
    tree = {**to_dict(settings), "model": model_config.to_dict()}
    for key in INPUT_PATHS:
        if isinstance(tree.get(key), str):
            tree[key] = recorded_input(tree[key], key)
    if resume:
        _check_same_model(run_dir, model_config.to_dict())
        _check_same_weights_trained(run_dir, tree)
    else:
        model_config.save(run_dir / "config.json")
    resolved = {"resolved": run.to_dict()} if run is not None else {}
    write_json(
        run_dir / "train_config.json",
        {  # what kind of run, the settings tree, + PROVENANCE
            **run_header(recipe, model_config),
            **tree,
            **resolved,
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


# Settings that decide which weights a run trains: its training state holds those weights and
# their optimizer moments, so a resume must keep them (the budget, the learning rate and the
# like may change). A run saved before a key existed had its default.
FIXED_ON_RESUME = ("init", "mode", "train.lora_rank", "train.lora_alpha", "train.lora_modules")


def _check_same_weights_trained(run_dir: Path, settings: dict) -> None:
    saved = read_run_json(run_dir, "train_config.json")
    defaults = to_dict(TrainSettings())
    changed = []
    for key in FIXED_ON_RESUME:
        section, _, field = key.rpartition(".")
        now_tree = settings.get(section, {}) if section else settings
        was_tree = saved.get(section) if section else saved
        if field not in now_tree:  # a key this recipe does not have
            continue
        was = (was_tree if isinstance(was_tree, dict) else {}).get(field, defaults.get(field))
        if key in INPUT_PATHS and isinstance(was, str):  # a run of an earlier version: as given
            was = recorded_input(was, key)
        if was != now_tree[field]:
            changed.append(f"{key}: {was!r} saved, {now_tree[field]!r} now")
    if changed:
        raise QkvError(
            f"cannot resume {run_dir} with other trained weights ({', '.join(changed)}): its training "
            "state holds the weights those settings chose; resume with the run's own settings"
        )


def _check_same_model(run_dir: Path, model: dict) -> None:
    saved = check_format_version(read_run_json(run_dir, "config.json"), str(run_dir / "config.json"))
    changed = sorted(k for k in set(saved) | set(model) if saved.get(k) != model.get(k))
    if changed:
        diff = ", ".join(f"model.{k}: {saved.get(k)!r} saved, {model.get(k)!r} now" for k in changed[:5])
        raise QkvError(
            f"cannot resume {run_dir} with another model ({diff}"
            f"{', ...' if len(changed) > 5 else ''}): resume with the run's own settings"
        )


def start_run(train: TrainSettings) -> RunContext:
    """Join torchrun's process group if there is one (:func:`qkv.train.distributed.init`),
    choose the CPU threads (:func:`qkv.cpu_share.start`: ``train.threads``, or from the
    machine's load, re-checked as the run goes), apply the seed, resolve its device
    (under torchrun on CUDA: this process's GPU) and precision, and log (INFO) what was chosen
    and why.

    Raises:
        QkvError: a device that is not available here.
    """
    ctx = distributed.init(train.device)
    cpu_share.start(train.threads)  # threads from the machine's load, unless pinned
    torch.manual_seed(train.seed)
    device = resolve_device(train.device, log_level=logging.INFO)
    cpu_share.current().cpu_bound = device.type == "cpu"
    if ctx.enabled and device.type == "cuda":
        device = torch.device("cuda", ctx.local_rank)
    precision, why = resolve_precision(train.precision, device)
    logger.info(f"precision: {precision} ({why}), seed {train.seed}")
    return RunContext(device, precision, why)


def keep_best(model: torch.nn.Module, run_dir: Path, lora: LoraSettings | None = None) -> int:
    """Load the best-on-validation weights (the last ones if validation never ran), save them
    as ``model.safetensors`` and leave ``model`` in eval mode. A model with LoRA adapters
    (``lora``, :func:`qkv.train.adapters.add_lora`) saves them alone too
    (``adapter_model.safetensors``, ``adapter_config.json``), then merges them: the run's
    ``model.safetensors`` is the pretrained architecture with merged weights, which every
    command loads like any run's. Returns the number of parameters that trained (adapters and
    head; all of them in full training), counted before the merge."""
    best = run_dir / "best.safetensors"
    load_weights(model, best if best.is_file() else run_dir / "last.safetensors")
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if lora is not None:
        save_adapters(model, run_dir, lora)
        merge_lora(model)
    save_weights(model, run_dir / "model.safetensors")
    model.eval()
    return trained


TASK_HEADS = ("sequence_head", "residue_head")
# The splits of a classification task (proteins, text, images), as Recipe.splits lists them:
# test first, the split qkv evaluate scores by default.
TASK_SPLITS = ("test", "val", "train")


def encoder_with_head(
    pretrained,
    num_labels: int,
    pooling: str,
    dropout: float,
    head: str,
    mode: str,
    lora: LoraSettings | None = None,
) -> EncoderModel:
    """A new :class:`~qkv.models.encoder.EncoderModel` of ``pretrained``'s architecture for a
    classification recipe: a ``num_labels``-way head, ``pooling``, ``dropout``, and
    ``pretrained``'s weights but for its task heads. ``head``: the task's head
    (``"sequence_head"``/``"residue_head"``). ``mode``: ``"fine-tune"`` (every weight trains),
    ``"probe"`` (a linear probe: only ``head`` trains, every dropout 0), ``"lora"`` (``lora``'s
    adapters on the frozen encoder and ``head`` train, :func:`qkv.train.adapters.add_lora`) or
    ``"scratch"`` (random weights)."""
    from ..models.encoder import EncoderModel

    dropouts = (
        dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
        if mode == "probe"
        else dict(dropout=dropout)
    )
    model = EncoderModel(replace(pretrained.config, num_labels=num_labels, pooling=pooling, **dropouts))
    if mode != "scratch":
        model.load_state_dict(
            {k: v for k, v in pretrained.state_dict().items() if not k.startswith(TASK_HEADS)}, strict=False
        )
    if mode == "probe":
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith(head + "."))
    if mode == "lora":
        assert lora is not None
        add_lora(model, lora, trainable=(head + ".",))
    return model
