"""The sweeps behind the Multi30k de→en recipes (issue 30): the 10-minute demo (``make demo``)
and the 2-hour recipe (``configs/multi30k_de_en_2h.json``), chosen on *validation* BLEU on 2
CPU cores; and validation BLEU against minutes of a real run, plotted.

Subcommands (each writes under ``--out``):

    sweep BUDGET [NAME ...]  candidates of one budget (``demo`` or ``2h``), two at a time on one
                             thread each, every one a *proxy* of the real run: the same recipe with
                             a shorter (or equal) time budget on one thread, its learning rate
                             decaying to 0 at the proxy's end. Prints and writes ``BUDGET.md``;
                             test data is never scored (``test=false``).
    curve RUN ... --plot PNG validation BLEU (greedy, sacreBLEU cased) of each run against its
                             minutes of training, from the run's ``metrics.jsonl``: one line per
                             run, and the BLEU reached at 5, 10, 30, 60 and 120 minutes.
    beam RUN                 validation BLEU of a finished run's weights for each beam size and
                             length penalty α of ``BEAMS`` (the decoding the recipe's test uses).

    QKV_DATA_DIR=../shared/data python benchmarks/multi30k_sweep.py sweep demo --out runs/m30k
    QKV_DATA_DIR=../shared/data python benchmarks/multi30k_sweep.py curve runs/demo runs/2h \
        --plot docs/img/multi30k/bleu_minutes.png

A proxy is calibrated by its ranking: the candidates the real runs (2 threads, the full budget)
score, ordered as their proxies were (``benchmarks/HISTORY.md``, issue 30).
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import metrics, sweep_table, train_run, validation_row  # noqa: E402  (benchmarks/common.py)

ROTARY = ["model.positional=rotary"]
NO_DROPOUT = ["model.dropout=0", "model.attention_dropout=0", "model.activation_dropout=0"]
# budget -> (proxy minutes on one thread, validation every N steps, {name: overrides of the
# demo recipe's defaults}). Later rounds follow what the earlier ones found.
BUDGETS: dict[str, tuple[float, int, dict[str, list[str]]]] = {
    "demo": (
        10.0,
        300,
        {
            # round 1: the rate that the RNNs wanted higher (1e-2) does not carry over
            "demo_before": [],  # the recipe before issue 30 (lr 2e-3)
            "lr4e-3": ["train.lr=4e-3"],
            # round 2: a faster step (no dropout masks; a smaller softmax)
            "nodrop": NO_DROPOUT,
            "bpe6000": ["vocab_size=6000"],
            # round 3: around the faster step
            "nodrop_mt768": [*NO_DROPOUT, "max_tokens=768"],
            "nodrop_ls0": [*NO_DROPOUT, "label_smoothing=0"],
        },
    ),
    "2h": (
        30.0,
        1000,
        {
            # round 1: width at the demo's settings (lr 2e-3, dropout 0.1)
            "d192": [],
            "d256": ["model.d_model=256", "model.d_ff=1024"],
            # round 2: does dropout pay over many epochs? A quarter of the training pairs, so a
            # 30-minute proxy sees as many epochs (~25) as the 2-hour run sees of all of them
            "quarter_drop0.1": ["train_limit=7250", "train.eval_every=500"],
            "quarter_nodrop": ["train_limit=7250", "train.eval_every=500", *NO_DROPOUT],
        },
    ),
    # issue 47: what each step of the demo learns, on an accelerator. Every candidate gets the
    # optimizer steps that it makes in the demo's 10 minutes on 2 CPU cores (its step cost
    # measured there against the demo's), its rate decaying to 0 at the last one; many run at
    # once on one GPU, so minutes mean nothing here (None: a step budget, no time budget).
    "race": (
        None,
        700,
        {
            "base": ["train.max_steps=2795"],  # 0.195 s/step; validations take ~55 s of the 600
            "rotary": ["train.max_steps=2595", "model.positional=rotary"],  # 0.210 s/step
            "lr1e-3": ["train.max_steps=2795", "train.lr=1e-3"],
            "lr3e-3": ["train.max_steps=2795", "train.lr=3e-3", "train.warmup_steps=200"],
            "bpe5000": ["train.max_steps=3205", "vocab_size=5000"],  # 0.170 s/step
            "enc4dec2": ["train.max_steps=2795", "model.n_encoder_layers=4", "model.n_decoder_layers=2"],
            "d256": ["train.max_steps=1847", "model.d_model=256", "model.d_ff=1024"],  # 0.295 s/step
            "postln": ["train.max_steps=2795", "model.norm_first=false"],
            "gelu": ["train.max_steps=2795", "model.activation=gelu"],
            "mt768": ["train.max_steps=3205", "max_tokens=768"],  # 0.170 s/step
            # round 2: around rotary positions, the one change that paid (+2.7)
            "rotary_s2": ["train.max_steps=2595", *ROTARY, "train.seed=2"],  # the seed's noise
            "rotary_gelu": ["train.max_steps=2595", *ROTARY, "model.activation=gelu"],
            "rotary_mt768": ["train.max_steps=2946", *ROTARY, "max_tokens=768"],
            "rotary_lr1.5e-3": ["train.max_steps=2595", *ROTARY, "train.lr=1.5e-3"],
            "rotary_lr2.5e-3": ["train.max_steps=2595", *ROTARY, "train.lr=2.5e-3", "train.warmup_steps=200"],
            "rotary_w400": ["train.max_steps=2595", *ROTARY, "train.warmup_steps=400"],
            "rotary_h8": ["train.max_steps=2477", *ROTARY, "model.n_heads=8"],
            "rotary_enc4dec2": [
                "train.max_steps=2595",
                *ROTARY,
                "model.n_encoder_layers=4",
                "model.n_decoder_layers=2",
            ],
            "rotary_ff1024": ["train.max_steps=2370", *ROTARY, "model.d_ff=1024"],
            "rotary_bpe6000": ["train.max_steps=2725", *ROTARY, "vocab_size=6000"],
            # round 3: the three within the noise of rotary (seed 2 lost 0.5), together and reseeded
            "rotary_s3": ["train.max_steps=2595", *ROTARY, "train.seed=3"],
            "rotary_gelu_s2": ["train.max_steps=2595", *ROTARY, "model.activation=gelu", "train.seed=2"],
            "rotary_w400_s2": ["train.max_steps=2595", *ROTARY, "train.warmup_steps=400", "train.seed=2"],
            "rotary_bpe6000_s2": ["train.max_steps=2725", *ROTARY, "vocab_size=6000", "train.seed=2"],
            "rotary_gelu_w400": [
                "train.max_steps=2595",
                *ROTARY,
                "model.activation=gelu",
                "train.warmup_steps=400",
            ],
            "rotary_bpe6000_w400": [
                "train.max_steps=2725",
                *ROTARY,
                "vocab_size=6000",
                "train.warmup_steps=400",
            ],
            "rotary_all3": [
                "train.max_steps=2725",
                *ROTARY,
                "vocab_size=6000",
                "train.warmup_steps=400",
                "model.activation=gelu",
            ],
        },
    ),
}


def sweep(budget: str, out: Path, names: list[str], jobs: int, device: str) -> None:
    minutes, eval_every, candidates = BUDGETS[budget]

    def one(name: str) -> None:
        proxy = [
            f"train.max_minutes={minutes or 'null'}",
            "train.threads=1",
            f"train.eval_every={eval_every}",
        ]
        proxy += ["test=false", f"train.device={device}"]
        # the candidate's settings come last: a candidate may set its own eval_every
        train_run("translation", out / budget / name, [*proxy, *candidates[name]])

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, names or list(candidates)))
    # the table holds every candidate of the budget trained so far, this round's and earlier
    done = [n for n in candidates if (out / budget / n / "summary.json").is_file()]
    rows = [validation_row(n, out / budget / n, candidates[n]) for n in done]
    table = sweep_table(sorted(rows, key=lambda r: -r["val_bleu"]), minutes)
    (out / f"{budget}.md").write_text(table + "\n")
    print(table)


MARKS = (5, 10, 30, 60, 120)  # minutes of training a user may have


def curve(runs: list[Path], plot: Path | None) -> None:
    """Validation BLEU against minutes of training, one line per run; the BLEU reached by each
    mark in ``MARKS`` (the best validation at or before it, 2 % of slack for a validation that
    lands just past a round minute)."""
    series = {}
    for run in runs:
        points = [(r["elapsed_min"], r["val_bleu"]) for r in metrics(run) if "val_bleu" in r]
        series[run.name] = points
        last = points[-1][0] + 0.5  # a run says nothing of minutes past its end
        reached = {m: max((b for t, b in points if t <= 1.02 * m), default=None) for m in MARKS if m <= last}
        print(f"{run.name}: " + ", ".join(f"{m} min {b:.2f}" for m, b in reached.items() if b is not None))
    if plot is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in series.items():
        ax.plot([t for t, _ in points], [b for _, b in points], marker=".", label=name)
    ax.set_xlabel("minutes of training (2 CPU threads)")
    ax.set_ylabel("validation BLEU (greedy, sacreBLEU cased)")
    ax.set_title("Multi30k de→en: what the minutes buy")
    ax.grid(alpha=0.3)
    ax.legend()
    plot.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(plot, dpi=120)


BEAMS = ((4, 0.6), (4, 1.0), (6, 0.6), (6, 1.0), (8, 1.0))  # (beam_size, alpha); the recipe's is first


def beam(run: Path) -> None:
    """Validation BLEU of ``run`` for each (beam size, α) of ``BEAMS``."""
    from qkv.recipes.translation import evaluate_run

    for size, alpha in BEAMS:
        scores = evaluate_run(run, "val", beam_size=size, alpha=alpha)
        print(
            f"beam {size}, alpha {alpha}: validation BLEU {scores['bleu']:.2f} ({scores['decode_seconds']} s)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sw = sub.add_parser("sweep")
    sw.add_argument("budget", choices=list(BUDGETS))
    sw.add_argument("names", nargs="*")
    sw.add_argument("--out", type=Path, default=Path("runs/m30k"))
    sw.add_argument("--jobs", type=int, default=2)
    sw.add_argument(
        "--device", default="cpu", help="cuda: the step-budget candidates of 'race', many at once"
    )
    cu = sub.add_parser("curve")
    cu.add_argument("runs", nargs="+", type=Path)
    cu.add_argument("--plot", type=Path)
    be = sub.add_parser("beam")
    be.add_argument("run", type=Path)
    args = ap.parse_args()
    os.environ.setdefault("QKV_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    if args.command == "sweep":
        sweep(args.budget, args.out, args.names, args.jobs, args.device)
    elif args.command == "beam":
        beam(args.run)
    else:
        curve(args.runs, args.plot)


if __name__ == "__main__":
    main()
