"""Device choice, resolved once at the entry point (library code takes tensors as they come)."""

from __future__ import annotations

import torch

from .errors import QkvError


def resolve_device(name: str = "auto") -> torch.device:
    """``"auto"`` picks CUDA, then Apple MPS, then the CPU; other names are checked to exist.

    Raises:
        QkvError: an unknown device name, or one not available on this machine.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise QkvError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise QkvError(f"device {name!r} requested but CUDA is not available here")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise QkvError(f"device {name!r} requested but MPS is not available here")
    return device
