"""The lecture's race where it is decided (issue 72): BLEU against training budget for the demo
Transformer (``qkv train translation``) and the attention GRU (``qkv train translation-rnn``),
at budgets of CPU-minutes on 2 cores, scored on validation and test2016 (sacreBLEU cased, beam 4
and each recipe's length penalty), overall and by source length.

A budget is a step budget: each recipe's steps per minute in a real timed run on 2 cores
(``calibrate``: ``train.max_minutes`` = ``--calibrate-minutes``, the machine alone), times the
budget's minutes. A step budget is the same training on any machine and beside any other work,
so the runs can go at once on CPUs of their own (``--parallel``, ``--cpus``, each pinned to its
CPUs and threads) and still stand for 2-core minutes. Each run's rate decays linearly to 0 at its
own end (the recipes' schedule), so every budget is a run of its own, not a point on a longer
run. A calibration run is also its recipe's point at that budget and seed: there the step
budget is checked against the clock. Finished runs are kept: ``run`` trains what is missing,
then ``report``s (the table, ``race_curve.json``, the figure) on the models it was given.

    export QKV_DATA_DIR=../shared/data
    python benchmarks/race_curve.py run --out runs/race_curve --minutes 5 10 20 40 \
        --seeds 1 2 3 --seeds-at 20 --plot docs/img/why_attention/race_curve.png
    python benchmarks/race_curve.py report --out runs/race_curve --minutes 5 10 20 40 \
        --seeds 1 2 3 --seeds-at 20   # the table again, from the kept runs

(three seeds at 20 minutes, where one seed left the two level; one elsewhere.)

``--models translation-reg`` adds the demo Transformer with dropout and label smoothing back.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import machine, mean_se, scored  # noqa: E402  (benchmarks/common.py)

RECIPES = ("translation", "translation-rnn")  # each calibrated by its own timed run
# name -> (recipe, its settings, label): the race's two, and the demo Transformer with §5.4's
# regularisers back (dropout 0.1 and label smoothing 0.1, as the 1-hour recipe; opt-in:
# ``--models``), on the demo's step budgets (its dropout masks make its steps a little dearer)
MODELS = {
    "translation": ("translation", [], "Transformer (make demo)"),
    "translation-rnn": ("translation-rnn", [], "GRU + attention"),
    "translation-reg": (
        "translation",
        [f"model.{k}=0.1" for k in ("dropout", "attention_dropout", "activation_dropout")]
        + ["label_smoothing=0.1"],
        "Transformer, dropout + label smoothing 0.1",
    ),
}
COLORS = {"translation": "C0", "translation-rnn": "C1", "translation-reg": "C2"}
SPLITS = ("val", "test2016")


def _pinned(cmd: list[str], cpus: list[int], log: Path) -> None:
    """Run ``cmd`` on ``cpus`` (its affinity), its output appended to ``log``.

    Raises:
        RuntimeError: it failed (``log`` says why).
    """
    with log.open("a") as f:
        done = subprocess.run(cmd, stdout=f, stderr=f, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:5])} ... failed (exit {done.returncode}): see {log}")


def _train(recipe: str, run_dir: Path, cpus: list[int], settings: list[str]) -> None:
    """``qkv train RECIPE`` into ``run_dir`` on ``cpus``, unless it finished."""
    if not (run_dir / "summary.json").is_file():
        cmd = [sys.executable, "-m", "qkv", "train", recipe, "--out", str(run_dir), "--quiet", *settings]
        _pinned(cmd, cpus, run_dir.parent / f"{run_dir.name}.log")


def calibrate(args: argparse.Namespace) -> dict:
    """Each recipe's steps per 2-core minute, from a timed run of ``--calibrate-minutes``
    (``calibration.json``; measured once, on the machine alone)."""
    path = args.out / "calibration.json"
    if path.is_file():
        return json.loads(path.read_text())
    cpus = sorted(os.sched_getaffinity(0))[:2]
    rates = {}
    for recipe in RECIPES:
        run_dir = args.out / _name(recipe, args.calibrate_minutes, args.seeds[0])
        settings = [f"train.seed={args.seeds[0]}", f"train.max_minutes={args.calibrate_minutes}"]
        _train(recipe, run_dir, cpus, settings)
        steps = json.loads((run_dir / "summary.json").read_text())["steps"]
        rates[recipe] = {"steps": steps, "minutes": args.calibrate_minutes, "run": run_dir.name}
    calibration = {"machine": machine(), "cpus": cpus, "recipes": rates}
    path.write_text(json.dumps(calibration, indent=1) + "\n")
    return calibration


def _name(recipe: str, minutes: float, seed: int) -> str:
    return f"{recipe}-{minutes:g}min-seed{seed}"


def steps_for(calibration: dict, recipe: str, minutes: float) -> int:
    """The step budget of ``minutes`` 2-core minutes of ``recipe``."""
    c = calibration["recipes"][recipe]
    return round(c["steps"] * minutes / c["minutes"])


def seeds_for(args: argparse.Namespace, minutes: float) -> list[int]:
    """Every ``--seeds`` at the budgets of ``--seeds-at`` (all budgets when it is not given), the
    first seed elsewhere: seeds where the race is close, one run where it is not."""
    return args.seeds if args.seeds_at is None or minutes in args.seeds_at else args.seeds[:1]


def run(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    calibration = calibrate(args)
    free = sorted(os.sched_getaffinity(0))
    slots = [free[i * args.cpus : (i + 1) * args.cpus] for i in range(args.parallel)]
    if any(len(s) < args.cpus for s in slots):
        raise SystemExit(f"{args.parallel} runs of {args.cpus} CPUs need {args.parallel * args.cpus}: {free}")
    # the longest first, so that the runs at once end together
    jobs = sorted(
        ((m, s, name) for m in args.minutes for s in seeds_for(args, m) for name in args.models),
        key=lambda j: -steps_for(calibration, MODELS[j[2]][0], j[0]),
    )

    def one(i: int) -> None:
        minutes, seed, name = jobs[i]
        recipe, model_settings, _ = MODELS[name]
        run_dir = args.out / _name(name, minutes, seed)
        log = args.out / f"{run_dir.name}.log"
        settings = [
            f"train.seed={seed}",
            "train.max_minutes=null",
            f"train.max_steps={steps_for(calibration, recipe, minutes)}",
            f"train.threads={args.cpus}",
            "test=false",  # the report scores both splits, by length
            *model_settings,
        ]
        cpus = free_slots.get()  # the CPUs no other run holds now
        try:
            _train(recipe, run_dir, cpus, settings)
            if not (run_dir / "scores.json").is_file():  # scored on the same CPUs, as it ends
                _pinned([sys.executable, __file__, "score", "--out", str(run_dir)], cpus, log)
        finally:
            free_slots.put(cpus)

    free_slots: queue.Queue[list[int]] = queue.Queue()
    for slot in slots:
        free_slots.put(slot)
    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(one, range(len(jobs))))
    report(args)


def score(run_dir: Path) -> dict:
    """Validation and test2016 sacreBLEU (cased) and chrF of a run's selected weights, with the
    run's own beam and length penalty, overall and by source length (``scores.json``, kept)."""
    path = run_dir / "scores.json"
    if path.is_file():
        return json.loads(path.read_text())
    from qkv.data.translation import load_multi30k
    from qkv.inference.translator import Translator, run_decoding_of
    from qkv.runs.info import run_settings

    beam_size, alpha = run_decoding_of(run_settings(run_dir))
    translator = Translator.from_run(run_dir, beam_size=beam_size, alpha=alpha)
    result: dict = {"beam_size": beam_size, "alpha": alpha}
    for split in SPLITS:
        src, ref = load_multi30k(split)
        result[split] = scored(src, translator.translate(src), ref)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return result


