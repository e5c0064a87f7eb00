"""Shared by the benchmark scripts: alternating timing, the machine line, result-table rows,
publishing a section."""

from __future__ import annotations

import os
import platform
import statistics

import torch


def alternate(repeats: int, ours_fn, ref_fn) -> tuple[list[float], list[float]]:
    """Run ``ours_fn``/``ref_fn`` (each → (work, seconds)) once per repeat, flipping the order
    every repeat; returns the per-repeat throughputs (work / second) of each."""
    ours_rates, ref_rates = [], []
    for r in range(repeats):
        order = [(ours_fn, ours_rates), (ref_fn, ref_rates)]
        for fn, rates in order if r % 2 == 0 else order[::-1]:
            work, seconds = fn()
            rates.append(work / seconds)
    return ours_rates, ref_rates


def machine() -> str:
    cpu = platform.processor()
    if not cpu:
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            cpu = platform.machine()
    return (
        f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads, Python {platform.python_version()}"
    )


def row(name: str, ours: list[float], ref: list[float]) -> str:
    mo, mr = statistics.median(ours), statistics.median(ref)
    ratios = [o / r for o, r in zip(ours, ref, strict=True)]
    return (
        f"| {name} | {mo:,.1f} ({min(ours):,.1f}–{max(ours):,.1f}) | "
        f"{mr:,.1f} ({min(ref):,.1f}–{max(ref):,.1f}) | **{mo / mr:.2f}** "
        f"({min(ratios):.2f}–{max(ratios):.2f}) |"
    )


def publish(text: str, append: bool, results) -> None:
    """Print a result section and, with ``append`` (``--append-results``), add it to the
    ``results`` file (``benchmarks/RESULTS.md``)."""
    print(text)
    if append:
        with open(results, "a", encoding="utf-8") as f:
            f.write("\n" + text)
