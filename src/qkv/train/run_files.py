"""Moved to :mod:`qkv.run_files` (the compatibility rules of :mod:`qkv.compat`, below the
training loop, need it too); importable from here until ``cli.py`` and the recipes import it
from there."""

from ..run_files import SNAPSHOTS as SNAPSHOTS
from ..run_files import remove_run_file as remove_run_file
from ..run_files import run_file as run_file
from ..run_files import snapshot_name as snapshot_name
