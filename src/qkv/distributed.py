"""Data parallelism on PyTorch's own engine, for runs started by ``torchrun``.

``torchrun --nproc_per_node N -m qkv train ...`` starts N processes and tells each its rank
through the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, the rendezvous address);
:func:`init` joins them into one process group (``gloo`` on CPU, ``nccl`` on CUDA) and
:func:`qkv.train.loop.train_loop` wraps the model in ``DistributedDataParallel``. A plain
``qkv`` process is rank 0 of 1 and none of this runs.

Who does what: every rank builds the same batch order (a function of the seed and the epoch)
and takes its share of each optimizer step's ``accum_steps`` micro-batches (rank ``r`` takes
micro-batches ``r, r + N, ...``), so an optimizer step consumes the same global batch for any
N. With fewer micro-batches than processes (``accum_steps < N``, the defaults under torchrun),
every rank takes its share of the rows of every micro-batch instead (:func:`share`): the same
global batch again. Only rank 0 logs, validates and writes files; the others wait for it at the
checkpoints.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from .errors import QkvError

logger = logging.getLogger(__name__)


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
    """The process's :class:`Context` (rank 0 of 1 until :func:`init` finds torchrun's)."""
    return _context


def is_main() -> bool:
    """Whether this process writes files and logs (rank 0, or the only process)."""
    return _context.is_main


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise QkvError(f"environment variable {name}={value!r} is not an integer") from None


def init(device: str = "auto") -> Context:
    """Join the process group that ``torchrun`` set up, if any: ``nccl`` when the run will
    use CUDA (``device`` ``"auto"`` with a GPU present, or ``"cuda"...``), else ``gloo``. On
    CUDA each process takes GPU ``LOCAL_RANK``. Ranks other than 0 log warnings only.
    Idempotent; a process without ``WORLD_SIZE`` (or with 1) stays single.

    Raises:
        QkvError: a malformed torchrun environment, or more processes on this machine than it
            has GPUs when the run uses CUDA (each process needs its own GPU).
    """
    global _context
    ctx = Context(_env_int("RANK", 0), _env_int("WORLD_SIZE", 1), _env_int("LOCAL_RANK", 0))
    if not ctx.enabled:
        return _context
    cuda = torch.cuda.is_available() and (device == "auto" or device.startswith("cuda"))
    if cuda and ctx.local_rank >= torch.cuda.device_count():
        # Checked before joining: a rank that cannot get a GPU would die in set_device with a
        # CUDA traceback and leave the others waiting at the rendezvous.
        raise QkvError(
            f"torchrun started process {ctx.local_rank} on a machine with "
            f"{torch.cuda.device_count()} GPU(s); start at most that many per machine "
            "(--nproc_per_node), or train on the CPU (train.device=cpu)"
        )
    if not dist.is_initialized():
        if cuda:
            torch.cuda.set_device(ctx.local_rank)
        dist.init_process_group("nccl" if cuda else "gloo")
    _context = ctx
    if not ctx.is_main:
        logging.getLogger("qkv").setLevel(logging.WARNING)
    logger.info(f"data parallel: {ctx.world_size} processes ({dist.get_backend()})")
    return ctx


def share(batch: Any, rank: int, world_size: int) -> Any:
    """Rows ``rank, rank + world_size, ...`` of one micro-batch: this process's part when a
    step has fewer micro-batches than processes. A batch is a tensor or list of rows (split
    along its first dimension) or an object with a ``shard(rank, world_size)`` method (such as
    :class:`qkv.data.batching.TranslationBatch`). The part may be empty (a batch of fewer rows
    than processes); the training loop then counts that rank's loss as zero.

    Raises:
        QkvError: a batch of a kind that cannot be split (set ``train.accum_steps`` to the
            number of processes instead).
    """
    if hasattr(batch, "shard"):
        return batch.shard(rank, world_size)
    if isinstance(batch, (torch.Tensor, list)):
        return batch[rank::world_size]
    raise QkvError(
        f"a micro-batch of type {type(batch).__name__} cannot be split across {world_size} "
        f"processes: set train.accum_steps={world_size} (or a multiple)"
    )


def shutdown(*, finished: bool = True) -> None:
    """Leave the process group (end of a torchrun worker).

    A worker that finished waits at a barrier first, so every rank tears the group down
    together: rank 1 leaving while rank 0 still wrote the run's last files was seen to die
    in gloo's teardown (SIGABRT). A worker that failed leaves at once (its peers may never
    reach the barrier; torchrun stops them).
    """
    global _context
    if dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()
    _context = Context()


def all_reduce_(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over all processes, in place (one collective, no host sync; nothing in a
    single process). The tensor must be on the process group's device: CPU for gloo, the
    process's GPU for nccl."""
    if _context.enabled:
        dist.all_reduce(tensor)
    return tensor


def gather_objects(obj: object) -> list:
    """Every rank's ``obj`` in rank order (``[obj]`` in a single process)."""
    if not _context.enabled:
        return [obj]
    out = [None] * _context.world_size
    dist.all_gather_object(out, obj)
    return out
