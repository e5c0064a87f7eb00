"""Why attention: the lecture's case against recurrent networks, measured on one machine, one
budget and one metric (issue 29).

Four models, each trained by qkv's translation recipes for the same 10-minute budget on the
same 2 CPU cores, on Multi30k de→en with the same joint BPE, batches and training loop:

- ``transformer``: the demo recipe (``qkv train translation``, defaults);
- ``transformer_no_pos``: the same with ``model.positional=none`` ("a single block of
  weights": no order);
- ``rnn_attention``: a bidirectional GRU encoder and a GRU decoder with additive attention
  (Bahdanau et al. 2015; ``qkv train translation-rnn``);
- ``rnn_bottleneck``: the same decoder seeing only the encoder's final states (Cho et al. 2014).

Subcommands, in order (each writes under ``--out``):

    sweep   the RNNs' size and learning rate, chosen on validation BLEU (greedy): 5-minute
            proxies, two at a time on one thread each; test data is never scored
    train   the four final runs, one after the other, each alone on the machine's threads
    report  test2016 sacreBLEU (cased) and chrF with beam 4, BLEU by source length, training
            time per batch against sequence length, side-by-side translations; writes
            ``report.json``, ``report.md`` and the plots (``--plots DIR``)

    QKV_DATA_DIR=../shared/data python benchmarks/why_attention.py sweep --out runs/why
    QKV_DATA_DIR=../shared/data python benchmarks/why_attention.py train --out runs/why
    QKV_DATA_DIR=../shared/data python benchmarks/why_attention.py report --out runs/why \
        --plots docs/assets/why_attention
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import BUCKETS, bucket_name, metrics, scored, sweep_table, train_run, validation_row  # noqa: E402  (benchmarks/common.py)

SWEEP_MINUTES = 5.0
# The RNN candidates (qkv train translation-rnn overrides): both variants share the grid of
# width and peak learning rate (linear decay to 0 at the end of the budget, as the demo's).
# The first rounds showed the budget wants a high rate and a small model, so the later ones
# went further that way.
GRID = (
    (256, "1e-3"),
    (256, "3e-3"),
    (512, "1e-3"),
    (256, "5e-3"),
    (128, "5e-3"),
    (256, "1e-2"),
    (256, "2e-2"),
)
SWEEP = {
    f"{variant}_d{d}_lr{lr}": [f"model.attention={attention}", f"model.d_model={d}", f"train.lr={lr}"]
    for variant, attention in (("attention", "additive"), ("bottleneck", "none"))
    for d, lr in (*GRID, *(((512, "3e-3"),) if variant == "attention" else ()))
}


def sweep(out: Path, names: list[str], jobs: int) -> None:
    def one(name: str) -> dict:
        overrides = SWEEP[name] + [
            f"train.max_minutes={SWEEP_MINUTES}",
            "train.threads=1",
            "train.eval_every=300",
            "test=false",
        ]
        train_run("translation-rnn", out / "sweep" / name, overrides)
        return validation_row(name, out / "sweep" / name, SWEEP[name])

    with ThreadPoolExecutor(jobs) as pool:
        rows = list(pool.map(one, names))
    table = sweep_table(rows, SWEEP_MINUTES)
    (out / "sweep.md").write_text(table + "\n")
    print(table)


# The final runs: (recipe, overrides). The RNNs' settings are the sweep's winners.
FINAL = {
    "transformer": ("translation", []),
    "transformer_no_pos": ("translation", ["model.positional=none"]),
    "rnn_attention": ("translation-rnn", ["model.attention=additive"]),
    "rnn_bottleneck": ("translation-rnn", ["model.attention=none"]),
}
LABELS = {
    "transformer": "Transformer (demo recipe)",
    "transformer_no_pos": "Transformer, no positions",
    "rnn_attention": "GRU + additive attention",
    "rnn_bottleneck": "GRU bottleneck",
}
LENGTHS = (8, 16, 32, 64, 128)  # tokens per sentence, for the time per batch
BATCH_TOKENS = 2048  # source tokens per batch at every length


def train(out: Path, names: list[str]) -> None:
    for name in names:
        recipe, overrides = FINAL[name]
        print(f"training {name} ...", flush=True)
        train_run(recipe, out / "final" / name, [*overrides, "test=false"])


def _train_figures(run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    speeds = [r["tokens_per_s"] for r in metrics(run_dir) if "tokens_per_s" in r]
    return {
        "steps": summary["steps"],
        "train_minutes": summary["train_minutes"],
        "parameters": summary["parameters"],
        "val_bleu": round(summary["validation"]["val_bleu"], 2),
        "tokens_per_s": round(sum(speeds) / len(speeds)) if speeds else None,
    }


def score(run_dir: Path, src: list[str], ref: list[str]) -> tuple[dict, list[str]]:
    """test2016 with beam 4 (§6.1): sacreBLEU cased and chrF overall and by source length."""
    from qkv.inference.translator import Translator

    hyps = Translator.from_run(run_dir, beam_size=4, alpha=0.6).translate(src)
    return scored(src, hyps, ref), hyps


def time_per_batch(run_dir: Path, repeats: int = 5) -> dict[int, float]:
    """Milliseconds per training step (forward, backward, Adam) of the run's architecture on
    random batches of ``BATCH_TOKENS`` source tokens, sentences of each length in ``LENGTHS``
    (source and target as long): the parallelism claim."""
    import time

    import torch

    from qkv.runs import model_type_of
    from qkv.train.losses import label_smoothed_nll

    kind = model_type_of(run_dir)
    cfg = kind.config.load(run_dir / "config.json")
    torch.manual_seed(0)
    model = kind.model(cfg).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    out = {}
    for length in LENGTHS:
        batch = BATCH_TOKENS // length
        src = torch.randint(4, cfg.src_vocab_size, (batch, length))
        tgt = torch.randint(4, cfg.tgt_vocab_size, (batch, length + 1))
        times = []
        for rep in range(repeats + 1):
            t0 = time.perf_counter()
            logits = model(src, tgt[:, :-1]).logits
            loss, _ = label_smoothed_nll(logits, tgt[:, 1:], 0.1, cfg.pad_id)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if rep:  # the first is warm-up
                times.append(time.perf_counter() - t0)
        out[length] = round(1000 * sorted(times)[len(times) // 2], 1)
    return out


def _order_example(src, ref, hyps: dict[str, list[str]]) -> int | None:
    """A test sentence where the model without positions uses the Transformer's words in
    another order: the largest gap between their shared words and their shared word pairs
    (unigram minus bigram overlap, sentences of 6+ words), or None."""
    from collections import Counter

    def overlap(a: list, b: list) -> float:
        shared = sum((Counter(a) & Counter(b)).values())
        return 2 * shared / (len(a) + len(b)) if a and b else 0.0

    best, best_gap = None, 0.0
    for i in range(len(src)):
        a, b = hyps["transformer_no_pos"][i].split(), hyps["transformer"][i].split()
        if len(b) < 6:
            continue
        gap = overlap(a, b) - overlap(list(zip(a, a[1:], strict=False)), list(zip(b, b[1:], strict=False)))
        if gap > best_gap:
            best, best_gap = i, gap
    return best


def report(out: Path, plots: Path | None) -> None:
    import platform

    import torch

    from qkv.data.translation import load_multi30k

    src, ref = load_multi30k("test2016", "de", "en")
    rows, hyps = {}, {}
    for name in FINAL:
        run_dir = out / "final" / name
        if not (run_dir / "summary.json").is_file():
            continue
        print(f"scoring {name} ...", flush=True)
        test, hyps[name] = score(run_dir, src, ref)
        rows[name] = {**_train_figures(run_dir), "test2016": test, "ms_per_batch": time_per_batch(run_dir)}
    # the first three, the longest source (the bottleneck's hardest), and one for word order
    examples = [0, 1, 2, max(range(len(src)), key=lambda i: len(src[i].split()))]
    if "transformer_no_pos" in hyps and "transformer" in hyps:
        order = _order_example(src, ref, hyps)
        if order is not None:
            examples.append(order)
    result = {
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "models": rows,
        "examples": [
            {"src": src[i], "ref": ref[i], **{name: h[i] for name, h in hyps.items()}} for i in examples
        ],
    }
    (out / "report.json").write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(markdown(result))
    print(markdown(result))
    if plots is not None:
        draw(result, plots)


def markdown(result: dict) -> str:
    rows = result["models"]
    buckets = [bucket_name(lo) for lo, _ in BUCKETS]
    lines = [
        "| model | parameters | steps in 10 min | training tokens/s | val BLEU (greedy) "
        "| test2016 BLEU | chrF | " + " | ".join(f"BLEU, {b} words" for b in buckets) + " |",
        "|---|---|---|---|---|---|---|" + "---|" * len(buckets),
    ]
    for name, r in rows.items():
        t = r["test2016"]
        lines.append(
            f"| {LABELS[name]} | {r['parameters'] / 1e6:.1f} M | {r['steps']} | {r['tokens_per_s']} | "
            f"{r['val_bleu']} | **{t['bleu']}** | {t['chrf']} | "
            + " | ".join(f"{t['by_length'][b]['bleu']}" for b in buckets)
            + " |"
        )
    if rows:
        first = next(iter(rows.values()))["test2016"]["by_length"]
        lines.append("")
        lines.append(
            "Sentences per length bucket: " + ", ".join(f"{b}: {first[b]['n']}" for b in buckets) + "."
        )
    lines += ["", "| model | " + " | ".join(f"ms/batch, {n} tokens" for n in LENGTHS) + " |"]
    lines.append("|---|" + "---|" * len(LENGTHS))
    for name, r in rows.items():
        lines.append(f"| {LABELS[name]} | " + " | ".join(str(r["ms_per_batch"][n]) for n in LENGTHS) + " |")
    for ex in result["examples"]:
        lines += ["", f"- DE: {ex['src']}", f"  - reference: {ex['ref']}"]
        lines += [f"  - {LABELS[name]}: {ex[name]}" for name in rows]
    return "\n".join(lines) + "\n"


def draw(result: dict, plots: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    plots.mkdir(parents=True, exist_ok=True)
    rows = result["models"]
    buckets = [bucket_name(lo) for lo, _ in BUCKETS]
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    width = 0.8 / max(len(rows), 1)
    for k, (name, r) in enumerate(rows.items()):
        values = [r["test2016"]["by_length"][b]["bleu"] for b in buckets]
        ax.bar([i + k * width for i in range(len(buckets))], values, width, label=LABELS[name])
    n = next(iter(rows.values()))["test2016"]["by_length"]
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(buckets))],
        [f"{b} words\n({n[b]['n']} sentences)" for b in buckets],
    )
    ax.set_ylabel("test2016 BLEU (sacreBLEU, cased, beam 4)")
    ax.set_title("BLEU by source length, each model after 10 minutes on 2 CPU cores")
    ax.legend(fontsize=8)
    fig.savefig(plots / "bleu_by_length.png", dpi=110)
    fig, ax = plt.subplots(figsize=(7, 4), layout="constrained")
    for name, r in rows.items():
        ax.plot(LENGTHS, [r["ms_per_batch"][n] for n in LENGTHS], marker="o", label=LABELS[name])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
    ax.set_xlabel(f"sentence length in tokens (batches of {BATCH_TOKENS} source tokens)")
    ax.set_ylabel("ms per training step (CPU)")
    ax.set_title("Training time per batch against sequence length")
    ax.legend(fontsize=8)
    fig.savefig(plots / "time_per_batch.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("sweep", "train", "report"))
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", type=Path, default=Path("runs/why_attention"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--plots", type=Path, default=None)
    args = ap.parse_intermixed_args()
    os.environ.setdefault("QKV_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "sweep":
        sweep(args.out, args.names or list(SWEEP), args.jobs)
    elif args.command == "train":
        train(args.out, args.names or list(FINAL))
    else:
        report(args.out, args.plots)


if __name__ == "__main__":
    main()
