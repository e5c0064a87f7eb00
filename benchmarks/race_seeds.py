"""The 10-minute race decided beyond one run's noise (issue 56): ``make demo``'s recipe
(``qkv train translation``) against the attention GRU (``qkv train translation-rnn``), each with
several seeds (``train.seed``), 10 minutes of training each; test2016 sacreBLEU (cased) and the
selected weights' validation BLEU as mean ± standard error over the seeds.

Each run gets ``--cpus`` CPUs of its own (its affinity; the runs' CPU sets do not overlap) and
``--parallel`` runs go at once: on a machine with 12 free CPUs, six 2-CPU runs at once are six
quiet 2-core laptops (they share memory bandwidth and the last-level cache, nothing else). On a
2-core machine: ``--parallel 1`` (one after the other, about 65 minutes for 3 seeds).

    QKV_DATA_DIR=../shared/data python benchmarks/race_seeds.py run --out runs/race [--parallel 6]
    python benchmarks/race_seeds.py report --out runs/race
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import mean_se  # noqa: E402  (benchmarks/common.py)

RECIPES = {"transformer (make demo)": "translation", "GRU + attention": "translation-rnn"}


def _run(recipe: str, seed: int, run_dir: Path, cpus: list[int], extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "qkv", "train", recipe, "--out", str(run_dir), "--quiet", "--json"]
    cmd += [f"train.seed={seed}", *extra]
    t0 = time.time()
    with (run_dir.parent / f"{run_dir.name}.log").open("w") as log:
        done = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, cpus),
        )
    return {"run": run_dir.name, "exit": done.returncode, "wall_s": round(time.time() - t0, 1), "cpus": cpus}


def run(args: argparse.Namespace) -> None:
    free = sorted(os.sched_getaffinity(0))[args.skip_cpus :]
    slots = [free[i * args.cpus : (i + 1) * args.cpus] for i in range(args.parallel)]
    if any(len(s) < args.cpus for s in slots):
        raise SystemExit(
            f"{args.parallel} runs of {args.cpus} CPUs need {args.parallel * args.cpus} CPUs: {free}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, seed) for seed in args.seeds for name in RECIPES]  # the recipes alternate
    extra = [f"train.max_minutes={args.minutes}", *args.overrides]

    def one(i: int) -> dict:
        name, seed = jobs[i]
        slot = slots[i % args.parallel]
        return _run(RECIPES[name], seed, args.out / f"{RECIPES[name]}-seed{seed}", slot, extra)

    with ThreadPoolExecutor(args.parallel) as pool:
        done = list(pool.map(one, range(len(jobs))))
    (args.out / "runs.json").write_text(json.dumps(done, indent=1))
    report(args)


def _mean_se(values: list[float]) -> str:
    values = [v for v in values if v == v]  # a run without the split: NaN
    if not values:
        return "-"
    m, se = mean_se(values)
    return f"**{m:.2f} ± {se:.2f}**"


def report(args: argparse.Namespace) -> None:
    lines = [
        "| recipe | seed | steps | validation BLEU | test2016 BLEU | chrF | CPU share |",
        "|---|---|---|---|---|---|---|",
    ]
    means = []
    for name, recipe in RECIPES.items():
        tests, vals = [], []
        for seed in args.seeds:
            path = args.out / f"{recipe}-seed{seed}" / "summary.json"
            if not path.is_file():
                lines.append(f"| {name} | {seed} | did not finish | | | | |")
                continue
            s = json.loads(path.read_text())
            test = s.get("test2016", {"bleu": float("nan"), "chrf": float("nan")})
            val = s["validation"].get("val_bleu", float("nan"))
            tests.append(test["bleu"])
            vals.append(val)
            share = s.get("cpu_share", {})
            lines.append(
                f"| {name} | {seed} | {s['steps']} | {val:.2f} | {test['bleu']:.2f} | {test['chrf']:.2f} | "
                f"{share.get('quiet_share', '-')} (others {share.get('others_cpus', '-')} CPUs) |"
            )
        means.append(
            f"| {name} | mean ± s.e. ({len(tests)} seeds) | | {_mean_se(vals)} | {_mean_se(tests)} | | |"
        )
    print("\n".join(lines + means))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("run", "report"))
    p.add_argument("--out", type=Path, default=Path("runs/race"))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--cpus", type=int, default=2, help="CPUs of each run")
    p.add_argument("--parallel", type=int, default=1, help="runs at once, each on CPUs of its own")
    p.add_argument(
        "--skip-cpus", type=int, default=0, help="leave the first N CPUs of the affinity to others"
    )
    p.add_argument("overrides", nargs="*", help="key=value settings of every run (e.g. train.device=cpu)")
    args = p.parse_intermixed_args()
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
