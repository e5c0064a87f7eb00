"""Deprecated: moved to :mod:`qkv.inference.sampling`; this name works for one more release."""

from .._deprecated import moved_module

__getattr__ = moved_module(__name__, "qkv.inference.sampling")
