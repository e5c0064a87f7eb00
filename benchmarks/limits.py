"""Inference against the machine's limits: every workload as a fraction of its bound.

A ratio to another library says little when both are far from what the machine can do, so
this script measures the machine's two limits in the same process as the workloads:

- weight-streaming bandwidth: matrix-vector products (one input row, as in decoding) with
  GPT-2 small's own matrices in a decoding step's order (repeated to at least ``--stream-mb``
  MB, 1024 by default: beyond the caches, a 2-core Emerald Rapids VM has 260 MiB of L3), in
  float32, bfloat16 and int8, through every kernel qkv could use (PyTorch's ``F.linear`` with
  the weight stored (out, in) or (in, out), oneDNN's reordered weight, the int8 kernel). The
  fastest kernel per dtype is the one the bounds use. Square 4096 × 4096 matrices and a plain
  ``sum`` over 1024 MB of float32 (the memory's read rate) are printed beside it;
- matrix-product FLOP/s: the best square product (1024-4096), float32 and bfloat16
  (``mfu.matmul_peak``).

Workloads (random weights unless a run is given: speed does not depend on the values; FLOPs are
counted by PyTorch's ``FlopCounterMode``):

(a) batch-1 greedy generation, GPT-2-small shape (12 × 768, vocabulary 50257, biases), weights
    float32 and bfloat16 as ``TextGenerator.from_run`` lays them out (``prepare_for_inference``;
    bfloat16 also without its default batch invariance, to show that cost; and int8 weights
    with bfloat16 activations, ``--dtype int8``), a 32-token prompt and 128 new tokens. Bound:
    tokens/s = bandwidth / bytes per token, where the bytes are every weight a step reads (all
    matrices, the output projection included, biases, norms) plus the key/value cache read at
    the mean context length; the bandwidth is the fastest kernel's, re-measured beside every
    timed run (3 passes over ≥ ``--stream-mb`` MB, beyond the caches), and each run is divided
    by its own bound. Beside it, a stricter working-set bound: the same kernel back to back over
    one copy of the model's matrices, as many passes as decoding steps (a bfloat16 GPT-2 small,
    251 MB, or its int8 form, 125 MB, largely stays in a 260 MiB L3 that way, so decoding can
    pass the streaming bound but not this one). Reported on the decoding steps (after the first
    token) and end to end. The greedy tokens are checked
    against full recomputation without a cache (``recomputation_check``); where they differ,
    the recomputed logits' margin says whether it is a tie within rounding.
(b) batched generation: 8 and 32 prompts of 8-64 tokens (left-padded), 128 new tokens each,
    greedy. Bound per step: the larger of (weights + caches) / bandwidth and FLOPs / peak.
(c) translation decoding of Multi30k test2016 with beam 4 (α 0.6) by ``Translator`` (64
    sentences per batch, sorted by length), on ``--translation-run`` (a trained run: beam
    search stops when hypotheses end, so random weights would not do the real work). Bound:
    the larger of total FLOPs / peak and (decoder steps × decoder weight bytes + encoder
    weight bytes per batch) / bandwidth.
(d) encoder inference: ``ProteinEncoder.embed`` (length-sorted batches of ≤ 16384 tokens) on
    the FLIP secondary-structure test proteins (mixed lengths), with the protein recipe's
    encoder shape. Bound: FLOPs / peak.

For each workload the profile (``torch.profiler``, self CPU time of the top operators) says
where the time goes.

Run from the repository root with the machine to itself (``pip install -e .`` suffices):
    .venv/bin/python benchmarks/limits.py --translation-run RUN --append-results
    .venv/bin/python benchmarks/limits.py --workloads a --repeats 9   # only (a)
    .venv/bin/python benchmarks/limits.py --quick        # sanity run, figures are not results
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import machine, publish  # noqa: E402  (benchmarks/common.py)
from mfu import matmul_peak  # noqa: E402
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from qkv.device import cpu_capability, cpu_has_amx_bf16, cpu_has_native_bf16
from qkv.inference.lm import generate_tokens
from qkv.inference.quantize import Int8Linear, cast_weights
from qkv.inference.weight_layout import PackedLinear, onednn_bf16_available, prepare_for_inference
from qkv.models import DecoderLM, LMConfig
from qkv.nn.embeddings import TokenEmbedding

GB = 1e9
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
WEIGHTS = {**DTYPES, "int8": torch.int8}  # stored weights; int8 runs with bfloat16 activations
GPT2_SMALL = LMConfig(
    vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024, bias=True
)
GPT2_BLOCK = ((3 * 768, 768), (768, 768), (3072, 768), (768, 3072))  # (out, in) per matrix
GPT2_MATRICES = GPT2_BLOCK * 12 + ((50257, 768),)  # every matrix of a decoding step, in order
LARGE = ((4096, 4096),)
A_RUNS = (("fp32", None), ("bf16", None), ("bf16", False), ("int8", None))  # (weights, batch_invariant)


# ----------------------------------------------------------------------------- the bounds


def _linear_of(w: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(w.size(1), w.size(0), bias=False, device="meta").eval()
    linear.weight = nn.Parameter(w, requires_grad=False)
    return linear


def _kernels(dtype: torch.dtype) -> dict:
    """name -> function turning an (out, in) weight into a matrix-vector callable (int8: the
    weight is given in bfloat16 and quantised)."""

    def linear(w):
        return lambda x: F.linear(x, w)

    if dtype == torch.int8:
        return {"int8 weight-only (`_weight_int8pack_mm`)": lambda w: Int8Linear(_linear_of(w))}
    out = {"F.linear, W (out, in)": linear}
    if dtype == torch.float32:
        out["F.linear, W stored (in, out)"] = lambda w: linear(w.t().contiguous().t())
    if dtype == torch.float32 or onednn_bf16_available():
        out["oneDNN reordered W"] = lambda w: PackedLinear(_linear_of(w))
    return out


class Stream:
    """Products of ``rows`` input rows with weights of ``shapes`` (all of them once, cycled to
    ≥ ``min_mb`` MB) through one kernel of :func:`_kernels`; :meth:`seconds` times one pass."""

    def __init__(
        self, dtype: torch.dtype, kernel: str, min_mb: int, rows: int = 1, shapes: tuple = GPT2_MATRICES
    ) -> None:
        g = torch.Generator().manual_seed(0)
        chosen, self.bytes = [], 0
        while not chosen or self.bytes < min_mb * 1e6:
            for shape in shapes:
                chosen.append(shape)
                self.bytes += shape[0] * shape[1] * dtype.itemsize
        values = torch.bfloat16 if dtype == torch.int8 else dtype  # int8: quantised from these
        inputs = {n: torch.randn(1, rows, n, generator=g).to(values) for n in {s[1] for s in shapes}}
        make = _kernels(dtype)[kernel]
        self.products = [
            (make(torch.randn(shape, generator=g).to(values)), inputs[shape[1]]) for shape in chosen
        ]

    @torch.no_grad()
    def seconds(self) -> float:
        start = time.perf_counter()
        for fn, x in self.products:
            fn(x)
        return time.perf_counter() - start


def stream_bandwidth(
    dtype: torch.dtype, min_mb: int, repeats: int, rows: int = 1, shapes: tuple = GPT2_MATRICES
) -> dict[str, float]:
    """GB/s of products of ``rows`` input rows with ≥ ``min_mb`` MB of weights of ``shapes``,
    per kernel (the best of ``repeats`` passes after a warm-up pass)."""
    rates = {}
    for kernel in _kernels(dtype):
        stream = Stream(dtype, kernel, min_mb, rows, shapes)
        stream.seconds()
        rates[kernel] = stream.bytes / min(stream.seconds() for _ in range(repeats)) / GB
    return rates


def read_bandwidth(mb: int = 1024, repeats: int = 5) -> float:
    """GB/s of a float32 ``sum`` over ``mb`` MB (the memory's plain read rate)."""
    x = torch.ones(int(mb * 1e6 / 4))
    x.sum()
    best = min(_seconds(x.sum) for _ in range(repeats))
    return x.numel() * 4 / best / GB


def _l3() -> str:
    """The CPU's L3 size as Linux reports it ("unknown" elsewhere)."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/cache/index3/size").read_text().strip()
    except OSError:
        return "unknown"


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ accounting


def weight_bytes(model: nn.Module) -> int:
    """Bytes a forward step reads of the weights: every matrix of a linear layer (a tied output
    projection included), biases and norms; of the embedding tables only one row each; of an
    :class:`Int8Linear` its int8 matrix and scales (not the Parameter it keeps for the state dict)."""
    total, seen = 0, set()
    for module in model.modules():
        if isinstance(module, (nn.Embedding, TokenEmbedding)):  # a lookup reads one row
            total += module.weight[0].numel() * module.weight.element_size()
            continue
        if isinstance(module, Int8Linear):
            seen.add(id(module.weight))
            total += module.qweight.numel() + module.scale.numel() * module.scale.element_size()
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    return total


def kv_bytes(cfg, rows: int, context: float, dtype: torch.dtype) -> float:
    """Bytes of keys and values one step reads over ``rows`` rows of ``context`` positions."""
    return cfg.n_layers * 2 * rows * context * cfg.d_model * dtype.itemsize


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def count_flops(fn) -> int:
    """FLOPs of ``fn()`` by PyTorch's counter, which (torch 2.13) has no formula for the CPU
    attention kernel: given here, as for the CUDA ones."""
    cpu_sdpa = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
        fn()
    return counter.get_total_flops()


def profile_top(fn, k: int = 6) -> str:
    """``op share%, ...`` of the ``k`` operators with the most self CPU time in ``fn()``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:k]
    return ", ".join(f"{e.key.removeprefix('aten::')} {e.self_cpu_time_total / total:.0%}" for e in top)


