"""qkv's hook points against TransformerLens (Nanda & Bloom 2022) on one random GPT-2-small-shaped
model: the logits of three hooked runs, and the recorded activations, side by side.

What is compared (same process, same weights, float32, CPU)
-----------------------------------------------------------
The model: a Hugging Face ``GPT2LMHeadModel`` built from a config with a seed (never
downloaded): GPT-2 small's shape (12 layers, d_model 768, 12 heads, d_ff 3072, GELU-tanh,
LayerNorm ε 1e-5, biases, tied embeddings) with a reduced vocabulary (1000) and context (64) to
keep it quick (``--vocab``, ``--n-ctx``). qkv's side: that model converted by qkv's own converter
(``qkv.hub.convert.convert_state``, what ``qkv convert hf`` runs). TransformerLens's side: a
``HookedTransformer`` of the same config (``act_fn="gelu_new"``, ``normalization_type="LN"``)
loaded with TransformerLens's GPT-2 weight conversion (``convert_gpt2_weights``) of the same HF
state dict, with every weight processing off (``fold_ln``, ``center_writing_weights``,
``center_unembed``, ``fold_value_biases``), so each hook point holds the value of the plain
forward pass and the two sides' points are comparable.

Cases (on a random batch, ``--batch`` × ``--seq`` tokens):
  none      no hook: the two forward passes.
  (a) head  head 3 of layer 5 zeroed: TL ``blocks.5.attn.hook_z``;
            qkv ``ablate_heads("layers.5.self_attn", 3)``.
  (b) patch ``resid_pre`` of layer 6 at the last position taken from a second input of the same
            length: TL ``blocks.6.hook_resid_pre`` from its ``run_with_cache``; qkv
            ``patch_from(cache, "layers.6.resid_pre", positions=[-1])`` from ``run_with_cache``.
  (c) neurons 10 FFN neurons of layer ``--ffn-layer`` (seeded draw) zeroed: TL
            ``blocks.L.mlp.hook_post``; qkv ``ablate_neurons("layers.L.ffn", [...])``.
Printed per case: max |qkv − TL| of the logits (the acceptance bound is 1e-4), how far the
intervention moved the logits (so the agreement is not that of two untouched runs), and the wall
time of each hooked run (hooks attached, forward, hooks removed), after one warm-up run, qkv and TL
alternating (order flipped every repeat), median over ``--repeats`` with the ratio qkv / TL (< 1:
qkv faster). Then (d): each recorded activation of
``run_with_cache`` by name (residual stream, Q, pattern, z, attention out, FFN pre and hidden,
...) against TL's ``run_with_cache`` value, max |Δ| (Q, K, V transposed: qkv keeps heads before
positions). Exit status 1 when a logits or activation difference is over the bound.

Run (from the repository root; needs ``pip install -e '.[interp]'`` or the ``--no-deps`` install
of transformer-lens 3.x that CI uses, and transformers for the HF model; transformer-lens 4.0
removed ``HookedTransformer``):
    .venv/bin/python benchmarks/transformer_lens_parity.py [--repeats 5] [--threads 2]
    .venv/bin/python benchmarks/transformer_lens_parity.py --layers 8 --repeats 1   # quick look
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version

import torch
from common import machine  # noqa: E402  (benchmarks/common.py)

from qkv.explain import ablate_heads, ablate_neurons, patch_from, run_with_cache, run_with_hooks
from qkv.hub.convert import convert_state

try:
    import transformers
except ImportError:  # pragma: no cover
    sys.exit("this benchmark needs Hugging Face transformers: pip install -e '.[bench]'")
try:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights
except ImportError as exc:  # pragma: no cover
    sys.exit(f"this benchmark needs transformer-lens < 4 (HookedTransformer): {exc}")

TOL = 1e-4
HEAD_LAYER, HEAD, PATCH_LAYER = 5, 3, 6


def gpt2_config(
    layers: int = 12,
    d_model: int = 768,
    heads: int = 12,
    d_ff: int = 3072,
    vocab: int = 1000,
    n_ctx: int = 64,
) -> transformers.GPT2Config:
    """GPT-2's config (GELU-tanh, LayerNorm ε 1e-5, tied embeddings) at the given shape."""
    return transformers.GPT2Config(
        vocab_size=vocab, n_positions=n_ctx, n_embd=d_model, n_layer=layers, n_head=heads, n_inner=d_ff
    )


