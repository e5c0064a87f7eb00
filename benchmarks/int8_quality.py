"""Quality cost of int8 weight-only quantisation (``qkv.inference.quantize``): the same models
scored with float32, bfloat16 and int8 weights (bfloat16 activations for the last two).

- Perplexity: IgLM (real GPT-2 weights, ``pip install --no-deps iglm==0.1.0``) on the antibody
  chains of the paratope task's test split (SAbDab, AntiBERTa's split): each chain as IgLM
  writes it, ``[HEAVY]``/``[LIGHT]`` ``[HUMAN]`` then its residues and the end token, scored
  on the residues and the end token (the species tag is a guess for every chain: the same for
  all three precisions, so the change is what counts).
- BLEU: a trained translation run (``--translation-run``) on Multi30k val and test2016, beam 4
  (α 0.6), sacreBLEU.

Run from the repository root with ``QKV_DATA_DIR`` set:
    .venv/bin/python benchmarks/int8_quality.py --translation-run RUN [--append-results]
"""

from __future__ import annotations

import argparse
import datetime
import math
import shlex
import sys
from pathlib import Path

import torch
from common import machine, publish  # noqa: E402  (benchmarks/common.py)

from qkv.data.protein_tasks import load_paratope
from qkv.hub.pretrained import load
from qkv.inference.quantize import cast_weights

WEIGHTS = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": "int8"}  # for cast_weights
PRECISIONS = tuple(WEIGHTS)


@torch.no_grad()
def iglm_perplexity(precision: str, limit: int | None) -> tuple[float, int]:
    """(perplexity, scored tokens) of IgLM on the paratope test chains."""
    model, tok = load("iglm")
    model = cast_weights(model.eval(), WEIGHTS[precision])
    eos = model.config.eos_id
    chains = [r for r in load_paratope().records if r.split == "test"][:limit]
    nll, count = 0.0, 0
    for r in chains:
        tag = "[HEAVY]" if r.group == "H" else "[LIGHT]"
        ids = tok.encode(f"{tag} [HUMAN] {r.sequence}", add_special_tokens=False) + [eos]
        logits = model(torch.tensor([ids[:-1]])).logits[0, 1:].float()  # predicts ids[2:]
        nll += torch.nn.functional.cross_entropy(logits, torch.tensor(ids[2:]), reduction="sum").item()
        count += len(ids) - 2
    return math.exp(nll / count), count


def translation_bleu(run: str, precision: str, split: str) -> float:
    from qkv.data.translation import load_multi30k
    from qkv.evaluate.bleu import translation_scores
    from qkv.inference.translator import Translator

    translator = Translator.from_run(run, beam_size=4, alpha=0.6)
    cast_weights(translator.model, WEIGHTS[precision])
    src, ref = load_multi30k(split, "de", "en")[:2]
    return translation_scores(translator.translate(src), ref)["bleu"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--translation-run", help="a trained translation run directory (BLEU rows)")
    p.add_argument("--chains", type=int, help="score only the first N test chains")
    p.add_argument("--append-results", action="store_true")
    p.add_argument("--results", default=str(Path(__file__).with_name("HISTORY.md")))
    args = p.parse_args(argv)
    rows = []
    ppl = {k: iglm_perplexity(k, args.chains) for k in PRECISIONS}
    tokens = ppl["fp32"][1]
    rows.append(
        ["IgLM perplexity, paratope test chains"]
        + [f"{ppl[k][0]:.4f}" for k in PRECISIONS]
        + [f"{(ppl['int8'][0] / ppl['fp32'][0] - 1):+.2%}"]
    )
    print(f"perplexity {ppl}", file=sys.stderr)
    if args.translation_run:
        for split in ("val", "test2016"):
            bleu = {k: translation_bleu(args.translation_run, k, split) for k in PRECISIONS}
            print(f"{split} BLEU {bleu}", file=sys.stderr)
            rows.append(
                [f"translation BLEU, Multi30k {split}, beam 4"]
                + [f"{bleu[k]:.2f}" for k in PRECISIONS]
                + [f"{bleu['int8'] - bleu['fp32']:+.2f} BLEU"]
            )
    text = "\n".join(
        [
            f"## int8_quality — {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
            "",
            f"- command: `python {shlex.join(sys.argv)}`",
            f"- machine: {machine()}",
            f"- IgLM scored on {tokens} tokens; int8 = int8 weights per output row, bfloat16 activations",
            "",
            "| measure | float32 | bfloat16 | int8 | int8 vs float32 |",
            "|---|---|---|---|---|",
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
        ]
    )
    publish(text, args.append_results, args.results)


if __name__ == "__main__":
    main()