def collect(args: argparse.Namespace) -> list[dict]:
    """One row per recipe and budget with finished runs: steps, wall minutes, the scores of each
    seed, and mean ± s.e. over the seeds."""
    rows = []
    for minutes in args.minutes:
        for name in args.models:
            label = MODELS[name][2]
            runs = [args.out / _name(name, minutes, s) for s in seeds_for(args, minutes)]
            runs = [r for r in runs if (r / "summary.json").is_file()]
            if not runs:
                continue
            print(f"scoring {minutes:g} min of {name} ({len(runs)} seeds) ...", file=sys.stderr, flush=True)
            scores = [score(r) for r in runs]
            summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
            row = {
                "model": name,
                "label": label,
                "minutes": minutes,
                "seeds": len(runs),
                "steps": [s["steps"] for s in summaries],
                "wall_minutes": [round(s["train_minutes"], 1) for s in summaries],
                "weights": [s.get("selected_weights") for s in summaries],
            }
            for split in SPLITS:
                row[split] = mean_se([s[split]["bleu"] for s in scores])
                buckets = scores[0][split]["by_length"]
                row[f"{split}_by_length"] = {
                    b: mean_se([s[split]["by_length"][b]["bleu"] for s in scores]) for b in buckets
                }
            row["n_by_length"] = {b: v["n"] for b, v in scores[0]["test2016"]["by_length"].items()}
            rows.append(row)
    return rows


