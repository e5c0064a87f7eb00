"""A LoRA run against its PEFT export: the largest logit difference between qkv's model and
``peft.PeftModel.from_pretrained`` on the exported base, on real inputs.

    qkv convert --to peft RUN OUT
    python benchmarks/peft_roundtrip.py --run RUN --peft OUT --inputs FILE [--limit 16]

``FILE``: one input per line, or a TSV with a ``sequence`` or ``sentence`` column. Printed:
max |PEFT − qkv| over the inputs, the same after ``merge_and_unload()``, and the base without
its adapters (how far the adapters moved the model: the first two must be far below it).
IgLM's chains are lines ``[HEAVY] [HUMAN] SEQ`` (its conditioning tags), e.g. from AntiBERTa's
paratope split:

    awk -F'\\t' 'NR>1 {print "[" ($2=="H" ? "HEAVY" : "LIGHT") "] [HUMAN] " $6}' \\
        $QKV_DATA_DIR/antibody/paratope_test.tsv > chains_test.txt
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import peft
import torch
import transformers

from qkv.files import read_json
from qkv.hub.peft_export import TASKS
from qkv.runs import load_run


def read_inputs(path: Path, limit: int) -> list[str]:
    if path.suffix == ".tsv":
        with path.open(encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        column = "sequence" if "sequence" in rows[0] else "sentence"
        return [r[column] for r in rows][:limit]
    return path.read_text(encoding="utf-8").splitlines()[:limit]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, type=Path)
    p.add_argument("--peft", required=True, type=Path, help="the folder qkv convert --to peft wrote")
    p.add_argument("--inputs", required=True, type=Path)
    p.add_argument("--limit", type=int, default=16)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    recipe = read_json(args.run / "train_config.json")["recipe"]
    _, auto, head = TASKS[recipe]
    ours, tok = load_run(args.run)
    base = getattr(transformers, auto).from_pretrained(args.peft / "base").eval()
    model = peft.PeftModel.from_pretrained(base, args.peft).eval()
    worst = {"peft": 0.0, "merged": 0.0, "base": 0.0, "logit": 0.0}
    pairs = []
    with torch.no_grad():
        for text in read_inputs(args.inputs, args.limit):
            ids = tok.encode(text) if head is None else tok.encode(text, add_special_tokens=True)
            x = torch.tensor([ids])
            q = ours(x).logits if head is None else ours(x, head=head).logits
            with model.disable_adapter():
                b = model(input_ids=x).logits
            worst["peft"] = max(worst["peft"], (model(input_ids=x).logits - q).abs().max().item())
            worst["base"] = max(worst["base"], (b - q).abs().max().item())
            worst["logit"] = max(worst["logit"], q.abs().max().item())
            pairs.append((x, q))
        merged = model.merge_and_unload()
        for x, q in pairs:
            worst["merged"] = max(worst["merged"], (merged(input_ids=x).logits - q).abs().max().item())
    print(
        f"{args.run} ({recipe}, {len(pairs)} inputs, logits up to {worst['logit']:.3g}): max |PEFT - qkv| "
        f"{worst['peft']:.3g}; after merge_and_unload {worst['merged']:.3g}; the base without adapters "
        f"{worst['base']:.3g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
