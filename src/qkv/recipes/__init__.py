"""The old module names of this package (issue 58) still import for one release: see
:mod:`qkv._moved`."""

from .. import _moved

_moved.forward_children(__name__)
