"""Deprecated: the ``"invariant"`` backend is :func:`qkv.nn.attention.per_query_attention`,
registered with the other attention backends; this name works for one more release."""

from .._deprecated import moved_module

__getattr__ = moved_module(__name__, "qkv.nn.attention")