# ------------------------------------------------------------------------------- workloads


def gpt2_small(weights: str, batch_invariant: bool | None = None) -> DecoderLM:
    """GPT-2-small-shaped LM with random weights laid out for decoding. Every matrix is drawn
    N(0, 0.1²) instead of GPT-2's N(0, 0.02²): at the init's scale a random model repeats one
    token, and the token check below should compare varied continuations. ``weights``: a key
    of :data:`WEIGHTS` (int8: quantised from bfloat16, ``qkv.inference.quantize``)."""
    torch.manual_seed(0)
    model = DecoderLM(GPT2_SMALL).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(std=0.1)
    model = cast_weights(model, "int8" if weights == "int8" else WEIGHTS[weights])
    return prepare_for_inference(model, batch_invariant=batch_invariant)


def timed_generation(model, prompts, new_tokens: int) -> tuple[float, float, list]:
    """(seconds to the first token, seconds of the remaining steps, tokens)."""
    marks = []
    start = time.perf_counter()
    out = generate_tokens(
        model, prompts, new_tokens, do_sample=False, on_tokens=lambda _: marks.append(time.perf_counter())
    )
    return marks[0] - start, marks[-1] - marks[0], out


@torch.no_grad()
def recomputation_check(model, prompt: list[int], tokens: list[int]) -> tuple[int, list[float]]:
    """Compare a cached greedy run with full recomputation: one forward, without a cache, over
    the prompt and every generated token but the last (causal masking makes position t's
    logits those of a re-run on its prefix, so agreeing everywhere means the recomputed greedy
    run is the same). Returns (positions whose argmax is the cached token, and where it is not,
    the margin: (top logit − the cached token's logit) / |top logit|)."""
    logits = model(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :].float()
    cached = torch.tensor(tokens)
    best = logits.max(-1)
    agree = best.indices == cached
    chosen = logits.gather(-1, cached[:, None])[:, 0]
    return int(agree.sum()), ((best.values - chosen) / best.values.abs())[~agree].tolist()


