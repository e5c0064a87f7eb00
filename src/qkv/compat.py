"""Reading what earlier qkv versions wrote: every compatibility rule in one place.

The paper's modules (:mod:`qkv.nn`, :mod:`qkv.models`) and the training loop describe only
today's format; whatever an older run directory holds is brought up to it here, as it is read.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .train.checkpoint import load_weights

# Written into config.json and train_config.json as "format_version"; a file without it is
# version 1 (everything before this key existed).
FORMAT_VERSION = 2


def upgrade_train_state(saved: dict, run_dir: Path, model: torch.nn.Module) -> dict:
    """A ``train_state.pt`` as today's loop reads it, from any version's.

    Older states lack what later versions added: the weights (kept only in
    ``last.safetensors`` then), per-process RNG streams (one Python and one torch CPU state,
    no NumPy stream) and the process count (one).

    Args:
        saved: the dict ``torch.load`` read from ``run_dir / "train_state.pt"``.
        run_dir: its run directory (an old state's weights are in ``last.safetensors``).
        model: the model being resumed (an old state's weights are read into it, ties and all).

    Returns:
        ``saved`` with ``"model"``, ``"rng"`` (a list, one entry per process: Python, torch,
        NumPy (``None`` where the old state had none) and CUDA states) and ``"world_size"``.

    Raises:
        QkvError: an old state whose ``last.safetensors`` is missing or does not fit ``model``.
    """
    saved = dict(saved)
    if "model" not in saved:  # states written before the weights moved into them
        load_weights(model, run_dir / "last.safetensors")
        saved["model"] = model.state_dict()
    if "rng" not in saved:  # states written before per-process streams
        saved["rng"] = [{"python": saved.pop("py_rng"), "torch": saved.pop("torch_rng"),
                         "numpy": None, "cuda": []}]
    saved.setdefault("world_size", 1)
    return saved
