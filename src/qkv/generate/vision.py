"""Deprecated: moved to :mod:`qkv.inference.vision`; this name works for one more release."""

from .._deprecated import moved_module

__getattr__ = moved_module(__name__, "qkv.inference.vision")