def workload_a(
    args, streams: dict, read_gbs: float, dtype_name: str, batch_invariant: bool | None = None
) -> dict:
    """(a) in ``dtype_name`` (``batch_invariant``: as :func:`prepare_for_inference`, whose
    default makes bfloat16 decoding reproduce recomputation bit for bit). Both bounds are
    re-measured before every timed generation and each run is divided by the ones measured
    beside it (the memory a shared machine gives drifts over minutes): the streaming bound
    (the best kernel, 3 passes over ≥ ``--stream-mb`` MB of GPT-2 small's matrices, beyond
    the caches) and the stricter working-set bound (the same kernel back to back over one copy
    of the model's matrices, as many passes as decoding steps: the rate the products reach
    when nothing runs between them and the weights stay cached where they fit)."""
    dtype = WEIGHTS[dtype_name]
    model = gpt2_small(dtype_name, batch_invariant)
    activations = next(model.parameters()).dtype  # the key/value cache's
    prompt = torch.randint(
        0, GPT2_SMALL.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(1)
    ).tolist()
    n = args.new_tokens
    rates = streams[dtype_name, "GPT-2 small's"]
    best = max(rates, key=rates.get)
    streaming, working_set = Stream(dtype, best, args.stream_mb), Stream(dtype, best, min_mb=0)
    streaming.seconds(), working_set.seconds(), timed_generation(model, prompt, 8)  # warm-up
    step_bytes = weight_bytes(model) + kv_bytes(GPT2_SMALL, 1, args.prompt_tokens + n / 2, activations)
    bounds, strict, runs = [], [], []
    for _ in range(args.repeats):
        bounds.append(3 * streaming.bytes / sum(streaming.seconds() for _ in range(3)) / step_bytes)
        strict.append(
            (n - 1) * working_set.bytes / sum(working_set.seconds() for _ in range(n - 1)) / step_bytes
        )  # tokens/s
        runs.append(timed_generation(model, prompt, n))
    decodes = [(n - 1) / r[1] for r in runs]
    fractions = [d / b for d, b in zip(decodes, bounds, strict=True)]
    strict_fractions = [d / b for d, b in zip(decodes, strict, strict=True)]
    decode = statistics.median(decodes)
    large = max(streams[dtype_name, "4096 × 4096"].values())
    ours = runs[0][2][0]
    agree, margins = recomputation_check(model, prompt[0], ours)
    label = dtype_name if batch_invariant is None else f"{dtype_name}, batch_invariant={batch_invariant}"
    return dict(
        dtype=label,
        decode=decode,
        e2e=statistics.median(n / (r[0] + r[1]) for r in runs),
        bytes=step_bytes,
        bound=statistics.median(bounds),
        fraction=statistics.median(fractions),
        fraction_range=(min(fractions), max(fractions)),
        strict=statistics.median(strict_fractions),
        strict_range=(min(strict_fractions), max(strict_fractions)),
        of_large=decode * step_bytes / (large * GB),
        of_read=decode * step_bytes / (read_gbs * GB),
        agree=agree,
        margins=margins,
        distinct=len(set(ours)),
        profile=profile_top(lambda: generate_tokens(model, prompt, 32, do_sample=False)),
    )


