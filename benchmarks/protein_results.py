"""The issue-4 table: scratch / probe / fine-tune / baseline per protein task, from run summaries.

    python benchmarks/protein_results.py runs/

reads runs/{signalp,amp,flip}_{scratch,probe,finetune}/summary.json and prints Markdown: the
test metric of each run (MCC for SignalP, accuracy + AUROC for AMP Scanner, Q3 for FLIP), its
validation metric (what picked the checkpoint), minutes and steps, and the SignalP per-kingdom
SP-vs-none MCC of the fine-tuned model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TASKS = [
    ("signalp", "SignalP 6.0 (6 types), partition 0", "mcc"),
    ("amp", "AMP Scanner v2, held-out 10 %", "accuracy"),
    ("flip", "FLIP secondary structure (Q3)", "q3"),
]
MODES = ("scratch", "probe", "finetune")


def fmt(metrics: dict, key: str) -> str:
    text = f"{metrics[key]:.3f}"
    if "auroc" in metrics:
        text += f" (AUROC {metrics['auroc']:.3f})"
    return text


def main(root: str) -> None:
    root = Path(root)
    # protein_gpu.sh fits the baselines once, apart from the runs: {task: metrics}
    separate = (
        json.loads((root / "baselines.json").read_text()) if (root / "baselines.json").is_file() else {}
    )
    print("| task | model | test | validation | train min | steps |")
    print("|---|---|---|---|---|---|")
    for prefix, title, key in TASKS:
        baseline = separate.get(prefix)
        for mode in MODES:
            path = root / f"{prefix}_{mode}" / "summary.json"
            if not path.is_file():
                print(f"| {title} | {mode} | (missing) | | | |")
                continue
            s = json.loads(path.read_text())
            baseline = s.get("baseline_test") or baseline
            print(
                f"| {title} | {mode} | {fmt(s['test'], key)} | {fmt(s['validation'], key)} | "
                f"{s['train_minutes']} | {s['steps']} |"
            )
        if baseline:
            metric = key if key != "q3" else "accuracy"
            print(f"| {title} | baseline: {baseline['baseline']} | {fmt(baseline, metric)} | | | |")
    ft = root / "signalp_finetune" / "summary.json"
    if ft.is_file():
        print("\nSignalP test, fine-tuned: MCC per kingdom (any SP vs none; per type: type vs rest)\n")
        per = json.loads(ft.read_text())["test"]["per_kingdom_mcc"]
        print(
            "| kingdom | n | any SP vs none | " + " | ".join(["SP", "LIPO", "TAT", "TATLIPO", "PILIN"]) + " |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for kingdom, row in per.items():
            cells = [f"{row[t]:.3f}" if t in row else "" for t in ("SP", "LIPO", "TAT", "TATLIPO", "PILIN")]
            print(f"| {kingdom} | {row['n']} | {row['any_vs_NO_SP']:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs")
