"""The training loop and its pieces. The old module ``qkv.train.run_files`` (its names moved to
:mod:`qkv.run_files`) still imports for one release: see :mod:`qkv._moved`."""

from .. import _moved

_moved.forward_children(__name__)