def build(config: transformers.GPT2Config, seed: int = 0) -> tuple[torch.nn.Module, HookedTransformer]:
    """A random ``GPT2LMHeadModel`` (seeded) → (the qkv ``DecoderLM`` its converter makes, a
    TransformerLens ``HookedTransformer`` loaded with the same weights, no weight processing)."""
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = convert_state(hf.config.to_dict(), hf.state_dict(), None).model.eval()
    tl_config = HookedTransformerConfig(
        n_layers=config.n_layer,
        d_model=config.n_embd,
        n_heads=config.n_head,
        d_head=config.n_embd // config.n_head,
        d_mlp=config.n_inner or 4 * config.n_embd,
        d_vocab=config.vocab_size,
        n_ctx=config.n_positions,
        act_fn="gelu_new",
        normalization_type="LN",
        eps=config.layer_norm_epsilon,
        default_prepend_bos=False,
    )
    with warnings.catch_warnings():  # 3.x: "HookedTransformer is deprecated and will be removed in 4.0"
        warnings.simplefilter("ignore", DeprecationWarning)
        tl = HookedTransformer(tl_config)
    tl.load_and_process_state_dict(
        convert_gpt2_weights(hf, tl_config),
        fold_ln=False,
        center_writing_weights=False,
        center_unembed=False,
        fold_value_biases=False,
    )
    return ours, tl.eval()


def activation_pairs(layer: int, ffn_layer: int) -> list[tuple[str, str, bool]]:
    """(qkv name, TransformerLens name, transpose heads and positions of qkv's value) of the
    points compared in (d)."""
    a, f = f"layers.{layer}", f"layers.{ffn_layer}"
    return [
        ("embed", "hook_embed", False),
        ("positional", "hook_pos_embed", False),  # qkv (1, T, D), TL (B, T, D): broadcast
        (f"{a}.resid_pre", f"blocks.{layer}.hook_resid_pre", False),
        (f"{a}.self_attn.norm_out", f"blocks.{layer}.ln1.hook_normalized", False),
        (f"{a}.self_attn.q", f"blocks.{layer}.attn.hook_q", True),
        (f"{a}.self_attn.k", f"blocks.{layer}.attn.hook_k", True),
        (f"{a}.self_attn.v", f"blocks.{layer}.attn.hook_v", True),
        (f"{a}.self_attn.pattern", f"blocks.{layer}.attn.hook_pattern", False),
        (f"{a}.self_attn.z", f"blocks.{layer}.attn.hook_z", False),
        (f"{a}.self_attn.out", f"blocks.{layer}.hook_attn_out", False),
        (f"{a}.self_attn.resid_post", f"blocks.{layer}.hook_resid_mid", False),
        (f"{f}.ffn.pre", f"blocks.{ffn_layer}.mlp.hook_pre", False),
        (f"{f}.ffn.hidden", f"blocks.{ffn_layer}.mlp.hook_post", False),
        (f"{f}.ffn.out", f"blocks.{ffn_layer}.hook_mlp_out", False),
        (f"{a}.resid_post", f"blocks.{layer}.hook_resid_post", False),
        ("final_norm", "ln_final.hook_normalized", False),
    ]


@dataclass
class Case:
    name: str
    ours: Callable[[], torch.Tensor]  # → logits
    theirs: Callable[[], torch.Tensor]


def cases(
    ours: torch.nn.Module, tl: HookedTransformer, tokens: torch.Tensor, source: torch.Tensor, ffn_layer: int
) -> list[Case]:
    """The hooked runs of each side (the patch's source caches are recorded here, not timed)."""
    d_ff = tl.cfg.d_mlp
    assert d_ff is not None  # set in build()
    neurons = torch.randperm(d_ff, generator=torch.Generator().manual_seed(1))[:10].tolist()
    _, our_source = run_with_cache(ours, source, names_filter=f"layers.{PATCH_LAYER}.resid_pre")
    _, tl_source = tl.run_with_cache(source, names_filter=f"blocks.{PATCH_LAYER}.hook_resid_pre")

    def zero_head(z, hook):  # TransformerLens's way: z (B, T, H, d_head)
        z[:, :, HEAD] = 0
        return z

    def patch_last(resid, hook):
        resid[:, -1] = tl_source[hook.name][:, -1]
        return resid

    def zero_neurons(post, hook):
        post[:, :, neurons] = 0
        return post

    return [
        Case("none", lambda: ours(tokens).logits, lambda: tl(tokens)),
        Case(
            f"(a) zero head {HEAD} of layer {HEAD_LAYER}",
            lambda: (
                run_with_hooks(
                    ours, tokens, hooks=ablate_heads(f"layers.{HEAD_LAYER}.self_attn", HEAD)
                ).logits
            ),
            lambda: tl.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{HEAD_LAYER}.attn.hook_z", zero_head)]),
        ),
        Case(
            f"(b) patch layer {PATCH_LAYER} resid_pre, last position",
            lambda: (
                run_with_hooks(
                    ours,
                    tokens,
                    hooks=patch_from(our_source, f"layers.{PATCH_LAYER}.resid_pre", positions=[-1]),
                ).logits
            ),
            lambda: tl.run_with_hooks(
                tokens, fwd_hooks=[(f"blocks.{PATCH_LAYER}.hook_resid_pre", patch_last)]
            ),
        ),
        Case(
            f"(c) zero 10 neurons of layer {ffn_layer}",
            lambda: (
                run_with_hooks(ours, tokens, hooks=ablate_neurons(f"layers.{ffn_layer}.ffn", neurons)).logits
            ),
            lambda: tl.run_with_hooks(
                tokens, fwd_hooks=[(f"blocks.{ffn_layer}.mlp.hook_post", zero_neurons)]
            ),
        ),
    ]


