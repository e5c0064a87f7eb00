"""Shared by the benchmark scripts: alternating timing, the machine line, result-table rows,
publishing a section; and for the recipe sweeps, training a run through the CLI and its
validation row."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

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
    ``results`` file (``benchmarks/HISTORY.md``, the dated record; ``benchmarks/RESULTS.md``
    holds the current figures and is edited by hand)."""
    print(text)
    if append:
        with open(results, "a", encoding="utf-8") as f:
            f.write("\n" + text)


def train_run(recipe: str, run_dir: Path, overrides: list[str]) -> None:
    """Train one run with ``qkv train RECIPE`` (a subprocess, quiet), unless ``run_dir`` already
    holds a finished one. Its report goes nowhere: a sweep reads validation figures only.

    Raises:
        RuntimeError: the run failed (the end of its stderr).
    """
    if (run_dir / "summary.json").is_file():
        return
    cmd = [sys.executable, "-m", "qkv.cli", "train", recipe, "--out", str(run_dir), "--quiet", *overrides]
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise RuntimeError(f"{run_dir.name} failed:\n{done.stderr[-2000:]}")


def metrics(run_dir: Path) -> list[dict]:
    """The rows of a run's ``metrics.jsonl``."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def validation_row(name: str, run_dir: Path, overrides: list[str]) -> dict:
    """A finished translation run's sweep row: steps, the selected weights' validation BLEU and
    which they were, the validation curve (step, BLEU) and the candidate's settings."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "name": name,
        "steps": summary["steps"],
        "val_bleu": round(summary["validation"]["val_bleu"], 2),
        "weights": summary["selected_weights"],
        "curve": [(r["step"], round(r["val_bleu"], 2)) for r in metrics(run_dir) if "val_bleu" in r],
        "overrides": " ".join(overrides),
    }


def sweep_table(rows: list[dict], minutes: float | None) -> str:
    """:func:`validation_row` rows as a markdown table, for proxies of ``minutes`` on one thread
    (``None``: step budgets)."""
    budget = "steps (budget)" if minutes is None else f"steps in {minutes:g} min (1 thread)"
    lines = [
        f"| candidate | {budget} | val BLEU (greedy, selected weights) | curve (step, val BLEU) | settings |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['name']} | {r['steps']} | {r['val_bleu']} ({r['weights']}) | {r['curve']} "
        f"| `{r['overrides']}` |"
        for r in rows
    ]
    return "\n".join(lines)


BUCKETS = ((1, 8), (9, 12), (13, 16), (17, 10_000))  # source length in words (the why-attention guide's)


def bucket_name(lo: int) -> str:
    """``"1-8"``, ..., ``"17+"``: the name of the bucket that starts at ``lo`` words."""
    hi = next(h for low, h in BUCKETS if low == lo)
    return f"{lo}+" if hi >= 10_000 else f"{lo}-{hi}"


def by_length(src: list[str], hyps: list[str], ref: list[str]) -> dict[str, dict]:
    """sacreBLEU (cased) of ``hyps`` against ``ref`` in each source-length bucket:
    ``{bucket: {"n": sentences, "bleu": BLEU}}`` (a bucket without sentences is left out)."""
    import sacrebleu

    out = {}
    for lo, hi in BUCKETS:
        idx = [i for i, s in enumerate(src) if lo <= len(s.split()) <= hi]
        if not idx:
            continue
        bleu = sacrebleu.corpus_bleu([hyps[i] for i in idx], [[ref[i] for i in idx]]).score
        out[bucket_name(lo)] = {"n": len(idx), "bleu": round(bleu, 2)}
    return out


def scored(src: list[str], hyps: list[str], ref: list[str]) -> dict:
    """:func:`qkv.evaluate.bleu.translation_scores` of ``hyps`` (rounded to 2 places) and
    ``"by_length"``: the same BLEU in each source-length bucket (:func:`by_length`)."""
    from qkv.evaluate.bleu import translation_scores

    overall = {k: round(v, 2) for k, v in translation_scores(hyps, ref).items()}
    return {**overall, "by_length": by_length(src, hyps, ref)}


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (``nan`` for fewer than two values)."""
    nan = float("nan")
    mean = statistics.fmean(values) if values else nan
    return mean, statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else nan
