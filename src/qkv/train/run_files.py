"""Moved to :mod:`qkv.run_files` (below the training loop: the compatibility rules of
:mod:`qkv.compat` need it too); the old names work for one more release, with a
``DeprecationWarning``."""

from .._deprecated import moved

__getattr__ = moved(
    __name__, {n: "qkv.run_files" for n in ("SNAPSHOTS", "remove_run_file", "run_file", "snapshot_name")}
)
