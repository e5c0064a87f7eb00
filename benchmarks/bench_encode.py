"""Sentence encoding with the real all-MiniLM-L6-v2 weights: qkv's converted encoder against
HF ``BertModel`` with ``attn_implementation="sdpa"`` and ``"eager"``, same weights, same
batches, same process, alternating (issue 13's benchmark).

Work: batches of 32 rows × 128 tokens of real text (Multi30k English captions run together and
cut into 126-token pieces between ``[CLS]`` and ``[SEP]``), fp32, inference mode, last hidden
states + mean pooling (what ``qkv embed`` computes). Also a padded variant: 32 single captions
of different lengths, right-padded. Reports sentences/s, medians of repeats, and ours/ref ratios.

    python benchmarks/bench_encode.py [--repeats 7] [--append-results]
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import alternate, machine, publish, row  # noqa: E402  (benchmarks/common.py)

from qkv.hub.pretrained import locate  # noqa: E402
from qkv.inference.text import TextEncoder  # noqa: E402
from qkv.models.encoder import masked_mean  # noqa: E402

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def batches(tok, n_batches: int, rows: int = 32, length: int = 128) -> tuple[list, list]:
    """(full 128-token batches, padded batches of single captions) as (ids, mask) pairs."""
    with gzip.open(DATA / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as f:
        captions = [line.strip() for _, line in zip(range(20000), f, strict=False)]  # the first 20000
    stream = [i for ids in tok.encode_batch(captions, add_special_tokens=False) for i in ids]
    piece = length - 2
    full, padded = [], []
    for b in range(n_batches):
        ids = [
            [tok.cls_id, *stream[(b * rows + r) * piece : (b * rows + r + 1) * piece], tok.sep_id]
            for r in range(rows)
        ]
        t = torch.tensor(ids)
        full.append((t, torch.ones_like(t, dtype=torch.bool)))
        chosen = tok.encode_batch(captions[b * rows : (b + 1) * rows])
        width = max(map(len, chosen))
        t = torch.tensor([c + [tok.pad_id] * (width - len(c)) for c in chosen])
        padded.append((t, t != tok.pad_id))
    return full, padded


def timed(fn, work: list) -> tuple[int, float]:
    start = time.perf_counter()
    n = 0
    with torch.inference_mode():
        for ids, mask in work:
            fn(ids, mask)
            n += ids.size(0)
    return n, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batches", type=int, default=4, help="batches per timed repeat")
    parser.add_argument("--append-results", action="store_true")
    parser.add_argument("--results", default=str(Path(__file__).with_name("HISTORY.md")))
    args = parser.parse_args(argv)
    from transformers import BertModel

    encoder = TextEncoder.load("minilm")  # as qkv embed loads it (weights packed for batches)
    ours, tok = encoder.model, encoder.tokenizer
    folder = str(locate("minilm")[0])
    refs = {
        impl: BertModel.from_pretrained(folder, attn_implementation=impl).eval() for impl in ("sdpa", "eager")
    }
    full, padded = batches(tok, args.batches)

    def run_ours(ids, mask):
        hidden, m, _ = ours.encode(ids)
        return masked_mean(hidden, m)

    def run_ref(model):
        def run(ids, mask):
            return masked_mean(model(input_ids=ids, attention_mask=mask.long()).last_hidden_state, mask)

        return run

    with torch.inference_mode():  # same numbers first
        ids, mask = padded[0]
        diff = max(float((run_ours(ids, mask) - run_ref(r)(ids, mask)).abs().max()) for r in refs.values())
    for work in (full, padded):  # warm-up
        timed(run_ours, work[:1]), [timed(run_ref(r), work[:1]) for r in refs.values()]
    lines = [
        "### Sentence encoding, all-MiniLM-L6-v2 (issue 13)\n",
        f"`python benchmarks/bench_encode.py --repeats {args.repeats}`; {machine()}; "
        f"{time.strftime('%Y-%m-%d')}. fp32, inference mode, mean pooling; {args.batches} batches "
        f"of 32 per repeat; max |difference| of the pooled vectors vs HF: {diff:.1e}.\n",
        "| work | qkv sentences/s (range) | HF sentences/s (range) | qkv / HF (range) |",
        "|---|---|---|---|",
    ]
    for name, work in (("32 × 128 tokens", full), ("32 captions, padded", padded)):
        for impl, ref in refs.items():
            o, r = alternate(
                args.repeats,
                lambda work=work: timed(run_ours, work),
                lambda ref=ref, work=work: timed(run_ref(ref), work),
            )
            lines.append(row(f"{name}, vs HF `{impl}`", o, r))
    publish("\n".join(lines) + "\n", args.append_results, args.results)


if __name__ == "__main__":
    main()
