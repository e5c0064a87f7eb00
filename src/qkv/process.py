"""This process's place among the processes of one run: rank 0 of 1, unless
:func:`qkv.train.distributed.init` joined the process group ``torchrun`` set up.

The lowest layers need to know one thing about it, :func:`is_main`: only the main process
writes files (:func:`qkv.storage.atomic_write`) and logs. Everything else about running
several processes (joining and leaving the group, collectives, sharing batches out) is
:mod:`qkv.train.distributed`, the one module that sets the context (:func:`set_context`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Context:
    """This process's place: ``rank`` of ``world_size`` processes, ``local_rank`` on its
    machine (its GPU index under CUDA)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


_context = Context()


def context() -> Context:
    """The process's :class:`Context` (rank 0 of 1 until :func:`qkv.train.distributed.init`
    finds torchrun's)."""
    return _context


def is_main() -> bool:
    """Whether this process writes files and logs (rank 0, or the only process)."""
    return _context.is_main


def set_context(ctx: Context) -> None:
    """Record this process's place (:func:`qkv.train.distributed.init` and ``shutdown`` do)."""
    global _context
    _context = ctx
