"""qkv: the Transformer of "Attention Is All You Need", from its equations to real use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: `import qkv` imports neither torch nor pathlib
    from pathlib import Path

    import torch

__version__ = "0.2.0"


def load(
    name_or_path: str | Path, device: torch.device | str = "cpu", revision: str | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` of a qkv run directory, an HF folder, a pretrained short name
    (``"minilm"``, ``"antiberty"``, ``"iglm"``), a Hub name (``org/name``; ``revision``: its
    branch, tag or commit, as ``org/name@REVISION`` gives it), a fair-esm ``.pt`` file or an
    ESM-2 name; see :func:`qkv.hub.pretrained.load`. Imported on first use, so ``import qkv``
    stays light."""
    from .hub.pretrained import load as _load

    return _load(name_or_path, device, revision)


def load_explainer(run_dir: str | Path, device: torch.device | str = "cpu", **options: Any) -> Any:
    """The explainer of a run directory (trained or converted), the one its recipe names: see
    :func:`qkv.recipes.loading.load_explainer`. Imported on first use."""
    from .recipes.loading import load_explainer as _load_explainer

    return _load_explainer(run_dir, device, **options)


def show(run_or_explainer: Any, input: Any = None, **options: Any) -> Any:
    """The explainer page of one input to a run directory's model (or to an explainer):
    ``qkv.show(run_dir, "Ein Mann liest.")`` as the last line of a notebook cell draws it,
    ``.save("page.html")`` writes it. The options are :func:`qkv.recipes.loading.show`'s.
    Imported on first use."""
    from .recipes.loading import show as _show

    return _show(run_or_explainer, input, **options)
