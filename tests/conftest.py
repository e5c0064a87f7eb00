"""Shared test setup: single-threaded, seeded torch (the suite must be fast and reproducible)."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seeded_single_thread():
    """Every test starts from the same RNG state and runs on one CPU thread."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    yield


@pytest.fixture
def no_torch_fastpath():
    """Disable torch.nn's fused "fast path" (it returns zeros at padded positions via nested
    tensors), so torch.nn reference modules compute every position with plain math."""
    previous = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(previous)
