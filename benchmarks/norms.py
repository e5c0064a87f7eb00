"""LayerNorm vs RMSNorm vs DyT on two real tasks, several seeds each (validation metrics only).

Normalisations compared (``model.norm``, every family has it):
- ``layernorm``: Ba et al. 2016, the paper's (Vaswani et al. 2017, §3.1);
- ``rmsnorm``: Zhang & Sennrich 2019, no mean subtraction, no bias;
- ``dyt``: Dynamic Tanh, ``γ·tanh(α·x) + β`` (Zhu et al. 2025, "Transformers without
  Normalization"), α initialised to ``model.dyt_alpha`` (α₀, 0.5 unless given); ``dyt@0.2`` in
  ``--norms`` is DyT with α₀ = 0.2. Choose α₀ on validation with one seed
  (``--norms dyt@0.1 dyt@0.2 dyt@1.0 --seeds 1``), then run the chosen one with every seed.

Tasks (each run is a subprocess of the real CLI, step-budgeted so the figures do not depend on
the machine's speed):
- ``lm``: the LM recipe's defaults, nanoGPT's CPU "baby GPT" on tiny-shakespeare (pre-LN, 2000
  steps); metric: validation loss (nats/char, lower is better).
- ``translation``: a short Multi30k de→en run (the paper's post-LN encoder-decoder, small:
  d_model 128, 4 heads, 2 + 2 layers, ``--mt-steps`` steps, noam schedule); metric: greedy BLEU on
  the validation split of the weights the recipe keeps (higher is better). The test split is
  not looked at.

Run (from the repository root; ~75 min on 2 CPU cores):
    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/norms.py --out runs/norms
    .venv/bin/python benchmarks/norms.py --out runs/norms --table-only   # the table from finished runs
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

NORMS = ("layernorm", "rmsnorm", "dyt")

TASKS = {
    "lm": {
        "recipe": "lm",
        "args": ["sample_tokens=50", "num_samples=1"],
        "metric": lambda s: s["validation"]["val_loss"],
        "name": "val loss",
        "better": "lower",
    },
    "translation": {
        "recipe": "translation",
        "args": [
            "model.d_model=128",
            "model.n_heads=4",
            "model.d_ff=512",
            "model.n_encoder_layers=2",
            "model.n_decoder_layers=2",
            "model.dropout=0.1",
            "vocab_size=4000",
            "max_tokens=2048",
            "train.max_minutes=null",
            "train.warmup_steps=200",
            "train.lr_factor=1.0",
            "train.snapshot_minutes=1000",
            "beam_size=1",
        ],
        "metric": lambda s: s["validation"]["val_bleu"],
        "name": "val BLEU",
        "better": "higher",
    },
}


def norm_settings(norm: str) -> list[str]:
    """The settings of a ``--norms`` entry: ``"dyt@0.2"`` → ``model.norm=dyt model.dyt_alpha=0.2``."""
    kind, _, alpha = norm.partition("@")
    return [f"model.norm={kind}"] + ([f"model.dyt_alpha={alpha}"] if alpha else [])


def run(task: str, norm: str, seed: int, out: Path, mt_steps: int) -> float:
    """Train one run (unless it has finished before) and return its metric (NaN: the run
    failed, e.g. diverged; its log says why)."""
    run_dir = out / f"{task}-{norm}-seed{seed}"
    summary = run_dir / "summary.json"
    if not summary.is_file() and not (out / f"{run_dir.name}.failed").is_file():
        spec = TASKS[task]
        extra = (
            [f"train.max_steps={mt_steps}", f"train.eval_every={mt_steps}"] if task == "translation" else []
        )
        cmd = [
            sys.executable,
            "-m",
            "qkv",
            "train",
            spec["recipe"],
            "--out",
            str(run_dir),
            "--quiet",
            *norm_settings(norm),
            f"train.seed={seed}",
            *spec["args"],
            *extra,
        ]
        print(" ".join(cmd[1:]), file=sys.stderr, flush=True)
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            (out / f"{run_dir.name}.failed").write_text("see the command's stderr\n")
    if not summary.is_file():
        return math.nan
    return TASKS[task]["metric"](json.loads(summary.read_text()))


def table(out: Path, seeds: list[int], mt_steps: int, train: bool, norms: list[str]) -> str:
    lines = ["| task | metric | " + " | ".join(norms) + " |", "|---|---|" + "---|" * len(norms)]
    for task, spec in TASKS.items():
        cells = []
        for norm in norms:
            values = []
            for seed in seeds:
                if train or (out / f"{task}-{norm}-seed{seed}" / "summary.json").is_file():
                    values.append(run(task, norm, seed, out, mt_steps))
            if not values:
                cells.append("–")
                continue
            failed = sum(math.isnan(v) for v in values)
            values = [v for v in values if not math.isnan(v)]
            if not values:
                cells.append(f"failed ({failed} runs)")
                continue
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(
                f"{statistics.mean(values):.3f} ± {spread:.3f} "
                f"({', '.join(f'{v:.3f}' for v in values)})" + (f", {failed} failed" if failed else "")
            )
        lines.append(f"| {task} | {spec['name']} ({spec['better']} is better) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/norms"))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--mt-steps", type=int, default=600, help="optimizer steps of each translation run")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--norms", nargs="+", default=list(NORMS), help="norms to compare; dyt@A: DyT with α₀ = A")
    p.add_argument("--table-only", action="store_true", help="only tabulate finished runs")
    args = p.parse_args()
    for name in list(TASKS):
        if name not in args.tasks:
            del TASKS[name]
    print(f"mean ± sample standard deviation over seeds {args.seeds} (per-seed values in brackets)")
    print(table(args.out, args.seeds, args.mt_steps, not args.table_only, args.norms))


if __name__ == "__main__":
    main()
