"""Zero-shot variant-effect prediction on deep mutational scans (Meier et al. 2021): Spearman
between a masked LM's scores and the measured fitness, per assay and model, beside
ProteinGym's published ESM-2 figures (Notin et al. 2023).

    python benchmarks/zero_shot_dms.py facebook/esm2_t6_8M_UR50D [MODEL ...] \\
        [--method masked-marginals] [--assay BLAT ...] [--max-variants N] [--device auto] \\
        [--out results.json]

Reads the four assays of ``$QKV_DATA_DIR/dms`` (:mod:`qkv.data.dms`: BLAT, GB1, Aβ42, TDP-43).
Each assay needs one saturation matrix over its mutated positions (one masked pass per position
for masked-marginals, windowed as :mod:`qkv.inference.variants` says), then one lookup per
variant (multi-mutants: the sum of their mutations' log-ratios), so GB1's 530,737 doubles cost
55 forward passes. Prints a Markdown table; ``--out`` also writes the figures as JSON. The
published anchors were computed on ProteinGym's own row sets: equal to ours for BLAT and
TDP-43, close for Aβ42 and GB1 (the table's last column says how).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from scipy.stats import spearmanr

from qkv.data.dms import ASSAYS, Assay, load_assay
from qkv.device import resolve_device
from qkv.files import write_json
from qkv.inference.protein import ProteinEncoder
from qkv.inference.variants import MARGINALS, VariantScorer, additive_scores, parse_variants

ANCHORS = ("esm2_8M", "esm2_35M", "esm2_150M", "esm2_650M")


def evaluate(scorer: VariantScorer, assay: Assay, variants: list, method: str) -> dict:
    """Spearman of one model on one assay, with the number of variants and forward passes."""
    start = time.perf_counter()
    positions = sorted({m.position for v in variants for m in v})
    matrix = scorer.saturation(assay.wild_type, method, positions)
    scores = additive_scores(matrix, variants)
    rho = spearmanr(scores, assay.scores[: len(variants)]).statistic
    return {
        "spearman": float(rho),
        "n_variants": len(variants),
        "positions": len(positions),
        "seconds": round(time.perf_counter() - start, 2),
    }


def table(models: list[str], assays: list[Assay], results: dict, method: str) -> str:
    head = [
        "assay",
        "variants",
        *(f"{m} ({method})" for m in models),
        *(f"ESM-2 {a.removeprefix('esm2_')} (ProteinGym, published)" for a in ANCHORS),
        "rows vs ProteinGym",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for a in assays:
        ours = [f"{results[m][a.name]['spearman']:.3f}" for m in models]
        n = results[models[0]][a.name]["n_variants"]
        published = [a.anchors.get(k, "") for k in ANCHORS]
        lines.append(
            "| "
            + " | ".join([a.name, f"{n:,}", *ours, *published, a.anchors.get("rows_vs_proteingym", "")])
            + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help="run directories, HF folders, short names or Hub names")
    p.add_argument("--method", choices=MARGINALS, default="masked-marginals")
    p.add_argument("--assay", action="append", choices=list(ASSAYS), help="(repeatable) default: all four")
    p.add_argument(
        "--max-variants", type=int, help="score only each assay's first N variants (a quick check)"
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="also write the results as JSON here")
    args = p.parse_args(argv)

    assays = [load_assay(name) for name in args.assay or ASSAYS]
    parsed = {a.name: parse_variants(a.variants[: args.max_variants], a.wild_type) for a in assays}
    device = resolve_device(args.device)
    results: dict[str, dict] = {}
    for model in args.models:
        scorer = VariantScorer(ProteinEncoder.load(model, device))
        results[model] = {}
        for a in assays:
            results[model][a.name] = evaluate(scorer, a, parsed[a.name], args.method)
            r = results[model][a.name]
            print(
                f"{model} {a.name}: Spearman {r['spearman']:.3f} over {r['n_variants']:,} variants "
                f"({r['positions']} positions, {r['seconds']} s)",
                file=sys.stderr,
            )
    print(table(args.models, assays, results, args.method))
    if args.out:
        write_json(
            Path(args.out),
            {
                "method": args.method,
                "device": str(device),
                "results": results,
                "anchors": {a.name: a.anchors for a in assays},
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
