"""Probe vs LoRA vs full fine-tuning of a pretrained encoder, on the same task and budget
(issue 31): test figure (the weights chosen on validation), trained parameters, peak memory
and time per step.

    python benchmarks/finetune_modes.py run sst2 [MODE ...] --out runs/ft [--epochs 1] [--threads 1]
    python benchmarks/finetune_modes.py run paratope [MODE ...] --out runs/ft [--epochs 10]
    python benchmarks/finetune_modes.py report --out runs/ft [--plot docs/img/finetune/modes.png]
    python benchmarks/finetune_modes.py iglm --out runs/ft [--steps 300] [--lr 1e-4] [--lora-rank 8]

MODE: ``probe`` (``--freeze``), ``lora4``, ``lora8``, ``lora16`` (``train.lora_rank=R``, on
the attention projections), ``full`` (every weight); all by default. Runs are one at a time, each
a ``qkv train`` subprocess whose peak resident memory (``ru_maxrss`` of that child) is its
memory figure; a finished run is not trained again. Tasks: SST-2 on all-MiniLM-L6-v2 (test
accuracy) and paratope residues on AntiBERTy (test AUPRC).

``iglm``: IgLM continued on antibody heavy chains (``qkv train lm --init iglm``): the heavy
chains of the paratope set's published train split to train, of its validation split to
validate (chains whose sequence also appears in training dropped), each written
``[HEAVY] [HUMAN] SEQUENCE`` (the set names no species: every chain gets IgLM's human tag),
one chain per row from position 0 as IgLM was trained; perplexity before and after on the
validation chains (which also pick the weights kept) and on the test split's heavy chains
(unseen in training and validation: the honest figure).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TASKS = {
    "sst2": ["text-cls", "--task", "sst2", "--init", "minilm"],
    "paratope": ["protein-residue", "--task", "paratope", "--init", "antiberty"],
}
MODES = {
    "probe": ["--freeze"],
    "lora4": ["train.lora_rank=4"],
    "lora8": ["train.lora_rank=8"],
    "lora16": ["train.lora_rank=16"],
    "full": [],
}

IGLM_MAX_LEN = 160  # the context of the IgLM runs: the longest chain, tags and end token included, is 141


def run(task: str, mode: str, out: Path, epochs: int, threads: int | None) -> None:
    """Train one (task, mode) run into ``out/task/mode`` and record its peak memory and wall
    time in ``bench.json`` beside it; ``threads``: torch CPU threads (None: torch's default)."""
    run_dir = out / task / mode
    if (run_dir / "bench.json").is_file():
        return
    cmd = [sys.executable, "-m", "qkv.cli", "train", *TASKS[task], *MODES[mode], "--out", str(run_dir)]
    cmd += ["--quiet", f"train.max_epochs={epochs}", "baseline=false"]
    if threads:
        cmd.append(f"train.threads={threads}")
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    err = child.stderr.read() if child.stderr else ""
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{task}/{mode} failed:\n{err[-2000:]}")
    bench = {"peak_rss_mb": usage.ru_maxrss / 1024, "wall_s": time.perf_counter() - start, "command": cmd[2:]}
    (run_dir / "bench.json").write_text(json.dumps(bench, indent=2) + "\n")
    print(f"{task}/{mode}: done in {bench['wall_s'] / 60:.1f} min", file=sys.stderr)


def heavy_chains(split: str) -> list[str]:
    """The heavy-chain sequences of the paratope set's ``split`` (``train``, ``val``, ``test``)."""
    import csv

    data = Path(os.environ.get("QKV_DATA_DIR", "../shared/data")) / "antibody" / f"paratope_{split}.tsv"
    with open(data, encoding="utf-8", newline="") as f:
        return [row["sequence"] for row in csv.DictReader(f, delimiter="\t") if row["chain"] == "H"]


def chain_perplexity(run_dir: Path, weights: str, corpus: Path) -> float:
    """Perplexity of a run's ``weights`` (``model.safetensors``: after; ``init``: the starting
    checkpoint) on the chains of ``corpus``, one per row."""
    import math

    import torch

    from qkv.data.lm import encode_corpus
    from qkv.data.text import load_corpus
    from qkv.hub.pretrained import load
    from qkv.recipes.lm import split_nll
    from qkv.runs import load_run

    model, tok = load("iglm") if weights == "init" else load_run(run_dir, weights, "cpu", family="lm")
    model.eval()
    with torch.no_grad():
        nll, n = split_nll(model, encode_corpus(tok, load_corpus(str(corpus))), IGLM_MAX_LEN)
    return math.exp(nll / n)


def iglm(out: Path, steps: int, lora_rank: int, lr: float) -> dict:
    """Continue IgLM on heavy chains; returns the run's summary (``init_validation``: before;
    ``test_ppl``: before and after on the test split's heavy chains)."""
    folder = out / "iglm"
    folder.mkdir(parents=True, exist_ok=True)
    train = heavy_chains("train")
    val = [s for s in dict.fromkeys(heavy_chains("val")) if s not in set(train)]
    test = [s for s in dict.fromkeys(heavy_chains("test")) if s not in set(train) | set(val)]
    for name, chains in (("heavy_train.txt", train), ("heavy_val.txt", val), ("heavy_test.txt", test)):
        (folder / name).write_text("".join(f"[HEAVY] [HUMAN] {s}\n" for s in chains), encoding="utf-8")
    run_dir = folder / f"{f'lora{lora_rank}' if lora_rank else 'full'}_lr{lr:g}_s{steps}"
    if not (run_dir / "summary.json").is_file():
        cmd = [
            sys.executable,
            "-m",
            "qkv.cli",
            "train",
            "lm",
            "--init",
            "iglm",
            "--out",
            str(run_dir),
            "--quiet",
        ]
        cmd += [f"corpus={folder / 'heavy_train.txt'}", f"val_corpus={folder / 'heavy_val.txt'}"]
        cmd += [
            f"model.max_len={IGLM_MAX_LEN}",
            f"train.max_steps={steps}",
            "train.eval_every=25",
            f"train.lr={lr:g}",
            f"train.lora_rank={lora_rank}",
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["test_ppl"] = {
        w: chain_perplexity(run_dir, w, folder / "heavy_test.txt") for w in ("init", "model.safetensors")
    }
    before, after = summary["init_validation"]["val_ppl"], summary["validation"]["val_ppl"]
    test_before, test_after = summary["test_ppl"].values()
    print(
        f"IgLM on {len(train)} heavy chains, {run_dir.name}: perplexity on {len(val)} validation "
        f"chains {before:.3f} before, {after:.3f} after; on {len(test)} test chains "
        f"{test_before:.3f} before, {test_after:.3f} after ({summary['steps']} steps, "
        f"{summary['trainable_parameters']:,} parameters trained, {summary['train_minutes']:.1f} min)"
    )
    return summary


def step_ms(run_dir: Path) -> float:
    """Median milliseconds per optimizer step between consecutive training rows of
    ``metrics.jsonl`` with no validation between them (validation and start-up left out)."""
    import statistics

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    spans, last = [], None
    for row in rows:
        if "train_loss" not in row:
            last = None  # a validation (or a skipped step) falls in this span
            continue
        if last is not None:
            spans.append((row["elapsed_min"] - last["elapsed_min"]) * 60_000 / (row["step"] - last["step"]))
        last = row
    if not spans:
        summary = json.loads((run_dir / "summary.json").read_text())
        return summary["train_minutes"] * 60_000 / max(summary["steps"], 1)
    return statistics.median(spans)


def finished(out: Path, task: str):
    """``(mode, run_dir, summary, bench, metric)`` of every finished run of ``task``."""
    for mode in MODES:
        run_dir = out / task / mode
        if (run_dir / "bench.json").is_file():
            summary = json.loads((run_dir / "summary.json").read_text())
            bench = json.loads((run_dir / "bench.json").read_text())
            yield mode, run_dir, summary, bench, summary.get("score") or "accuracy"


def report(out: Path) -> str:
    """The table of every finished run under ``out``."""
    lines = [
        "| task | mode | val | **test** | trained parameters | peak RSS (MB) | ms / step | steps | minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        for mode, run_dir, summary, bench, metric in finished(out, task):
            ms = step_ms(run_dir)
            lines.append(
                f"| {task} ({metric}) | {mode} | {summary['validation'][metric]:.4f} | "
                f"**{summary['test'][metric]:.4f}** | {summary['trainable_parameters']:,} | "
                f"{bench['peak_rss_mb']:,.0f} | {ms:,.0f} | {summary['steps']:,} | "
                f"{summary['train_minutes']:.1f} |"
            )
    return "\n".join(lines)


def plot(out: Path, path: Path) -> None:
    """Test figure against trained parameters (log scale), one panel per task, each mode a
    labelled point with its peak memory: the picture of :func:`report`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TASKS), figsize=(5 * len(TASKS), 3.8))
    for ax, task in zip(axes, TASKS, strict=True):
        metric = "accuracy"
        for mode, _, summary, bench, metric in finished(out, task):
            x, y = summary["trainable_parameters"], summary["test"][metric]
            ax.scatter(x, y, color="tab:blue" if mode.startswith("lora") else "tab:grey", zorder=3)
            offset = {"lora8": (-14, 10), "lora16": (8, -22)}.get(mode, (6, -12))  # LoRA points crowd
            ax.annotate(f"{mode}\n{bench['peak_rss_mb'] / 1024:.1f} GB", (x, y), fontsize=8,
                        textcoords="offset points", xytext=offset)  # fmt: skip
        ax.set_xscale("log")
        ax.set(xlabel="trained parameters", ylabel=f"test {metric}", title=f"{task}: {TASKS[task][-1]}")
        ax.grid(alpha=0.3)
    fig.suptitle("Probe, LoRA (rank 4, 8, 16) or every weight; peak RSS beside each point", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["run", "report", "iglm"])
    parser.add_argument("task", nargs="?", choices=list(TASKS))
    parser.add_argument("modes", nargs="*", choices=[*MODES, []])
    parser.add_argument("--out", type=Path, default=Path("runs/ft"))
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="run: torch CPU threads per run")
    parser.add_argument("--steps", type=int, default=300, help="iglm: optimizer steps")
    parser.add_argument("--lora-rank", type=int, default=0, help="iglm: LoRA rank (0: every weight)")
    parser.add_argument("--lr", type=float, default=1e-4, help="iglm: peak learning rate")
    parser.add_argument("--plot", type=Path, default=None, help="report: also draw the figure here")
    args = parser.parse_args()
    if args.action == "iglm":
        iglm(args.out, args.steps, args.lora_rank, args.lr)
        return
    if args.action == "run":
        if args.task is None:
            parser.error("run needs a task")
        for mode in args.modes or MODES:
            run(args.task, mode, args.out, args.epochs, args.threads)
    print(report(args.out))
    if args.plot:
        plot(args.out, args.plot)


if __name__ == "__main__":
    main()