def markdown(rows: list[dict], calibration: dict) -> str:
    buckets = list(rows[0]["n_by_length"]) if rows else []
    head = "| 2-core minutes | model | seeds | steps | validation BLEU | test2016 BLEU | "
    lines = [
        head + " | ".join(f"test2016, {b} words" for b in buckets) + " |",
        "|---|---|---|---|---|---|" + "---|" * len(buckets),
    ]
    for r in rows:
        cells = [
            f"{m:.2f} ± {se:.2f}" if r["seeds"] > 1 else f"{m:.2f}" for m, se in (r["val"], r["test2016"])
        ]
        by_len = [f"{r['test2016_by_length'][b][0]:.2f}" for b in buckets]
        lines.append(
            f"| {r['minutes']:g} | {r['label']} | {r['seeds']} | {'/'.join(map(str, r['steps']))} | "
            + " | ".join(cells + by_len)
            + " |"
        )
    c = calibration["recipes"]
    lines.append(
        "\nCalibration (steps in a timed run on 2 cores, alone): "
        + "; ".join(f"{r}: {v['steps']} steps in {v['minutes']:g} min" for r, v in c.items())
        + f". Machine: {calibration['machine']}. Sentences per bucket: "
        + ", ".join(f"{b}: {n}" for b, n in (rows[0]["n_by_length"].items() if rows else ()))
        + "."
    )
    return "\n".join(lines)


def draw(rows: list[dict], path: Path) -> None:
    """Test2016 and validation BLEU against budget (log scale), one curve per model, error bars
    the standard error over seeds; beside it, the Transformer's lead by source length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, lead) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, (_, _, label) in MODELS.items():
        mine = [r for r in rows if r["model"] == name]
        if not mine:
            continue
        for split, style in (("test2016", "-o"), ("val", ":s")):
            ax.errorbar(
                [r["minutes"] for r in mine],
                [r[split][0] for r in mine],
                yerr=[r[split][1] for r in mine],
                fmt=style,
                capsize=3,
                color=COLORS[name],
                label=f"{label}, {'test2016' if split == 'test2016' else 'validation'}",
            )
    minutes = sorted({r["minutes"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(minutes, [f"{m:g}" for m in minutes])
    ax.set_xlabel("training budget (minutes on 2 CPU cores)")
    ax.set_ylabel("BLEU (sacreBLEU, cased, beam 4)")
    seeds = {r["minutes"]: r["seeds"] for r in rows}
    ax.set_title(
        "seeds (error bars: s.e.): " + ", ".join(f"{m:g} min {seeds[m]}" for m in minutes), fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    at = {(r["model"], r["minutes"]): r for r in rows}
    pairs = {
        m: (at[RECIPES[0], m], at[RECIPES[1], m]) for m in minutes if {(n, m) for n in RECIPES} <= set(at)
    }
    budgets = sorted(pairs)
    for k, bucket in enumerate(rows[0]["n_by_length"] if rows else ()):
        leads = [
            t["test2016_by_length"][bucket][0] - g["test2016_by_length"][bucket][0] for t, g in pairs.values()
        ]
        lead.plot(budgets, leads, "-o", color=plt.cm.viridis(k / 4), label=f"{bucket} words")
    lead.axhline(0, color="grey", lw=1)
    lead.set_xscale("log", base=2)
    lead.set_xticks(budgets, [f"{m:g}" for m in budgets])
    lead.set_xlabel("training budget (minutes on 2 CPU cores)")
    lead.set_ylabel("Transformer − GRU, test2016 BLEU")
    lead.set_title("the lead by source length", fontsize=10)
    lead.grid(alpha=0.3)
    lead.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(args: argparse.Namespace) -> None:
    calibration = json.loads((args.out / "calibration.json").read_text())
    rows = collect(args)
    result = {"calibration": calibration, "rows": rows}
    (args.out / "race_curve.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(rows, calibration)
    (args.out / "race_curve.md").write_text(text + "\n")
    print(text)
    if args.plot is not None and rows:
        draw(rows, args.plot)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("run", "report", "score"), help="score: one run (--out)")
    p.add_argument("--out", type=Path, default=Path("runs/race_curve"))
    p.add_argument("--minutes", type=float, nargs="+", default=[5, 10, 20, 40, 80], help="budgets")
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument(
        "--seeds-at", type=float, nargs="+", help="budgets given every seed (default: all); others the first"
    )
    p.add_argument("--calibrate-minutes", type=float, default=5.0)
    p.add_argument("--cpus", type=int, default=1, help="CPUs (and threads) of each step-budget run")
    p.add_argument("--parallel", type=int, default=2, help="runs at once, each on CPUs of its own")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(RECIPES))
    p.add_argument("--plot", type=Path, help="write the figure here (PNG)")
    args = p.parse_args()
    if args.command == "score":
        import torch

        torch.set_num_threads(len(os.sched_getaffinity(0)))
        score(args.out)
    else:
        run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
