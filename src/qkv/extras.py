"""qkv's optional dependencies (``pip install 'qkv[NAME]'``), declared once.

The core install (``pip install qkv``) carries what ``import qkv``, training and decoding text
models need; what a few verbs need (the explainer's server, protein files, pictures,
scikit-learn's probes and metrics, the experiment trackers) is an *extra*. Code that needs one
calls :func:`require` before it starts any work, so that a missing package is one line naming
the extra to install instead of an ``ImportError`` in the middle of a run, and imports the
package only inside the function that uses it, so that the core never imports it.
``pyproject.toml``'s ``[project.optional-dependencies]`` lists the same extras with their
version ranges (tests/test_extras.py checks that the two agree); ``qkv[all]`` is all of them.
"""

from __future__ import annotations

import importlib.util

from .errors import QkvError

__all__ = ["DISTRIBUTIONS", "EXTRAS", "MissingExtra", "missing", "require"]

# extra -> the importable modules it provides (their pip distributions: DISTRIBUTIONS)
EXTRAS: dict[str, tuple[str, ...]] = {
    # qkv explain --serve (qkv.explain.server)
    "serve": ("fastapi", "uvicorn"),
    # FASTA files and structures (Biopython; msgpack: its BinaryCIF reader), the contact
    # regression and the protein tasks' splits and metrics (scikit-learn)
    "proteins": ("Bio", "msgpack", "sklearn"),
    # PNG pictures: qkv explain --out, confusion matrices, heatmaps, contact maps
    "plot": ("matplotlib",),
    # scikit-learn: classification metrics, the classical baselines, linear probes, digits
    "probe": ("sklearn",),
    # train.log_to=... (the experiment trackers)
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    # qkv convert --to onnx: torch's dynamo exporter writes through onnxscript; onnxruntime runs it
    "onnx": ("onnx", "onnxscript", "onnxruntime"),
    # train.lora_rank: Hugging Face's PEFT layers
    "lora": ("peft",),
}

# module -> the pip distribution that provides it, where the two names differ (the message
# names what pip installs)
DISTRIBUTIONS: dict[str, str] = {"Bio": "biopython", "sklearn": "scikit-learn", "mlflow": "mlflow-skinny"}


class MissingExtra(QkvError):
    """An optional dependency that a verb or setting needs is not installed; the message names
    the extra and the pip command."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` (a key of :data:`EXTRAS`) that cannot be imported here.

    Raises:
        KeyError: ``extra`` is not one of :data:`EXTRAS` (a bug in the caller).
    """
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require(extra: str, what: str) -> None:
    """Refuse in one line when ``extra``'s packages are not installed.

    Args:
        extra: a key of :data:`EXTRAS` (``"serve"``, ``"proteins"``, ...).
        what: what needs it, for the message (``"qkv explain --serve"``, ``"train.log_to=wandb"``).

    Raises:
        MissingExtra: (a :class:`~qkv.errors.QkvError`) naming the absent distributions and
            ``pip install 'qkv[extra]'``.
    """
    absent = [DISTRIBUTIONS.get(name, name) for name in missing(extra)]
    if absent:
        names = absent[0] if len(absent) == 1 else f"{', '.join(absent[:-1])} and {absent[-1]}"
        verb = "is" if len(absent) == 1 else "are"
        raise MissingExtra(f"{what} needs {names}, which {verb} not installed: pip install 'qkv[{extra}]'")
