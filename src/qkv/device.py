"""Device and precision choice, resolved once at the entry point (library code takes tensors as
they come)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .errors import QkvError

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16")


def resolve_device(name: str = "auto", log_level: int = logging.DEBUG) -> torch.device:
    """``"auto"`` picks CUDA, then Apple MPS, then the CPU; other names are checked to exist.
    The choice and why are logged at ``log_level`` (training runs: INFO; the other commands
    keep stderr quiet).

    Raises:
        QkvError: an unknown device name, or one not available on this machine.
    """
    if name == "auto":
        if torch.cuda.is_available():
            device, why = torch.device("cuda"), torch.cuda.get_device_name()
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device, why = torch.device("mps"), "Apple GPU, no CUDA"
        else:
            device, why = torch.device("cpu"), "no CUDA or MPS"
    else:
        try:
            device, why = torch.device(name), "set explicitly"
        except RuntimeError:
            raise QkvError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise QkvError(f"device {name!r} requested but CUDA is not available here")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise QkvError(f"device {name!r} requested but MPS is not available here")
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    logger.log(log_level, f"device: {device} ({why}){threads}")
    return device


def cpu_capability() -> str:
    """The CPU's vector instruction set as torch reports it (``"AVX2"``, ``"AVX512"``, ...;
    ``"unknown"`` if torch cannot tell)."""
    try:
        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # a probe for a log line never stops a run
        return "unknown"


def _cpu_flags() -> set[str]:
    """The CPU's feature flags that matter for bfloat16, as torch or the kernel names them
    (``avx512_bf16``, ``amx_bf16``); empty when neither can tell. Never raises."""
    try:
        caps = torch.cpu.get_capabilities()  # public API of recent torch (not in 2.4)
        return {name for name in ("avx512_bf16", "amx_bf16") if caps.get(name)}
    except Exception:  # older torch: the kernel's flags (Linux); ARM is not counted, unmeasured
        pass
    try:
        return set(Path("/proc/cpuinfo").read_text(errors="replace").split()) & {"avx512_bf16", "amx_bf16"}
    except Exception:
        return set()


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 in hardware (x86 AVX512_BF16 or AMX_BF16). Without
    it, bf16 is emulated in software, many times slower than fp32 (``benchmarks/RESULTS.md``).
    Never raises (an unknown CPU counts as without)."""
    return bool(_cpu_flags())


def cpu_has_amx_bf16() -> bool:
    """Whether this CPU has AMX bfloat16 matrix units (Intel Sapphire Rapids and later, when the
    machine exposes them). AVX512_BF16 alone is not enough to make bf16 training pay: without
    AMX, oneDNN's bfloat16 matrix products run slower than its float32 ones, and so does a
    training step under autocast (measured by ``benchmarks/mfu.py``; figures in
    ``benchmarks/RESULTS.md``). Never raises (an unknown CPU counts as without)."""
    return "amx_bf16" in _cpu_flags()


def _cuda_native_bf16(device: torch.device) -> bool:
    try:  # without emulation: pre-Ampere GPUs emulate bf16, slowly
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # torch without the argument
        return torch.cuda.get_device_capability(device)[0] >= 8


def resolve_precision(precision: str, device: torch.device, decoding: bool = False) -> tuple[str, str]:
    """The precision a run on ``device`` uses for ``precision`` (``"auto"``, ``"fp32"`` or
    ``"bf16"``), and why, as ``("fp32" | "bf16", reason)``.

    ``"auto"`` is bf16 (autocast) on CUDA GPUs with native bfloat16 and on CPUs with AMX
    bfloat16 units, fp32 elsewhere: on CPUs with AVX512_BF16 but no AMX bf16 matrix products
    are slower than fp32 (see :func:`cpu_has_amx_bf16`), on other CPUs bf16 is emulated, and on
    MPS bf16 autocast is not validated here. An explicit ``"bf16"`` where it is emulated or
    slower logs a warning and is kept. ``decoding=True`` (the weights' dtype for generation,
    which streams weights rather than multiplying matrices): bf16 halves the bytes to stream, so
    it is not slower without AMX (``benchmarks/limits.py``) and only emulation warns; ``"auto"``
    is the same as for training.

    Raises:
        QkvError: an unknown ``precision``.
    """
    if precision not in PRECISIONS:
        raise QkvError(f"unknown precision {precision!r}; use {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return "fp32", "set explicitly"
    native = fast = None  # not known (MPS, other backends)
    where = device.type.upper()
    if device.type == "cpu":
        native, fast, where = cpu_has_native_bf16(), cpu_has_amx_bf16(), f"CPU ({cpu_capability()})"
        fast_units = "AMX bfloat16 units"
    elif device.type == "cuda":
        native = fast = _cuda_native_bf16(device)
        where, fast_units = torch.cuda.get_device_name(device), "native bfloat16"
    if precision == "bf16":
        if native is False:
            logger.warning(
                f"bf16 on {where} without native bfloat16 is emulated in software, many "
                "times slower than fp32; fp32 (what auto picks here) is faster"
            )
            return "bf16", f"set explicitly (emulated on {where})"
        if fast is False and not decoding:
            logger.warning(
                f"bf16 on {where} with AVX512_BF16 but no AMX is slower than fp32 "
                "(matrix products at about half the fp32 rate, measured on such a CPU); "
                "fp32 (what auto picks here) is faster"
            )
            return "bf16", f"set explicitly (no AMX on {where})"
        return "bf16", "set explicitly"
    if fast:
        return "bf16", f"auto: {where} has {fast_units}"
    if native is None:
        return "fp32", f"auto: bf16 autocast on {where} is not validated"
    if native:
        return "fp32", f"auto: {where} has AVX512_BF16 but no AMX, where bf16 matmuls are slower than fp32"
    return "fp32", f"auto: {where} lacks native bfloat16"
