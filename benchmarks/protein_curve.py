"""How qkv's own protein MLM's zero-shot figures grow with pretraining time: for each weight file
of a ``qkv train protein-mlm`` run (its ``snapshots/step_N.safetensors`` and its final
``model.safetensors``), the Spearman of masked-marginal scores on the four DMS assays
(Meier et al. 2021; :mod:`qkv.data.dms`) and the long-range top-L/5 contact precision of a
logistic regression fitted on the attention maps (Rao et al. 2021; :mod:`qkv.inference.contacts`),
against the CPU hours of pretraining that produced the weights (``elapsed_min`` of the run's
``metrics.jsonl`` at that step, times ``train.threads``).

A BLOSUM62 row beside them (the substitution score ``B(wt, mt)``, summed over a multi-mutant)
says what a model must beat to have learnt more than amino-acid similarity.

    python benchmarks/protein_curve.py RUN [RUN ...] [--out curve.json] [--plot curve.png]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from Bio.Align import substitution_matrices
from contacts_eval import evaluate_contacts, fit_contact_head, mean_precision  # noqa: E402
from scipy.stats import spearmanr
from zero_shot_dms import evaluate  # noqa: E402

from qkv.data.dms import ASSAYS, load_assay
from qkv.data.structures import shared_chains
from qkv.files import write_json
from qkv.inference.protein import ProteinEncoder
from qkv.inference.variants import VariantScorer, parse_variants

RUN_FILES = ("config.json", "tokenizer.json", "train_config.json")


def weight_files(run: Path) -> list[tuple[int, Path]]:
    """``(step, file)`` of every snapshot, then, once the run has finished (its ``summary.json``
    written), the final weights at its last step."""
    snaps = sorted((int(p.stem.split("_")[1]), p) for p in (run / "snapshots").glob("step_*.safetensors"))
    if not (run / "summary.json").is_file():
        return snaps
    last = max(json.loads(line).get("step", 0) for line in (run / "metrics.jsonl").read_text().splitlines())
    # the final weights (the best validation perplexity) stand for the last step's snapshot
    return [*(s for s in snaps if s[0] != last), (last, run / "model.safetensors")]


def cpu_hours(run: Path, step: int) -> float:
    """CPU hours of pretraining up to ``step``: the logged wall minutes times the run's threads."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    minutes = max(r["elapsed_min"] for r in rows if r.get("step", 0) <= step)
    threads = json.loads((run / "train_config.json").read_text())["train"]["threads"] or 2
    return minutes * threads / 60


def blosum_spearman(assay, variants) -> float:
    blosum = substitution_matrices.load("BLOSUM62")
    scores = [sum(blosum[m.wt][m.mt] for m in v) for v in variants]
    return float(spearmanr(scores, assay.scores[: len(variants)]).statistic)


def chance_precision(chains) -> float:
    """The expected precision of a random ranking: the mean share of long-range pairs (|i - j| >=
    24) that are contacts."""
    shares = []
    for c in chains:
        i, j = np.triu_indices(len(c.sequence), 24)
        shares.append(float(c.contacts()[i, j].mean()))
    return float(np.mean(shares))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="protein-mlm run directories")
    p.add_argument("--out", help="write the figures as JSON")
    p.add_argument("--plot", help="draw Spearman and contact precision against CPU hours (PNG)")
    p.add_argument("--labels", nargs="+", help="the runs' names in the plot (default: their folder names)")
    p.add_argument(
        "--cache",
        help="JSON lines of rows already measured: those weights are not measured again, new rows "
        "are appended (so the curve of a run still training can be measured as it goes)",
    )
    args = p.parse_args()

    assays = [load_assay(name) for name in ASSAYS]
    parsed = {a.name: parse_variants(a.variants, a.wild_type) for a in assays}
    fit, test = shared_chains("fit"), shared_chains("evaluate")
    cache = Path(args.cache) if args.cache else None
    done = [json.loads(line) for line in cache.read_text().splitlines()] if cache and cache.is_file() else []
    rows = [
        {
            "run": "BLOSUM62",
            **{a.name: blosum_spearman(a, parsed[a.name]) for a in assays},
            "contacts_chance": chance_precision(test),
        }
    ]
    for run in map(Path, args.runs):
        for step, weights in weight_files(run):
            known = [r for r in done if r["run"] == str(run) and r["step"] == step]
            if known:
                rows.append(known[0])
                continue
            with tempfile.TemporaryDirectory() as tmp:
                for name in RUN_FILES:
                    shutil.copy(run / name, tmp)
                shutil.copy(weights, Path(tmp) / "model.safetensors")
                encoder = ProteinEncoder.load(tmp)
                scorer = VariantScorer(encoder)
                row = {"run": str(run), "step": step, "cpu_hours": round(cpu_hours(run, step), 3)}
                for a in assays:
                    row[a.name] = evaluate(scorer, a, parsed[a.name], "masked-marginals")["spearman"]
                head = fit_contact_head(encoder, fit, str(run))
                row["contacts"] = mean_precision(evaluate_contacts(encoder, head, test))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
            if cache:
                with cache.open("a") as f:
                    f.write(json.dumps(row) + "\n")
    head = ["run", "step", "CPU h", *(a.name for a in assays), "top-L/5 long-range precision"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        contacts = f"{100 * r['contacts']['L/5']:.1f} %" if "contacts" in r else ""
        cells = [r["run"], str(r.get("step", "")), str(r.get("cpu_hours", ""))]
        print("| " + " | ".join([*cells, *(f"{r[a.name]:.3f}" for a in assays), contacts]) + " |")
    if args.out:
        write_json(Path(args.out), {"rows": rows})
    if args.plot:
        labels = dict(zip(args.runs, args.labels or [Path(r).name for r in args.runs], strict=False))
        plot(rows, [a.name for a in assays], Path(args.plot), labels)
    return 0


def plot(rows: list[dict], assays: list[str], path: Path, labels: dict[str, str]) -> None:
    """Spearman per assay (one colour each; BLOSUM62 dotted) and top-L/5 contact precision (chance
    dotted) against CPU hours; one line style per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=100)
    model_rows = [r for r in rows if "step" in r]
    for style, run in zip(("--", "-", ":"), dict.fromkeys(r["run"] for r in model_rows), strict=False):
        pts = sorted((r for r in model_rows if r["run"] == run), key=lambda r: r["cpu_hours"])
        hours = [r["cpu_hours"] for r in pts]
        for i, name in enumerate(assays):
            label = f"{name}" if style == "-" else None
            left.plot(hours, [r[name] for r in pts], style, marker="o", color=f"C{i}", label=label)
        right.plot(
            hours,
            [100 * r["contacts"]["L/5"] for r in pts],
            style,
            marker="o",
            color="k",
            label=labels.get(run, Path(run).name),
        )
    for i, name in enumerate(assays):
        left.axhline(rows[0][name], ls=":", lw=1, color=f"C{i}")
    right.axhline(100 * rows[0]["contacts_chance"], ls=":", lw=1, color="0.5", label="chance")
    left.set(
        xlabel="CPU hours of pretraining",
        ylabel="Spearman (masked marginals)",
        title="zero-shot variant effects (dotted: BLOSUM62)",
    )
    right.set(
        xlabel="CPU hours of pretraining",
        ylabel="precision, %",
        title="top-L/5 long-range contacts, 20 held-out chains",
    )
    styles = "; ".join(
        f"{s}: {labels.get(r, Path(r).name)}" for s, r in zip(("dashed", "solid"), labels, strict=False)
    )
    left.legend(fontsize=7, title=styles, title_fontsize=7)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
