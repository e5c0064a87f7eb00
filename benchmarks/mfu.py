"""Model FLOPs utilisation (MFU) of a training step, against this machine's matmul peak measured
in the same run, and where the step's time goes.

- Peak: the best rate of square matrix products (n = 1024, 2048, 4096) in the step's precision
  (``--precision fp32`` and/or ``bf16``: the step runs under bfloat16 autocast, the peak is a
  bfloat16 product), all threads; reported beside the step. On a CPU without native bfloat16
  (no AVX512_BF16/AMX) the bf16 peak is an emulated one.
- FLOPs of a step: ``torch.utils.flop_counter.FlopCounterMode`` (PyTorch's own counter) over one
  forward + backward: every matrix product, attention included (2 FLOPs per multiply-add);
  elementwise work, norms, softmax and the optimizer are not counted, as in the usual MFU
  (Chowdhery et al. 2022, appendix B).
- MFU = FLOPs per step / seconds per step / peak. Seconds per step: median over ``--repeats``
  passes of ``--steps`` real steps (forward, loss, backward, clip, fused AdamW).
- Profile: ``torch.profiler`` over a few steps, the operators with the largest self time.

Workloads: ``translation-base``: the paper's base shape (d_model 512, 8 heads, d_ff 2048, 6 + 6
layers, shared 8k joint-BPE vocabulary) on real Multi30k batches of ~``--tokens`` padded tokens;
``translation``: the translation recipe's default model on the same batches; ``gpt2-small``: a
``DecoderLM`` of GPT-2 small's shape (12 layers, 12 heads, d_model 768, context 1024, vocabulary
50,304, no dropout) on ``--lm-batch`` random windows of 1,024 tokens (the issue's GPU figure;
one CPU step takes seconds).

Run: ``QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/mfu.py [--device cuda]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from common import machine  # noqa: E402  (benchmarks/common.py)
from compile_step import step, translation_workload  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode

from qkv.device import cpu_has_native_bf16
from qkv.models import DecoderLM
from qkv.models.config import LMConfig
from qkv.recipes.lm import LMSettings
from qkv.train.optim import make_optimizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASE = dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6)


def matmul_peak(dtype: torch.dtype, device: torch.device, repeats: int = 5) -> tuple[float, int]:
    """(best FLOP/s, at which n) of n × n @ n × n products."""
    best = (0.0, 0)
    for n in (1024, 2048, 4096):
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        a @ b  # warm-up
        for _ in range(repeats):
            _sync(device)
            t = time.perf_counter()
            a @ b
            _sync(device)
            best = max(best, (2 * n**3 / (time.perf_counter() - t), n))
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def gpt2_small_workload(steps: int, batch: int):
    """GPT-2 small's shape, random weights and tokens (FLOPs do not depend on the data)."""
    model = DecoderLM(
        LMConfig(vocab_size=50304, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024, dropout=0.0)
    )
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 50304, (batch, 1025), generator=g) for _ in range(steps)]

    def loss_fn(m, tokens):
        return F.cross_entropy(m(tokens[:, :-1]).logits.flatten(0, 1).float(), tokens[:, 1:].flatten())

    return model, LMSettings().train, batches, loss_fn


def step_flops(model, loss_fn, batch) -> int:
    with FlopCounterMode(display=False) as counter:
        loss_fn(model, batch).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--workloads",
        nargs="+",
        default=["translation-base", "translation"],
        choices=["translation-base", "translation", "gpt2-small"],
    )
    p.add_argument("--tokens", type=int, default=2048, help="padded tokens per translation batch")
    p.add_argument("--lm-batch", type=int, default=8, help="1,024-token windows per gpt2-small batch")
    p.add_argument("--steps", type=int, default=3, help="timed steps per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--precision",
        nargs="+",
        choices=["fp32", "bf16"],
        default=None,
        help="default: bf16 on CUDA; fp32 on a CPU, and bf16 too where it is native",
    )
    args = p.parse_args()
    device = torch.device(args.device)
    precisions = args.precision or (
        ["bf16"] if device.type == "cuda" else ["fp32", "bf16"] if cpu_has_native_bf16() else ["fp32"]
    )
    print(f"machine: {machine()}")
    peaks = {}
    for precision in precisions:
        peaks[precision], n = matmul_peak(DTYPES[precision], device)
        print(
            f"matmul peak ({DTYPES[precision]}, {device}): {peaks[precision] / 1e9:,.1f} GFLOP/s at n = {n}"
        )
    print("| workload | precision | parameters | GFLOP / step | s / step | GFLOP/s | MFU |")
    print("|---|---|---|---|---|---|---|")
    profiles = {}
    for name, precision in [(w, q) for w in args.workloads for q in precisions]:
        torch.manual_seed(0)
        if name == "gpt2-small":
            model, train, batches, loss_fn = gpt2_small_workload(args.steps, args.lm_batch)
            batches = [b.to(device) for b in batches]
        else:
            overrides = BASE if name == "translation-base" else {}
            model, train, batches, loss_fn = translation_workload(args.steps, args.tokens, **overrides)
            batches = [
                replace(b, src=b.src.to(device), tgt_in=b.tgt_in.to(device), tgt_out=b.tgt_out.to(device))
                for b in batches
            ]
        model = model.to(device).train()
        optimizer = make_optimizer(model, train)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            flops = statistics.mean(step_flops(model, loss_fn, b) for b in batches)
            step(model, model, optimizer, loss_fn, batches[0])  # warm-up
            times = []
            for _ in range(args.repeats):
                _sync(device)
                t = time.perf_counter()
                for b in batches:
                    step(model, model, optimizer, loss_fn, b)
                _sync(device)
                times.append((time.perf_counter() - t) / len(batches))
            with torch.profiler.profile() as prof:
                for b in batches:
                    step(model, model, optimizer, loss_fn, b)
        s = statistics.median(times)
        params = sum(q.numel() for q in model.parameters())
        shape = f"{args.lm_batch} x 1024 tokens" if name == "gpt2-small" else f"{args.tokens} tokens/batch"
        print(
            f"| {name} ({shape}) | {precision} | {params / 1e6:.1f} M | {flops / 1e9:,.1f} | "
            f"{s:.3f} | {flops / s / 1e9:,.1f} | **{flops / s / peaks[precision]:.0%}** |"
        )
        profiles[f"{name}, {precision}"] = prof
    clock = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, prof in profiles.items():
        events = prof.key_averages()
        total = sum(getattr(e, clock) for e in events)
        top = sorted(events, key=lambda e: getattr(e, clock), reverse=True)[:10]
        print(
            f"\nwhere {name}'s step time goes ({clock.replace('_', ' ')}): "
            + ", ".join(f"{e.key} {getattr(e, clock) / total:.0%}" for e in top)
        )


if __name__ == "__main__":
    main()
