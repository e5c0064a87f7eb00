"""How noisy is nanoGPT's validation estimate? (Not a speed benchmark.)

nanoGPT's CPU recipe reports the mean loss of ``--eval_iters`` (20) random batches of 12
windows; ``qkv`` reports the loss over the whole validation split. This script draws many
nanoGPT-style estimates for a trained qkv LM run and prints their spread, so a single reported
figure (nanoGPT's 1.88) can be compared with qkv's full-split figure.

    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/lm_eval_noise.py runs/lm_baseline
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from qkv.data.text import load_corpus, random_windows, split_train_val, windows_at
from qkv.runs import load_run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--draws", type=int, default=100)
    p.add_argument("--threshold", type=float, default=1.88)
    args = p.parse_args()
    model, tok = load_run(args.run_dir)
    block = model.config.max_len
    val = torch.tensor(tok.encode(split_train_val(load_corpus("tinyshakespeare"))[1]))
    g = torch.Generator().manual_seed(0)
    estimates = []
    with torch.no_grad():
        for _ in range(args.draws):
            losses = []
            for _ in range(args.eval_iters):
                x, y = windows_at(val, random_windows(val, block, args.batch_size, g), block)
                losses.append(float(F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())))
            estimates.append(statistics.mean(losses))
    below = sum(e <= args.threshold for e in estimates) / len(estimates)
    print(
        f"{args.draws} estimates of {args.eval_iters} batches x {args.batch_size} windows: mean "
        f"{statistics.mean(estimates):.4f}, sd {statistics.stdev(estimates):.4f}, range "
        f"{min(estimates):.4f}-{max(estimates):.4f}; share <= {args.threshold}: {below:.2f}"
    )


if __name__ == "__main__":
    main()
