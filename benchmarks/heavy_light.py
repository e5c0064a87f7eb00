"""Heavy → light: a translation run on paired antibody chains (SAbDab via TDC's SAbDab_Chen,
2,409 pairs) against baselines that do not read the heavy chain, or read it by lookup.

    qkv train translation --config configs/antibody_heavy_light.json --out RUN
    python benchmarks/heavy_light.py --run RUN --split val     # choose between runs on this
    python benchmarks/heavy_light.py --run RUN --split test    # then report this, once

The split is the run's own (``pairs.json``: pairs held out by heavy chain, drawn by seed); the
training pairs are the rest of the data file, as the run read them.

Methods, each giving one light chain per held-out heavy chain:

- qkv: the run's beam search (``--beam``, default 4, length penalty 0.6).
- most common light chain: the training set's most frequent light chain, whatever the heavy.
- nearest heavy chain's light: the light chain paired with the most similar training heavy
  chain (global alignment score): retrieval, the baseline a lookup table gives.

Figures: residues recovered (:func:`qkv.evaluate.bleu.residue_recovery`, ± standard error over
chains); exact light chains; the model's perplexity per residue (teacher-forced, from
``qkv evaluate``); and germline-level agreement: each generated and each true light chain is
assigned the locus (kappa IGK or lambda IGL) and V gene of its nearest labelled light chain
among the 351+ light chains of AntiBERTa's paratope set (IMGT-numbered human SAbDab chains with
their germlines; a 1-nearest-neighbour assignment by global alignment score, a stand-in for
IgBLAST/ANARCI germline calls, which need databases this benchmark does not ship). The share of
chains whose generated and true chains get the same locus, V gene family (IGKV1) and V gene
(IGKV1-39) is reported. Mouse chains are assigned their nearest human gene, so gene agreement
is a similarity measure, locus agreement is exact in practice.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

from Bio.Align import PairwiseAligner

from qkv.data.parallel import PAIRS_FILE, read_pairs
from qkv.evaluate.bleu import residue_aligner, residue_recovery
from qkv.files import read_json
from qkv.inference.translator import Translator
from qkv.recipes.translation import evaluate_run

PARATOPE = ("paratope_train.tsv", "paratope_val.tsv", "paratope_test.tsv")


def nearest(query: str, pool: list[str], align: PairwiseAligner) -> int:
    """Index of the sequence of ``pool`` with the best global alignment score to ``query``."""
    return max(range(len(pool)), key=lambda i: align.score(query, pool[i]))


def labelled_light_chains(data_dir: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """AntiBERTa's paratope light chains with their ``(locus, v_gene)``."""
    seqs, labels = [], []
    for name in PARATOPE:
        lines = (data_dir / "antibody" / name).read_text(encoding="utf-8").splitlines()
        header = lines[0].split("\t")
        for line in lines[1:]:
            row = dict(zip(header, line.split("\t"), strict=True))
            if row["chain"] == "L":
                seqs.append(row["sequence"])
                labels.append((row["locus"], row["v_gene"]))
    return seqs, labels


def germline_agreement(hyps: list[str], refs: list[str], pool: list[str], labels, align) -> dict:
    """Shares of chains whose generated and true light chains get the same locus, V family
    and V gene by nearest labelled chain."""
    same = Counter()
    for h, r in zip(hyps, refs, strict=True):
        if not h:
            continue
        (hl, hv), (rl, rv) = labels[nearest(h, pool, align)], labels[nearest(r, pool, align)]
        same["locus"] += hl == rl
        same["v_family"] += hv.split("-")[0] == rv.split("-")[0]
        same["v_gene"] += hv == rv
    return {k: same[k] / len(refs) for k in ("locus", "v_family", "v_gene")}


def recovery_stats(hyps: list[str], refs: list[str]) -> dict:
    each = [residue_recovery([h], [r]) for h, r in zip(hyps, refs, strict=True)]
    return {
        "recovery": statistics.fmean(each),
        "recovery_se": statistics.stdev(each) / len(each) ** 0.5,
        "exact": sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(refs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--split", choices=("val", "test"), default="val")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    data_dir = Path(os.environ.get("QKV_DATA_DIR", "../shared/data"))
    run = Path(args.run)
    record = read_json(run / PAIRS_FILE)
    held = record[args.split]
    src, refs = [h for h, _ in held], [light for _, light in held]
    data = read_pairs(record["files"]["data"]["path"], record["columns"])
    out_of_train = {h for part in ("val", "test") for h, _ in record[part]}
    train = [(h, light) for h, light in zip(data.src, data.tgt, strict=True) if h not in out_of_train]
    if len(train) != record["train_pairs"]:
        raise SystemExit(f"{len(train)} training pairs rebuilt, the run had {record['train_pairs']}")

    align = residue_aligner()
    common, count = Counter(light for _, light in train).most_common(1)[0]
    train_heavy = [h for h, _ in train]
    hyps = {
        "qkv": Translator.from_run(run, beam_size=args.beam).translate(src),
        "most common light chain": [common] * len(src),
        "nearest heavy chain's light": [train[nearest(h, train_heavy, align)][1] for h in src],
    }
    model = evaluate_run(run, args.split, beam_size=args.beam)
    pool, labels = labelled_light_chains(data_dir)
    rows = {}
    for name, h in hyps.items():
        rows[name] = {**recovery_stats(h, refs), **germline_agreement(h, refs, pool, labels, align)}
    rows["qkv"]["ppl"] = model["ppl"]
    rows["qkv"]["bleu"], rows["qkv"]["chrf"] = model["bleu"], model["chrf"]
    result = {
        "run": str(run.resolve()),
        "split": args.split,
        "n": len(refs),
        "train_pairs": len(train),
        "most_common_light_count": count,
        "beam": args.beam,
        "methods": rows,
        "examples": [
            {"heavy": s, "light": r, "qkv": q} for s, r, q in zip(src, refs, hyps["qkv"], strict=True)
        ][:3],
    }
    print(f"heavy -> light, {args.split} ({len(refs)} pairs; {len(train)} training pairs)")
    print("| method | recovery ± s.e. | exact | ppl | same locus | same V family | same V gene |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        ppl = f"{r['ppl']:.2f}" if "ppl" in r else "–"
        print(
            f"| {name} | {r['recovery']:.3f} ± {r['recovery_se']:.3f} | {r['exact']:.3f} | {ppl} | "
            f"{r['locus']:.3f} | {r['v_family']:.3f} | {r['v_gene']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
