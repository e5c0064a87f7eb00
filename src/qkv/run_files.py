"""Moved to :mod:`qkv.runs.layout` (issue 58); the old names answer for one release, with a
``DeprecationWarning`` (:mod:`qkv._moved`). The one forwarding file left: the forwarders of the
package's own children would have to be placed by ``import qkv``, which places nothing."""

from . import _moved

__getattr__ = _moved.names_of(__name__)
