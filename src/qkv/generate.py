"""Deprecated: the inference APIs moved to :mod:`qkv.inference` (``qkv.generate.lm`` is
``qkv.inference.lm``, and so on; see :data:`qkv._moved.MOVED`). The old module names work for
one more release and warn (``DeprecationWarning``) when a name is taken from them.

This file only keeps ``import qkv.generate.lm`` answering: it places forwarding modules for its
old children in ``sys.modules`` (see :mod:`qkv._moved` for why), and imports nothing else."""

from . import _moved

_moved.forward_children(__name__)
