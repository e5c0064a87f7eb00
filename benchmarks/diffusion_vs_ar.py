"""An autoregressive LM and a masked diffusion LM trained alike, side by side (issue 45).

For a ``qkv train lm`` run and a ``qkv train diffusion-lm`` run on the same corpus with the same
model size, steps and schedule:

- validation: the AR model's exact NLL and the diffusion model's negative ELBO (an upper bound on
  its NLL), in bits per character, the bound with its Monte Carlo standard error (``--draws``
  draws of (t, masks) per window, fixed seed); each run's steps, training minutes and parameters,
  and each run's validation curve read at the other's final wall time (equal wall);
- samples: ``--samples`` samples of ``--tokens`` tokens from the start token, from the AR model
  (temperature 1) and from the diffusion model (random remasking, MDLM's ancestral order, and
  LLaDA's low-confidence remasking, each with one step per token), scored by a judge (``--judge``,
  default the AR run: a judge that scores its own samples favours them; say so) in bits per
  character, with the share of distinct word bigrams (repetition lowers it) beside the
  validation text's.

- ``--plot PNG``: both validation curves against training steps (log scale), the steps at
  which the AR model first reached the diffusion model's final bound marked (the compute the
  diffusion model needed, in AR steps).

Usage:
    python benchmarks/diffusion_vs_ar.py --ar RUN --diffusion RUN [--judge RUN] [--json F] [--plot PNG]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

from qkv import runs
from qkv.data.lm import corpus_splits
from qkv.inference.diffusion import DiffusionGenerator
from qkv.inference.lm import TextGenerator
from qkv.recipes import lm as lm_recipe
from qkv.recipes.diffusion_lm import validation_bound
from qkv.recipes.lm import run_split, split_nll


def _summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def _curve(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "val_loss" in r and "elapsed_min" in r]


def at_minutes(curve: list[dict], minutes: float) -> dict | None:
    """The last validation row at or before ``minutes`` of training."""
    rows = [r for r in curve if r["elapsed_min"] <= minutes + 1e-9]
    return rows[-1] if rows else None


def first_step_at_or_below(curve: list[dict], bits: float) -> int | None:
    """The first evaluated step whose validation bits/char is at or below ``bits``."""
    return next((r["step"] for r in curve if r["val_bits_per_char"] <= bits), None)


def plot_curves(curves: dict[str, list[dict]], final_bound: float, path: Path) -> None:
    """Validation bits/char of both runs against steps, the diffusion run's final bound drawn
    across."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = fig.subplots()
    for (name, curve), colour in zip(curves.items(), ("tab:blue", "tab:orange"), strict=True):
        label = "autoregressive (exact NLL)" if name == "ar" else "masked diffusion (bound)"
        ax.plot(
            [r["step"] for r in curve],
            [r["val_bits_per_char"] for r in curve],
            "o-",
            ms=3,
            color=colour,
            label=label,
        )
    ax.axhline(final_bound, color="tab:orange", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation bits per character")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110)


def distinct_bigrams(texts: list[str]) -> float:
    """Distinct word bigrams / word bigrams, over all texts (1.0: no bigram repeats)."""
    bigrams = [b for t in texts for b in zip(t.split(), t.split()[1:], strict=False)]
    return len(set(bigrams)) / max(1, len(bigrams))


def judge_bits_per_char(model, tok, texts: list[str]) -> float:
    """Bits per character of ``texts`` under an AR model (each text after a newline, scored in
    the model's windows)."""
    nll, chars = 0.0, 0
    for text in texts:
        ids = torch.tensor(tok.encode("\n" + text), dtype=torch.long)
        with torch.no_grad():
            total, _ = split_nll(model, ids, model.config.max_len)
        nll, chars = nll + total, chars + len(text)
    return nll / chars / math.log(2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ar", type=Path, required=True)
    p.add_argument("--diffusion", type=Path, required=True)
    p.add_argument("--judge", type=Path, help="AR run that scores the samples (default --ar)")
    p.add_argument("--draws", type=int, default=8, help="Monte Carlo draws per window for the bound")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path, help="draw both validation curves to this PNG")
    args = p.parse_args()
    torch.manual_seed(args.seed)

    out: dict = {"runs": {}}
    for name, run in (("ar", args.ar), ("diffusion", args.diffusion)):
        s = _summary(run)
        out["runs"][name] = {
            "run": str(run),
            "steps": s["steps"],
            "train_minutes": s["train_minutes"],
            "parameters": s["parameters"],
        }
    ar_eval = lm_recipe.evaluate_run(args.ar)
    out["runs"]["ar"]["val_bits_per_char"] = ar_eval["bits_per_char"]
    model, tok = runs.load_run(args.diffusion, family="diffusion-lm")
    meta = json.loads((args.diffusion / "train_config.json").read_text())
    data, chars_per_token = run_split(args.diffusion, tok, "val")
    t0 = time.perf_counter()
    b = validation_bound(model, data, args.draws, meta["eps"], meta["train"]["seed"])
    per_char = 1 / chars_per_token / math.log(2)
    out["runs"]["diffusion"].update(
        val_bits_per_char=b.nats_per_token * per_char,
        val_bits_per_char_stderr=b.stderr * per_char,
        draws=args.draws,
        bound_seconds=round(time.perf_counter() - t0, 1),
    )
    # equal wall: each curve read at the other's final training minutes
    curves = {"ar": _curve(args.ar), "diffusion": _curve(args.diffusion)}
    for name, other in (("ar", "diffusion"), ("diffusion", "ar")):
        row = at_minutes(curves[name], out["runs"][other]["train_minutes"])
        out["runs"][name]["val_bits_per_char_at_other_wall"] = row and row["val_bits_per_char"]
    bound = out["runs"]["diffusion"]["val_bits_per_char"]
    out["ar_steps_to_the_final_bound"] = first_step_at_or_below(curves["ar"], bound)
    if args.plot:
        plot_curves(curves, bound, args.plot)

    judge, judge_tok = runs.load_run(args.judge or args.ar, family="lm")
    ar_gen = TextGenerator.from_run(args.ar)
    dif_gen = DiffusionGenerator(model, tok)
    samples = {
        "ar (temperature 1)": ar_gen.generate([""] * args.samples, args.tokens, seed=args.seed),
    }
    for remasking in ("random", "confidence"):
        samples[f"diffusion ({remasking} remasking, temperature 1)"] = dif_gen.generate(
            "", args.tokens, num_samples=args.samples, seed=args.seed, remasking=remasking, temperature=1.0
        )
    _, val_text = corpus_splits(meta["corpus"], meta.get("val_corpus"), meta["val_fraction"])
    reference = [val_text[i : i + args.tokens] for i in range(0, args.samples * args.tokens, args.tokens)]
    samples["validation text"] = reference
    out["samples"] = {}
    for name, texts in samples.items():
        out["samples"][name] = {
            "judge_bits_per_char": judge_bits_per_char(judge, judge_tok, texts),
            "distinct_word_bigrams": distinct_bigrams(texts),
            "first": texts[0][:300],
        }

    print("| run | parameters | steps | train min | validation bits/char | at the other's wall |")
    print("|---|---|---|---|---|---|")
    for name, r in out["runs"].items():
        v = f"{r['val_bits_per_char']:.4f}"
        if "val_bits_per_char_stderr" in r:
            v = f"≤ {v} ± {r['val_bits_per_char_stderr']:.4f} (bound, {r['draws']} draws)"
        other = r["val_bits_per_char_at_other_wall"]
        print(
            f"| {name} | {r['parameters']:,} | {r['steps']:,} | {r['train_minutes']} | {v} | "
            f"{'-' if other is None else f'{other:.4f}'} |"
        )
    print(
        f"\nthe AR model first reached the diffusion model's final bound at step "
        f"{out['ar_steps_to_the_final_bound']} (evaluated steps only)\n"
    )
    print("| samples | judge bits/char | distinct word bigrams | first sample |")
    print("|---|---|---|---|")
    for name, r in out["samples"].items():
        first = r["first"][:80].replace("\n", "⏎").replace("|", "\\|")
        print(f"| {name} | {r['judge_bits_per_char']:.3f} | {r['distinct_word_bigrams']:.3f} | {first} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