def workload_b(args, bw: dict, peak: dict, dtype_name: str, rows: int) -> dict:
    """(b) for ``rows`` prompts; ``kernel_tokens_s``: the rate if a step took only its weight
    products, at the best kernel's measured speed for ``rows`` rows."""
    dtype = DTYPES[dtype_name]
    model = gpt2_small(dtype_name)
    g = torch.Generator().manual_seed(rows)
    lengths = torch.randint(8, 65, (rows,), generator=g).tolist()
    prompts = [torch.randint(0, GPT2_SMALL.vocab_size, (n,), generator=g).tolist() for n in lengths]
    n = args.new_tokens
    timed_generation(model, prompts, 4)  # warm-up
    runs = [timed_generation(model, prompts, n) for _ in range(max(1, args.repeats // 2))]
    step = statistics.median(r[1] / (n - 1) for r in runs)
    context = statistics.mean(lengths) + n / 2
    matrices = sum(m.weight.numel() for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear)))
    # products with every weight matrix, then QKᵀ and (weights)V over the context
    flops = 2 * rows * matrices + 4 * rows * context * GPT2_SMALL.d_model * GPT2_SMALL.n_layers
    t_bw = (weight_bytes(model) + kv_bytes(GPT2_SMALL, rows, context, dtype)) / (bw[dtype_name] * GB)
    t_flop = flops / peak[dtype_name]
    bound = max(t_bw, t_flop)
    kernel_gbs = max(stream_bandwidth(dtype, args.stream_mb, args.repeats, rows).values())
    return dict(
        dtype=dtype_name,
        rows=rows,
        tokens_s=rows / step,
        bound_tokens_s=rows / bound,
        kernel_tokens_s=rows * kernel_gbs * GB / weight_bytes(model),
        fraction=bound / step,
        limit="bandwidth" if t_bw >= t_flop else "FLOP/s",
        profile=profile_top(lambda: generate_tokens(model, prompts, 16, do_sample=False)),
    )


def workload_c(args, bw: dict, peak: dict) -> dict | None:
    from qkv.data.translation import load_multi30k
    from qkv.inference.translator import Translator

    if not args.translation_run:
        return None
    translator = Translator.from_run(args.translation_run, beam_size=4, alpha=0.6)
    model = translator.model
    src = load_multi30k("test2016", "de", "en")[0][: args.sentences]
    translator.translate(src[:16])  # warm-up
    seconds = [_seconds(lambda: translator.translate(src)) for _ in range(args.c_repeats)]
    measured = statistics.median(seconds)
    steps = [0]
    decode = model.decode

    def counting_decode(*a, **kw):
        steps[0] += 1
        return decode(*a, **kw)

    model.decode = counting_decode
    try:
        flops = count_flops(lambda: translator.translate(src))
    finally:
        del model.decode
    batches = -(-len(src) // translator.batch_size)
    # A decoder step reads the decoder's weights (not cross-attention's key/value projection,
    # applied once to the memory) and the output projection; each batch reads the encoder's.
    dec_bytes = (
        weight_bytes(model.decoder)
        + weight_bytes(model.generator)
        - sum(weight_bytes(layer.cross_attn.w_kv) for layer in model.decoder.layers)
    )
    t_bw = (steps[0] * dec_bytes + batches * weight_bytes(model.encoder)) / (bw["fp32"] * GB)
    t_flop = flops / peak["fp32"]
    bound = max(t_bw, t_flop)
    small = src[:64]
    return dict(
        sentences=len(src),
        sentences_s=len(src) / measured,
        seconds=measured,
        steps=steps[0],
        flops=flops,
        flop_s=flops / measured,
        fraction=bound / measured,
        limit="bandwidth" if t_bw >= t_flop else "FLOP/s",
        profile=profile_top(lambda: translator.translate(small)),
    )


def workload_d(args, peak: dict) -> dict:
    from qkv.data.protein_tasks import load_flip_secondary_structure
    from qkv.inference.protein import ProteinEncoder
    from qkv.models.config import EncoderConfig
    from qkv.models.encoder import EncoderModel
    from qkv.recipes.protein_tasks import ProteinTaskSettings

    cfg = ProteinTaskSettings().model
    torch.manual_seed(0)
    model = EncoderModel(
        EncoderConfig(**{**cfg.__dict__, "vocab_size": 33, "num_labels": 3, "dropout": 0.0})
    ).eval()
    encoder = ProteinEncoder(model, ("H", "E", "C"), "residue")
    seqs = [r.sequence for r in load_flip_secondary_structure().split("test")][: args.proteins]
    encoder.embed(seqs[:8])  # warm-up
    measured = statistics.median(_seconds(lambda: encoder.embed(seqs)) for _ in range(args.repeats))
    flops = count_flops(lambda: encoder.embed(seqs))
    lengths = [len(s) for s in seqs]
    return dict(
        sequences=len(seqs),
        residues=sum(lengths),
        min_len=min(lengths),
        max_len=max(lengths),
        sequences_s=len(seqs) / measured,
        flop_s=flops / measured,
        fraction=flops / measured / peak["fp32"],
        profile=profile_top(lambda: encoder.embed(seqs[:64])),
    )


# ---------------------------------------------------------------------------------- report


def _table(title: str, header: list[str], rows: list[list[str]]) -> list[str]:
    """Markdown lines of a titled table; nothing when there are no rows."""
    if not rows:
        return []
    return [
        "",
        title,
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def report(args, streams, read_gbs, peak, a, b, c, d) -> str:
    cmd = " ".join(["python", shlex.join(sys.argv)])
    flags = [
        f for f, has in (("AVX512_BF16", cpu_has_native_bf16()), ("AMX_BF16", cpu_has_amx_bf16())) if has
    ]
    kernels = list(dict.fromkeys(k for rates in streams.values() for k in rates))
    lines = [
        f"## limits{' (--quick: sanity run, not a result)' if args.quick else ''} — "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        "",
        f"- command: `{cmd}`",
        f"- machine: {machine()}; vector ISA {cpu_capability()}"
        f"{', ' + ', '.join(flags) if flags else ', no native bfloat16'}",
        f"- memory read (float32 sum, 1024 MB): {read_gbs:.1f} GB/s; L3 {_l3()}; matmul peak: "
        + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peak.items()),
        "",
        f"Weight streaming: one-row products with ≥ {args.stream_mb} MB of weights (best of "
        f"{args.repeats} passes, GB/s). The bound of (a) and (b) is the fastest kernel on GPT-2 "
        "small's own matrices (12 × (768 → 2304, 768, 3072; 3072 → 768), then 768 → 50257), "
        "the ones a decoding step streams, in its order:",
        "",
        "| dtype | matrices | " + " | ".join(kernels) + " |",
        "|---|---|" + "---|" * len(kernels),
    ]
    for (dt, what), rates in streams.items():
        lines.append(
            f"| {dt} | {what} | "
            + " | ".join(f"{rates[k]:.1f}" if k in rates else "–" for k in kernels)
            + " |"
        )
    lines += _table(
        f"(a) batch-1 greedy generation, GPT-2-small shape, {args.prompt_tokens}-token prompt "
        f"+ {args.new_tokens} new tokens:",
        [
            "weights",
            "bytes/token",
            "bound tokens/s",
            "decoding tokens/s",
            "**fraction** (range over runs)",
            "of the working-set bound (range)",
            "of the 4096² rate, of the plain read",
            "end to end tokens/s",
            "greedy tokens = recomputation's",
            "where the time goes",
        ],
        [
            [
                r["dtype"],
                f"{r['bytes'] / 1e6:.0f} MB",
                f"{r['bound']:.1f}",
                f"{r['decode']:.1f}",
                f"**{r['fraction']:.0%}** ({r['fraction_range'][0]:.0%}–{r['fraction_range'][1]:.0%})",
                f"{r['strict']:.0%} ({r['strict_range'][0]:.0%}–{r['strict_range'][1]:.0%})",
                f"{r['of_large']:.0%}, {r['of_read']:.0%}",
                f"{r['e2e']:.1f}",
                f"{r['agree']} of {args.new_tokens} ({r['distinct']} distinct)"
                + (
                    f"; others: margins {', '.join(f'{m:.1e}' for m in r['margins'])}" if r["margins"] else ""
                ),
                r["profile"],
            ]
            for r in a
        ],
    )
    lines += _table(
        f"(b) batched greedy generation, prompts of 8-64 tokens, {args.new_tokens} new tokens:",
        [
            "weights",
            "prompts",
            "tokens/s",
            "bound tokens/s (limit)",
            "**fraction**",
            "products alone at this many rows, tokens/s",
            "where the time goes",
        ],
        [
            [
                r["dtype"],
                str(r["rows"]),
                f"{r['tokens_s']:.0f}",
                f"{r['bound_tokens_s']:.0f} ({r['limit']})",
                f"**{r['fraction']:.0%}**",
                f"{r['kernel_tokens_s']:.0f}",
                r["profile"],
            ]
            for r in b
        ],
    )
    lines.append("")
    if c is None:
        lines.append("(c) translation: not run (needs `--translation-run`).")
    else:
        lines.append(
            f"(c) translation, beam 4, {c['sentences']} test2016 sentences, float32: "
            f"{c['sentences_s']:.1f} sentences/s ({c['seconds']:.1f} s, {c['steps']} decoder "
            f"steps), {c['flop_s'] / 1e9:.1f} GFLOP/s; bound: {c['limit']}; **fraction "
            f"{c['fraction']:.0%}**. Where the time goes: {c['profile']}."
        )
    if d is not None:
        lines += [
            "",
            f"(d) protein encoder inference (`embed`), {d['sequences']} FLIP test proteins of "
            f"{d['min_len']}-{d['max_len']} residues ({d['residues']} in all), float32: "
            f"{d['sequences_s']:.1f} sequences/s, {d['flop_s'] / 1e9:.1f} GFLOP/s = **"
            f"{d['fraction']:.0%} of the fp32 peak**. Where the time goes: {d['profile']}.",
        ]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--stream-mb", type=int, default=1024)
    p.add_argument("--translation-run", help="a trained translation run directory for (c)")
    p.add_argument("--sentences", type=int, default=1000, help="test2016 sentences for (c)")
    p.add_argument("--c-repeats", type=int, default=2)
    p.add_argument("--proteins", type=int, default=10_000, help="FLIP test proteins for (d)")
    p.add_argument("--batch-rows", default="8,32")
    p.add_argument("--workloads", default="abcd", help="which of (a)-(d) to run (default all)")
    p.add_argument("--quick", action="store_true", help="tiny sanity run; figures are not results")
    p.add_argument("--append-results", action="store_true")
    p.add_argument("--results", default=str(Path(__file__).with_name("HISTORY.md")))
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.new_tokens, args.stream_mb = 1, 8, 64
        args.sentences, args.c_repeats, args.proteins, args.batch_rows = 16, 1, 16, "8"
    peak = {
        k: matmul_peak(dt, torch.device("cpu"), repeats=1 if args.quick else 3)[0] for k, dt in DTYPES.items()
    }
    streams = {}  # (dtype, what) -> {kernel: GB/s}
    for k, dt in WEIGHTS.items():
        streams[k, "GPT-2 small's"] = stream_bandwidth(dt, args.stream_mb, args.repeats)
        streams[k, "4096 × 4096"] = stream_bandwidth(dt, args.stream_mb, args.repeats, shapes=LARGE)
    bw = {k: max(streams[k, "GPT-2 small's"].values()) for k in DTYPES}
    read_gbs = read_bandwidth()
    print(f"bounds: {streams}, read {read_gbs:.1f} GB/s, peak {peak}", file=sys.stderr)
    run = set(args.workloads)
    # bfloat16 also without batch invariance: what reproducing recomputation costs
    a = [workload_a(args, streams, read_gbs, k, invariant) for k, invariant in A_RUNS] if "a" in run else []
    print(f"(a) {a}", file=sys.stderr)
    b = (
        [workload_b(args, bw, peak, k, int(rows)) for k in DTYPES for rows in args.batch_rows.split(",")]
        if "b" in run
        else []
    )
    print(f"(b) {b}", file=sys.stderr)
    c = workload_c(args, bw, peak) if "c" in run else None
    print(f"(c) {c}", file=sys.stderr)
    d = workload_d(args, peak) if "d" in run else None
    text = report(args, streams, read_gbs, peak, a, b, c, d)
    publish(text, args.append_results, args.results)


if __name__ == "__main__":
    main()
