"""Unsupervised contact prediction (Rao et al. 2021, ICLR) on the shared structures: for each
model, fit the logistic regression on the 20 chains of the fit half (``qkv.data.structures``'
fixed split), then report the mean long-range (|i - j| >= 24, Cβ < 8 Å) precision of the top L,
L/2 and L/5 pairs on the 20 evaluation chains, or (``--chains antibody``) on the Fab chains
1NCB H and L only.

Beside each ESM-2, the top-L long-range precision that facebookresearch/esm's README publishes
(its "Comparison to related works" table: Large valid / CASP14 / CAMEO), measured on ESM's own
sets, not these chains: a sanity anchor for the ordering of the models, not a target to match.

Run from the repository root with ``QKV_DATA_DIR`` set:
    .venv/bin/python benchmarks/contacts_eval.py MODEL [MODEL ...] [--chains antibody] [--device cuda]
        [--append-results]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from common import machine, publish  # noqa: E402  (benchmarks/common.py)

from qkv.data.structures import ANTIBODY_CHAINS, CITATION, shared_chains
from qkv.device import resolve_device
from qkv.inference.contacts import TOPS, evaluate_contacts, fit_contact_head, mean_precision
from qkv.inference.protein import ProteinEncoder

# facebookresearch/esm README (commit 2b36991), unsupervised contact prediction, top-L long-range
# precision (%) on Large valid / CASP14 / CAMEO, logistic regression on 20 structures
PUBLISHED = {  # ESM-1b first: its name (esm1b_t33_650M_UR50S) also holds ESM-2 650M's "t33_650M"
    "esm1b": "41.1 / 24.4 / 39",
    "t6_8M": "15.9 / 9.8 / 15.7",
    "t12_35M": "28.8 / 16.4 / 28.4",
    "t30_150M": "42.2 / 26.8 / 40.1",
    "t33_650M": "50.1 / 32.5 / 47.6",
    "t36_3B": "52.7 / 34.0 / 49.9",
    "t48_15B": "54.5 / 37.0 / 51.7",
}


def published(model: str) -> str:
    """The README's figures for a model named like ``facebook/esm2_t6_8M_UR50D`` (in the name, or
    in a converted run directory's ``hf.json`` source), else a dash."""
    names = [model]
    meta = Path(model) / "hf.json"
    if meta.is_file():
        names.append(str(json.loads(meta.read_text(encoding="utf-8")).get("source", "")))
    text = " ".join(names).lower().replace("-", "")
    return next((v for k, v in PUBLISHED.items() if k.lower() in text), "–")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="run directories, HF folders, short or Hub names")
    parser.add_argument("--chains", choices=("evaluation", "antibody"), default="evaluation")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--append-results", action="store_true", help="add the table to benchmarks/HISTORY.md"
    )
    args = parser.parse_args()

    fit = shared_chains("fit")
    test = shared_chains(names=ANTIBODY_CHAINS) if args.chains == "antibody" else shared_chains("evaluate")
    device = resolve_device(args.device)
    lines = [
        f"### Contact prediction: long-range precision on {len(test)} chains "
        f"({'Fab 1NCB H, L' if args.chains == 'antibody' else 'the evaluation half'})",
        "",
        f"`{shlex.join(['python', *sys.argv])}` — {datetime.date.today()}, {machine()}, device {device}. "
        f"Head fitted on the {len(fit)} chains of the fit half (L1 logistic regression, C 0.15, pairs "
        f"|i-j| >= 6); precision of the top L, L/2, L/5 pairs with |i-j| >= 24, Cβ < 8 Å, mean over chains. "
        f"Data: {CITATION}.",
        "",
        "| model | layers × heads | maps used | top-L, % | top-L/2, % | top-L/5, % "
        "| published top-L, % (on ESM's own sets, not these chains) |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in args.models:
        encoder = ProteinEncoder.load(model, device)
        head = fit_contact_head(encoder, fit, model)
        mean = mean_precision(evaluate_contacts(encoder, head, test))
        lines.append(
            f"| {model} | {head.n_layers} × {head.n_heads} | {head.info['nonzero_weights']} | "
            + " | ".join(f"{100 * mean[k]:.1f}" for k in TOPS)
            + f" | {published(model)} |"
        )
        print(lines[-1], file=sys.stderr)
    publish("\n".join(lines) + "\n", args.append_results, Path(__file__).with_name("HISTORY.md"))


if __name__ == "__main__":
    main()
