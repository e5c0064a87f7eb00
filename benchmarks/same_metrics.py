"""Behaviour unchanged: short seeded runs of every trainable recipe, their ``metrics.jsonl`` compared
with another checkout's.

A refactoring that keeps behaviour must leave every logged number of a seeded run identical:
losses, learning rates, gradient norms, validation scores, step counts. Only wall-clock fields
(seconds, tokens/s, minutes) differ between two runs of the same code, so they are dropped.

Run (from the repository root, ``$QKV_DATA_DIR`` pointing at the shared data):
    .venv/bin/python benchmarks/same_metrics.py record runs/metrics-now
    PYTHONPATH=/path/to/old/checkout/src .venv/bin/python benchmarks/same_metrics.py record runs/metrics-old
    .venv/bin/python benchmarks/same_metrics.py compare runs/metrics-old runs/metrics-now
``compare`` exits 0 when every recipe's rows are identical, 1 otherwise (and says where).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kill_resume import SETTINGS as KILL_RESUME_LM

COMMON = ["--quiet", "train.threads=1", "train.precision=fp32", "train.seed=7", "train.snapshot_minutes=1000"]
# recipe → its arguments: a few dozen steps of a small model on a slice of the real data
RUNS = {
    "translation": [
        "translation",
        "train_limit=3000",
        "val_limit=40",
        "d_model=64",
        "n_heads=2",
        "d_ff=128",
        "n_encoder_layers=1",
        "n_decoder_layers=1",
        "vocab_size=1000",
        "max_tokens=2048",
        "train.eval_every=20",
        "train.warmup_steps=20",
        "beam_size=2",
        "train.max_steps=40",
    ],
    "translation-rnn": [
        "translation-rnn",
        "train_limit=3000",
        "val_limit=40",
        "model.d_model=32",
        "vocab_size=1000",
        "max_tokens=2048",
        "train.eval_every=20",
        "train.warmup_steps=20",
        "beam_size=2",
        "train.max_steps=40",
    ],
    # the SIGKILL benchmark's small LM, with dropout (so the RNG streams matter)
    "lm": ["lm", *KILL_RESUME_LM, "train.eval_every=20", "train.max_steps=60"],
    # the same small model and corpus, trained as a masked diffusion LM
    "diffusion-lm": [
        "diffusion-lm",
        *KILL_RESUME_LM,
        "train.eval_every=20",
        "train.max_steps=40",
        "bound_samples=1",
    ],
    "protein-mlm": [
        "protein-mlm",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.n_layers=1",
        "model.max_len=64",
        "max_tokens=2048",
        "train_limit=2000",
        "train.eval_every=10",
        "train.warmup_steps=5",
        "train.lr_decay_steps=30",
        "train.max_steps=30",
    ],
    "protein-cls": [
        "protein-cls",
        "--task",
        "amp-scanner",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.n_layers=2",
        "train.eval_every=10",
        "train.max_steps=30",
        "train.warmup_steps=5",
    ],
    "protein-residue": [
        "protein-residue",
        "--task",
        "secondary-structure",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.n_layers=1",
        "model.max_len=64",
        "max_tokens=4096",
        "train.eval_every=10",
        "train.max_steps=20",
        "train.warmup_steps=5",
        "baseline=false",
    ],
    "vit": [
        "vit",
        "--task",
        "digits",
        "model.n_heads=2",
        "model.n_layers=2",
        "model.patch_size=2",
        "model.d_model=16",
        "model.d_ff=32",
        "train.lr=3e-3",
        "train.max_steps=40",
        "train.eval_every=20",
        "train.warmup_steps=5",
        "batch_size=32",
        "baseline=false",
    ],
    "caption": [
        "caption",
        "train_scenes=500",
        "eval_scenes=40",
        "model.d_model=32",
        "model.n_heads=2",
        "model.d_ff=64",
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "train.max_steps=40",
        "train.eval_every=20",
        "train.warmup_steps=5",
        "baseline=false",
    ],
    "text-cls": [
        "text-cls",
        "--task",
        "sst2",
        "--init",
        "minilm",
        "--freeze",
        "train.max_steps=20",
        "train.eval_every=10",
        "train.warmup_steps=5",
        "baseline=false",
    ],
}
# tokens_per_s, elapsed_min, ...; quiet_share: the share of a quiet machine the run had (the load)
TIMING = ("_per_s", "_min", "_minutes", "_seconds", "_share")


def _is_timing(key: str) -> bool:
    return key.endswith(TIMING)


def stable_rows(path: Path) -> list[dict]:
    """The rows of a ``metrics.jsonl`` without their wall-clock fields."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not _is_timing(k)} for row in rows]


def record(out: Path, only: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in only or list(RUNS):
        run = out / name
        recipe, *args = RUNS[name]
        cmd = [sys.executable, "-m", "qkv", "train", recipe, "--out", str(run), *COMMON, *args]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"{name} failed:\n{done.stderr[-2000:]}")
        rows = stable_rows(run / "metrics.jsonl")
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"{name}: {len(rows)} rows", flush=True)


def compare(old: Path, new: Path) -> int:
    bad = 0
    for name in RUNS:
        a, b = old / f"{name}.jsonl", new / f"{name}.jsonl"
        if not (a.is_file() and b.is_file()):
            print(f"{name}: missing ({a if not a.is_file() else b})")
            bad += 1
            continue
        rows_a, rows_b = a.read_text().splitlines(), b.read_text().splitlines()
        diff = next((i for i, (x, y) in enumerate(zip(rows_a, rows_b, strict=False)) if x != y), None)
        if diff is None and len(rows_a) == len(rows_b):
            print(f"{name}: {len(rows_a)} rows identical")
            continue
        bad += 1
        where = diff if diff is not None else min(len(rows_a), len(rows_b))
        print(
            f"{name}: differs at row {where}:\n"
            f"  old {rows_a[where : where + 1]}\n  new {rows_b[where : where + 1]}"
        )
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("record")
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="*", default=[], choices=list(RUNS))
    p = sub.add_parser("compare")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.command == "record":
        record(args.out, args.only)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
