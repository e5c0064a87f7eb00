"""Training-step time, eager vs ``torch.compile`` (what ``train.compile=true`` does), same process.

Workloads (real data, the recipes' default shapes):
- ``lm``: the LM recipe's baby GPT (4 layers, d_model 128, context 64, batch 12) on
  tiny-shakespeare windows;
- ``translation``: the translation recipe's default model (d_model 256, 3 + 3 layers, post-LN)
  on Multi30k de→en batches of ~``--tokens`` padded tokens (a fixed set of batches, so the
  compiled graph sees their few shapes; dynamic shapes after the second one).
One step = forward, loss, backward, clip, fused AdamW. Eager and compiled copies of the same
model alternate, repeat after repeat; compile time is excluded by warm-up steps (reported
separately). Medians of ``--repeats``; ratio = eager ms / compiled ms (> 1: compiled faster).

Run: ``QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/compile_step.py``
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from common import machine  # noqa: E402  (benchmarks/common.py)

from qkv.data.batching import make_batch, token_batches
from qkv.data.text import load_corpus, random_windows, split_train_val, windows_at
from qkv.data.tokenizers import CharTokenizer, SubwordTokenizer
from qkv.data.translation import load_multi30k
from qkv.models import DecoderLM, Transformer
from qkv.recipes.lm import LMSettings
from qkv.recipes.translation import TranslationSettings
from qkv.train.losses import label_smoothed_nll
from qkv.train.optim import make_optimizer


def lm_workload(steps: int):
    recipe = LMSettings()
    text = load_corpus("tinyshakespeare")
    tok = CharTokenizer.train(text)
    data = torch.tensor(tok.encode(split_train_val(text, 0.1)[0]))
    g = torch.Generator().manual_seed(0)
    batches = [windows_at(data, random_windows(data, 64, 12, g), 64) for _ in range(steps)]
    model = DecoderLM(recipe.model_config(tok))

    def loss_fn(m, batch):
        x, y = batch
        return F.cross_entropy(m(x).logits.flatten(0, 1), y.flatten())

    return model, recipe.train, batches, loss_fn


def translation_workload(steps: int, tokens: int, **model_overrides):
    """The translation recipe's model (with ``model_overrides`` of its config) and ``steps``
    real Multi30k batches of ~``tokens`` padded tokens."""
    recipe = TranslationSettings()
    src, tgt = load_multi30k("train")
    src, tgt = src[:20000], tgt[:20000]
    tok = SubwordTokenizer.train(src + tgt, 8000)
    pairs = list(zip(tok.encode_batch(src), tok.encode_batch(tgt), strict=True))
    order = token_batches([(len(s), len(t)) for s, t in pairs], tokens, shuffle=True, seed=0)[:steps]
    batches = [make_batch([pairs[i] for i in idx], idx, tok.pad_id, tok.bos_id, tok.eos_id) for idx in order]
    model = Transformer(replace(recipe.model_config(tok), **model_overrides))

    def loss_fn(m, batch):
        logits = m(batch.src, batch.tgt_in).logits
        return label_smoothed_nll(logits, batch.tgt_out, 0.1, tok.pad_id)[0] / batch.n_tgt_tokens

    return model, recipe.train, batches, loss_fn


def step(model, step_model, optimizer, loss_fn, batch) -> None:
    loss = loss_fn(step_model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=["lm", "translation"])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    p.add_argument("--tokens", type=int, default=2048, help="padded tokens per translation batch")
    args = p.parse_args()
    print(f"machine: {machine()}")
    print("| workload | eager ms/step | compiled ms/step | eager / compiled | compile + warm-up s |")
    print("|---|---|---|---|---|")
    for name in args.workloads:
        torch.manual_seed(0)
        model, train, batches, loss_fn = (
            lm_workload(args.steps) if name == "lm" else translation_workload(args.steps, args.tokens)
        )
        eager = model.train()
        compiled = copy.deepcopy(model).train()
        runs = {"eager": (eager, eager), "compiled": (compiled, torch.compile(compiled))}
        optimizers = {k: make_optimizer(m, train) for k, (m, _) in runs.items()}
        t0 = time.perf_counter()
        for batch in batches:  # every shape once: compilation happens here
            step(*runs["compiled"], optimizers["compiled"], loss_fn, batch)
        warm = time.perf_counter() - t0
        for batch in batches[:2]:
            step(*runs["eager"], optimizers["eager"], loss_fn, batch)
        times = {"eager": [], "compiled": []}
        for r in range(args.repeats):
            for key in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
                t0 = time.perf_counter()
                for batch in batches:
                    step(*runs[key], optimizers[key], loss_fn, batch)
                times[key].append((time.perf_counter() - t0) / len(batches) * 1000)
        e, c = statistics.median(times["eager"]), statistics.median(times["compiled"])
        print(
            f"| {name} | {e:.1f} ({min(times['eager']):.1f}–{max(times['eager']):.1f}) | "
            f"{c:.1f} ({min(times['compiled']):.1f}–{max(times['compiled']):.1f}) | "
            f"**{e / c:.2f}** | {warm:.0f} |"
        )


if __name__ == "__main__":
    main()
