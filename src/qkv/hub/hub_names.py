"""Hugging Face Hub model names (``facebook/esm2_t6_8M_UR50D``) wherever qkv takes a checkpoint.

A Hub name is downloaded by ``huggingface_hub`` into its usual cache (``$HF_HUB_CACHE``, by
default ``~/.cache/huggingface/hub``; ``$HF_HOME`` moves it) and read from there as an HF
folder. Only the files a model needs are fetched: its config, its weights (``model.safetensors``,
else ``pytorch_model.bin``) and its tokenizer. With ``HF_HUB_OFFLINE=1``, or when the Hub
cannot be reached, the cached snapshot is used; a model that is not cached is a one-line error.
A revision (branch, tag or commit) is given as ``revision=`` or written ``org/name@revision``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..errors import QkvError
from ..runs import layout

# ESM-2's released checkpoints (Lin et al. 2023, Table S1) as fair-esm's ``esm.pretrained`` names
# them; torch hub caches each as <name>.pt, and the HF Hub holds each as facebook/<name>
ESM2_NAMES = (
    "esm2_t6_8M_UR50D",
    "esm2_t12_35M_UR50D",
    "esm2_t30_150M_UR50D",
    "esm2_t33_650M_UR50D",
    "esm2_t36_3B_UR50D",
    "esm2_t48_15B_UR50D",
)

logger = logging.getLogger(__name__)

# what qkv reads from an HF folder (qkv.hub.convert.read_hf); weights are fetched apart, below
NEEDED = [
    layout.CONFIG,
    layout.TOKENIZER,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "1_Pooling/config.json",
]
WEIGHTS = (layout.WEIGHTS, "pytorch_model.bin")  # in order of preference


def split_revision(name: str, revision: str | None = None) -> tuple[str, str | None]:
    """``("org/name", revision)`` of ``org/name`` or ``org/name@revision``.

    Raises:
        QkvError: a revision both in the name and in ``revision``, and they differ.
    """
    repo, at, pinned = str(name).partition("@")
    if not at:
        return repo, revision
    if revision is not None and revision != pinned:
        raise QkvError(f"{name} names revision {pinned!r}, but revision {revision!r} was given too")
    return repo, pinned


def is_hub_name(text: str | Path) -> bool:
    """Whether ``text`` is a Hub model name, ``org/name`` or ``org/name@revision`` (a repository
    id as ``huggingface_hub`` validates it), and not a path that exists here (a path wins)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    text = str(text)
    repo, at, revision = text.partition("@")
    if repo.count("/") != 1 or (at and not revision) or Path(text).exists():
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def download(repo_id: str, revision: str | None = None) -> Path:
    """The snapshot folder of Hub model ``repo_id`` at ``revision`` (default ``main``) in the
    local Hugging Face cache, downloading what is missing (``huggingface_hub.snapshot_download``).

    Raises:
        QkvError: in one line: an unknown (or private, or gated) model; a revision it does not
            have; a model that is not in the local cache when the Hub cannot be reached or
            ``HF_HUB_OFFLINE`` is set; a cache that cannot be written.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = repo_id if revision is None else f"{repo_id}@{revision}"
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=[*NEEDED, WEIGHTS[0]]))
        if not (folder / WEIGHTS[0]).is_file():  # an older checkpoint: pickled weights only
            folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=[WEIGHTS[1]]))
    except RepositoryNotFoundError:  # GatedRepoError included
        raise QkvError(
            f"unknown Hub model {repo_id}: no such model (nor local folder), or a private or gated "
            "one (`hf auth login` if it is yours to read)"
        ) from None
    except RevisionNotFoundError:
        raise QkvError(
            f"Hub model {repo_id} has no revision {revision!r} (a branch, tag or commit)"
        ) from None
    except LocalEntryNotFoundError as exc:
        fetch = f"hf download {repo_id}" + ("" if revision is None else f" --revision {revision}")
        raise QkvError(
            f"{where} is not in the local cache and the Hub cannot be reached: {_reason(exc)} "
            f"(and no local folder of that name; fetch it with `{fetch}` where there is network, into "
            "the cache HF_HOME points at)"
        ) from None
    except HfHubHTTPError as exc:
        raise QkvError(f"the Hub refused {where}: {_first_line(exc)}") from None
    except OSError as exc:
        raise QkvError(f"cannot cache {where}: {_first_line(exc)}") from None
    logger.info(f"{where}: using {folder}")
    return folder


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _reason(exc: BaseException) -> str:
    """Why the Hub was not asked or did not answer: the connection error behind ``exc``, or
    offline mode."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    cause = exc.__cause__
    if cause is None or isinstance(cause, OfflineModeIsEnabled):
        return "offline mode (HF_HUB_OFFLINE) is on"
    return f"{type(cause).__name__}: {_first_line(cause)}"
