"""The training loop and its pieces. The old modules ``qkv.train.run_files``,
``qkv.train.checkpoint``, ``checkpointing``, ``settings`` and ``distributed`` still import for one
release: see :mod:`qkv._moved`."""

from .. import _moved

_moved.forward_children(__name__)