def timed(fn: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12, help="GPT-2 small: 12 (at least 7: layers 5 and 6)")
    p.add_argument("--vocab", type=int, default=1000, help="GPT-2: 50257")
    p.add_argument("--n-ctx", type=int, default=64, help="GPT-2: 1024")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=32, help="tokens per input (at most --n-ctx)")
    p.add_argument("--ffn-layer", type=int, default=2, help="the layer of (c)'s neurons")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.layers <= PATCH_LAYER or not 0 <= args.ffn_layer < args.layers or args.seq > args.n_ctx:
        p.error(f"need --layers > {PATCH_LAYER}, 0 <= --ffn-layer < --layers and --seq <= --n-ctx")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)

    start = time.perf_counter()
    config = gpt2_config(args.layers, vocab=args.vocab, n_ctx=args.n_ctx)
    ours, tl = build(config, args.seed)
    n_params = sum(t.numel() for t in ours.parameters())
    print(f"built both models in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    g = torch.Generator().manual_seed(args.seed + 1)
    tokens, source = (torch.randint(0, args.vocab, (args.batch, args.seq), generator=g) for _ in range(2))
    todo = cases(ours, tl, tokens, source, args.ffn_layer)

    plain = todo[0].ours()
    rows, worst = [], 0.0
    for case in todo:
        a, b = case.ours(), case.theirs()  # also the warm-up
        our_times: list[float] = []
        tl_times: list[float] = []
        for r in range(args.repeats):
            order = [(case.ours, our_times), (case.theirs, tl_times)]
            for fn, times in order if r % 2 == 0 else order[::-1]:
                _, seconds = timed(fn)
                times.append(seconds)
        diff = (a - b).abs().max().item()
        worst = max(worst, diff)
        mo, mt = statistics.median(our_times) * 1e3, statistics.median(tl_times) * 1e3
        moved = (a - plain).abs().max().item()
        ratios = [o / t for o, t in zip(our_times, tl_times, strict=True)]
        spread = f"({min(ratios):.2f}–{max(ratios):.2f})"
        rows.append(
            f"| {case.name} | {diff:.2e} | {moved:.3g} | {mo:,.1f} | {mt:,.1f} | **{mo / mt:.2f}** {spread} |"
        )
        print(f"{case.name}: max |Δ logits| {diff:.2e}", file=sys.stderr)

    _, our_cache = run_with_cache(ours, tokens)
    _, tl_cache = tl.run_with_cache(tokens)
    act_rows, worst_act = [], 0.0
    for our_name, tl_name, transpose in activation_pairs(HEAD_LAYER, args.ffn_layer):
        mine = our_cache[our_name]
        mine = mine.transpose(1, 2) if transpose else mine
        diff = (mine - tl_cache[tl_name]).abs().max().item()
        worst_act = max(worst_act, diff)
        act_rows.append(f"| `{our_name}` | `{tl_name}` | {tuple(tl_cache[tl_name].shape)} | {diff:.2e} |")

    ok = worst <= TOL and worst_act <= TOL
    shape = (
        f"{args.layers} layers, d_model {config.n_embd}, {config.n_head} heads, d_ff {config.n_inner}, "
        f"vocabulary {args.vocab}, context {args.n_ctx}; {n_params / 1e6:.1f} M parameters"
    )
    lines = [
        f"### qkv hook points vs TransformerLens {version('transformer-lens')}",
        "",
        f"Random GPT-2 ({shape}), batch {args.batch} × {args.seq} tokens, float32; medians of "
        f"{args.repeats} alternating repeats; {machine()}; transformers {transformers.__version__}.",
        "",
        "| case | max \\|Δ logits\\| qkv − TL | max \\|Δ logits\\| from the unhooked run "
        "| qkv ms | TL ms | qkv / TL (per-repeat range) |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        "| qkv point | TransformerLens point | shape | max \\|Δ\\| |",
        "|---|---|---|---|",
        *act_rows,
        "",
        f"Summary: logits max |Δ| {worst:.2e}, activations max |Δ| {worst_act:.2e}: "
        f"{'within' if ok else 'OVER'} the bound {TOL:g}.",
    ]
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
