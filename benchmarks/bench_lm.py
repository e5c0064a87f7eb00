"""Speed of qkv's decoder-only LM against Hugging Face ``GPT2LMHeadModel`` (CPU by default).

What is compared (same process; ours and the reference alternate, the order flips every
repeat; medians over ``--repeats``; ratios are ours / reference)
----------------------------------------------------------------------------------------
(a) Training step, nanoGPT's CPU "baby GPT": 4 layers, 4 heads, d_model 128, block 64,
    batch 12, vocabulary 65 (tiny-shakespeare characters), dropout 0. Ours: ``DecoderLM`` with
    the LM recipe's defaults (pre-LN, GELU, learned positions, no biases, tied embeddings).
    Reference: ``GPT2LMHeadModel(GPT2Config(...))`` of the same shape, random init, no download,
    ``activation_function="gelu"`` (exact GELU, as ours), its default attention implementation
    (SDPA). GPT-2 always has biases in its linears and LayerNorms, so it has a few more
    parameters (both counts printed). One step = forward on random windows of the real
    tiny-shakespeare training split, mean cross-entropy, backward, clip to norm 1, fused AdamW
    (lr 1e-3, β (0.9, 0.99), weight decay 0.1). Measure: milliseconds per step (lower is better;
    the ratio is ours / reference, so < 1 means ours is faster).
(b) Generation, GPT-2 small shape: 12 layers, 12 heads, d_model 768, d_ff 3072, vocabulary
    50257, context 1024, biases, random weights. Batch 1, a 32-token prompt, 128 new tokens,
    greedy. Ours: ``qkv.inference.lm.generate_tokens`` (KV cache) on the model as
    ``TextGenerator.from_run`` prepares it (``prepare_for_inference``: float32 weights stored
    (in, out); bfloat16 ones reordered by oneDNN where the CPU has native bfloat16; same
    values). Reference: HF
    ``model.generate(do_sample=False, use_cache=True, min_new_tokens=max_new_tokens)`` with
    its default dynamic cache. Measure: new tokens / second (the ratio is ours / reference,
    > 1 means ours is faster).

Sanity checks before timing: the reference loaded with our weights (its extra biases zero)
gives the same logits as ours (max difference printed and asserted), and for (b) the same
greedy continuation, so both do the same work.

Run (from the repository root, with the CPU to itself; needs ``pip install -e .[bench]``):
    .venv/bin/python benchmarks/bench_lm.py --append-results
    .venv/bin/python benchmarks/bench_lm.py --quick        # sanity run, not a result
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import alternate, machine, publish, row  # noqa: E402  (benchmarks/common.py)

from qkv.data.text import load_corpus, random_windows, split_train_val, windows_at
from qkv.data.tokenizers import CharTokenizer
from qkv.inference.lm import generate_tokens
from qkv.inference.weight_layout import prepare_for_inference
from qkv.models import DecoderLM, LMConfig

try:
    from transformers import GPT2Config, GPT2LMHeadModel
except ImportError:  # pragma: no cover
    sys.exit("this benchmark needs Hugging Face transformers: pip install -e '.[bench]'")


def hf_model(cfg: LMConfig) -> GPT2LMHeadModel:
    """A GPT-2 of the same shape as ``cfg`` (random init, no download)."""
    config = GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.max_len,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_inner=cfg.d_ff,
        activation_function="gelu",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=cfg.layer_norm_eps,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return GPT2LMHeadModel(config)


@torch.no_grad()
def copy_ours_into_hf(ours: DecoderLM, ref: GPT2LMHeadModel) -> None:
    """Our weights into the reference (GPT-2's Conv1D stores (in, out): transpose); biases
    ours lacks are zeroed."""
    tr = ref.transformer
    tr.wte.weight.copy_(ours.embed.weight)
    tr.wpe.weight.copy_(ours.positional.embedding.weight)

    def copy(dst_w, dst_b, w, b, transpose=True):
        dst_w.copy_(w.t() if transpose else w)
        if dst_b is not None:
            dst_b.copy_(b if b is not None else torch.zeros_like(dst_b))

    for block, layer in zip(tr.h, ours.layers, strict=True):
        att = layer.self_attn
        # Both pack Q, K, V output rows in that order (GPT-2's c_attn stores them as columns).
        copy(block.attn.c_attn.weight, block.attn.c_attn.bias, att.w_qkv.weight, att.w_qkv.bias)
        copy(block.attn.c_proj.weight, block.attn.c_proj.bias, att.w_o.weight, att.w_o.bias)
        copy(block.mlp.c_fc.weight, block.mlp.c_fc.bias, layer.ffn.w_1.weight, layer.ffn.w_1.bias)
        copy(block.mlp.c_proj.weight, block.mlp.c_proj.bias, layer.ffn.w_2.weight, layer.ffn.w_2.bias)
        for ln, norm in ((block.ln_1, layer.self_attn_block.norm), (block.ln_2, layer.ffn_block.norm)):
            copy(ln.weight, ln.bias, norm.weight, norm.bias, transpose=False)
    copy(tr.ln_f.weight, tr.ln_f.bias, ours.final_norm.weight, ours.final_norm.bias, transpose=False)


def logit_diff(ours: DecoderLM, ref: GPT2LMHeadModel, tokens: torch.Tensor) -> float:
    ours.eval(), ref.eval()
    with torch.no_grad():
        return float((ours(tokens).logits - ref(tokens).logits).abs().max())


def optimizer(model) -> torch.optim.Optimizer:
    params = list(model.parameters())
    return torch.optim.AdamW(
        [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ],
        lr=1e-3,
        betas=(0.9, 0.99),
        fused=True,
    )


def train_steps(model, logits_fn, opt, batches) -> tuple[int, float]:
    """Run one training step per batch; returns (steps, seconds)."""
    model.train()
    start = time.perf_counter()
    for x, y in batches:
        logits = logits_fn(model, x)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return len(batches), time.perf_counter() - start


def bench_training(args) -> dict:
    text = load_corpus("tinyshakespeare")
    tok = CharTokenizer.train(text)
    data = torch.tensor(tok.encode(split_train_val(text)[0]))
    g = torch.Generator().manual_seed(1337)
    batches = [windows_at(data, random_windows(data, 64, 12, g), 64) for _ in range(args.train_steps)]
    cfg = LMConfig(vocab_size=tok.vocab_size)  # the baby GPT: 4 layers, 4 heads, d_model 128, block 64
    torch.manual_seed(0)
    ours, ref = DecoderLM(cfg), hf_model(cfg)
    copy_ours_into_hf(ours, ref)
    diff = logit_diff(ours, ref, batches[0][0])
    assert diff < 1e-4, f"reference does not compute the same function (max logit diff {diff})"
    opt_ours, opt_ref = optimizer(ours), optimizer(ref)
    run_ours = lambda: train_steps(ours, lambda m, x: m(x).logits, opt_ours, batches)  # noqa: E731
    run_ref = lambda: train_steps(ref, lambda m, x: m(input_ids=x).logits, opt_ref, batches)  # noqa: E731
    run_ours(), run_ref()  # warm-up
    ours_rate, ref_rate = alternate(args.repeats, run_ours, run_ref)
    # rates are steps/s; report ms/step
    return {
        "ours": [1000 / r for r in ours_rate],
        "ref": [1000 / r for r in ref_rate],
        "params": (ours.num_parameters(), ref.num_parameters()),
        "logit_diff": diff,
    }


def bench_generation(args, dtype: torch.dtype = torch.float32) -> dict:
    cfg = LMConfig(vocab_size=50257, d_model=768, n_heads=12, d_ff=3072, n_layers=12, max_len=1024, bias=True)
    torch.manual_seed(0)
    ours, ref = DecoderLM(cfg).eval(), hf_model(cfg).eval()
    copy_ours_into_hf(ours, ref)
    ours, ref = ours.to(dtype), ref.to(dtype)
    prepare_for_inference(ours)  # what TextGenerator.from_run does (layout only; values unchanged)
    prompt = torch.randint(
        0, cfg.vocab_size, (1, args.prompt_tokens), generator=torch.Generator().manual_seed(1)
    )
    diff = logit_diff(ours, ref, prompt)
    tolerance = 1e-3 if dtype == torch.float32 else 0.5  # bfloat16 keeps ~3 significant digits
    assert diff < tolerance, f"reference does not compute the same function (max logit diff {diff})"
    n = args.new_tokens
    out = {}

    def run_ours():
        start = time.perf_counter()
        out["ours"] = generate_tokens(ours, prompt.tolist(), n, do_sample=False)[0]
        return n, time.perf_counter() - start

    def run_ref():
        start = time.perf_counter()
        with torch.no_grad():
            seq = ref.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=n,
                min_new_tokens=n,
                use_cache=True,
                pad_token_id=0,
            )
        out["ref"] = seq[0, prompt.size(1) :].tolist()
        return n, time.perf_counter() - start

    run_ours(), run_ref()  # warm-up
    same = sum(a == b for a, b in zip(out["ours"], out["ref"], strict=True)) / n
    ours_rate, ref_rate = alternate(args.repeats, run_ours, run_ref)
    return {
        "ours": ours_rate,
        "ref": ref_rate,
        "params": (ours.num_parameters(), ref.num_parameters()),
        "logit_diff": diff,
        "same_tokens": same,
    }


def report(args, train: dict, gen: dict, gen_bf16: dict) -> str:
    import transformers

    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS",) if k in os.environ)
    cmd = " ".join(filter(None, [env, "python", shlex.join(sys.argv)]))
    lines = [
        f"## bench_lm{' (--quick: sanity run, not a result)' if args.quick else ''} — "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        "",
        f"- command: `{cmd}`",
        f"- machine: {machine()}, transformers {transformers.__version__}",
        f"- (a) training: baby GPT (4 layers, 4 heads, d_model 128, block 64, batch 12, vocab 65), "
        f"{args.train_steps} steps on tiny-shakespeare windows per repeat; parameters ours "
        f"{train['params'][0]:,}, GPT-2 {train['params'][1]:,} (its biases); same weights → max "
        f"logit diff {train['logit_diff']:.1e}. Lower ms/step is better: ratio < 1 = ours faster.",
        f"- (b) generation: GPT-2-small shape (12 layers, 12 heads, d_model 768, vocab 50257), "
        f"random weights, batch 1, {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, "
        f"greedy; same weights → max logit diff {gen['logit_diff']:.1e}, greedy tokens identical "
        f"{gen['same_tokens']:.0%} (bfloat16: {gen_bf16['logit_diff']:.1e}, "
        f"{gen_bf16['same_tokens']:.0%}). Both models in float32, then both in bfloat16 "
        "(`model.to(torch.bfloat16)`; `qkv generate --dtype bfloat16`). Ratio > 1 = ours faster.",
        f"- {args.repeats} repeats, alternating: medians (min–max); ratio of medians (min–max of "
        "per-repeat ratios)",
        "",
        "| measure | ours (qkv) | reference (HF GPT2LMHeadModel) | ours / reference |",
        "|---|---|---|---|",
        row("(a) training step, ms (lower is better)", train["ours"], train["ref"]),
        row("(b) greedy generation, float32, new tokens/s", gen["ours"], gen["ref"]),
        row("(b) greedy generation, bfloat16, new tokens/s", gen_bf16["ours"], gen_bf16["ref"]),
        row("(b) ours bfloat16 vs HF float32 (its default)", gen_bf16["ours"], gen["ref"]),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--train-steps", type=int, default=50, help="training steps per repeat")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--quick", action="store_true", help="tiny sanity run; figures are not results")
    p.add_argument("--append-results", action="store_true")
    p.add_argument("--results", default=str(Path(__file__).with_name("HISTORY.md")))
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.repeats, args.train_steps, args.new_tokens = 1, 5, 8
    train = bench_training(args)
    print(
        f"training: ours {statistics.median(train['ours']):.2f} ms/step, "
        f"HF {statistics.median(train['ref']):.2f} ms/step",
        file=sys.stderr,
    )
    gen = bench_generation(args)
    gen_bf16 = bench_generation(args, torch.bfloat16)
    text = report(args, train, gen, gen_bf16)
    publish(text, args.append_results, args.results)


if __name__ == "__main__":
    main()
