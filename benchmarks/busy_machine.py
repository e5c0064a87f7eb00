"""A run's share of a busy machine: steps per second of qkv's training step and of decoding,
alone and beside other work, under each CPU-sharing policy (issue 56; :mod:`qkv.cpu_share`).

Scenarios: ``alone``; ``two`` (two qkv runs of the same policy at once: their sum); ``busy1`` /
``busy2`` (beside one or two ``python -c "while True: pass"``); ``tests`` (beside the test suite,
``pytest tests``, as ``make test`` runs it).
Workloads: ``train``: the demo's training step (the translation recipe's model, real Multi30k
batches of its ``max_tokens``; forward, label-smoothed loss, backward, clip, AdamW); ``decode``:
``Translator.translate`` (beam 4, the demo's decoder) of 8 test2016 sentences a step, untrained
weights (every hypothesis runs to the length limit: a fixed amount of work).
Policies (environment of each worker; ``before`` is what qkv did before :mod:`qkv.cpu_share`):
``before`` (``QKV_CPU_SHARE=0``: OpenMP's spin, torch's threads), ``threads-1`` (one thread),
``passive`` (``OMP_WAIT_POLICY=PASSIVE``: no spin), ``spin`` (``GOMP_SPINCOUNT=1000``, threads
fixed), ``default`` (qkv's default: threads from the load, OpenMP's own spin), ``default+spin``
(both).

Each worker builds its workload, warms up, then counts steps from a common start time for
``--seconds``; the ratio is to ``before`` alone. Workers are processes of their own, started
with the policy's environment (OpenMP reads it once, when torch loads).

Run (alone on the machine; ~25 s a cell):
``QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/busy_machine.py [--append]``
A 4-CPU view: ``taskset -c 0-3 .venv/bin/python benchmarks/busy_machine.py ...`` (the workers
and the busy processes inherit the affinity).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
POLICIES = {
    "before": {"QKV_CPU_SHARE": "0"},
    "threads-1": {"QKV_CPU_SHARE": "0", "QKV_THREADS": "1"},
    "passive": {"QKV_CPU_SHARE": "0", "OMP_WAIT_POLICY": "PASSIVE"},
    "spin": {"QKV_CPU_SHARE": "0", "GOMP_SPINCOUNT": "1000"},
    "default": {},
    "default+spin": {"GOMP_SPINCOUNT": "1000"},
}
SCENARIOS = ("alone", "two", "busy1", "busy2", "tests")
BUSY = [sys.executable, "-c", "while True: pass"]
# what the policies must not inherit from the caller's environment
MANAGED = ("QKV_CPU_SHARE", "QKV_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


def train_workload(device: str):
    """One step of the demo's training, on real batches, on ``device``."""
    from dataclasses import replace

    import torch

    sys.path.insert(0, str(HERE))
    from compile_step import step, translation_workload

    from qkv.recipes.translation import TranslationSettings
    from qkv.train.optim import make_optimizer

    model, train, batches, loss_fn = translation_workload(64, TranslationSettings().max_tokens)
    model.to(device).train()
    if device != "cpu":
        batches = [
            replace(b, src=b.src.to(device), tgt_in=b.tgt_in.to(device), tgt_out=b.tgt_out.to(device))
            for b in batches
        ]
    optimizer = make_optimizer(model, train)
    it = iter(range(10**9))

    def one() -> None:
        step(model, model, optimizer, loss_fn, batches[next(it) % len(batches)])
        if device == "cuda":
            torch.cuda.synchronize()

    torch.manual_seed(0)
    return one


def decode_workload(device: str):
    from dataclasses import replace

    from qkv.data.tokenizers import SubwordTokenizer
    from qkv.data.translation import load_multi30k
    from qkv.inference.translator import Translator
    from qkv.models import Transformer
    from qkv.recipes.translation import TranslationSettings

    src, tgt = load_multi30k("train")
    tok = SubwordTokenizer.train(src[:20000] + tgt[:20000], 8000)
    config = replace(TranslationSettings().model_config(tok), max_len=64)
    translator = Translator(Transformer(config).to(device).eval(), tok, beam_size=4, batch_size=8)
    sentences = load_multi30k("test2016")[0][:64]
    it = iter(range(10**9))

    def one() -> None:
        i = next(it) % 8
        translator.translate(sentences[8 * i : 8 * i + 8])

    return one


def worker(workload: str, start_at: float, seconds: float, device: str) -> None:
    """Build ``workload``, warm up, then count steps in ``[start_at, start_at + seconds]``;
    print one JSON line."""
    from qkv.cpu_share import CpuShare

    one = train_workload(device) if workload == "train" else decode_workload(device)
    share = CpuShare()
    share.start(probe_s=0.25)
    for _ in range(3):
        one()
        share.tick(1)
    late = max(0.0, time.time() - start_at)
    while time.time() < start_at:
        one()
        share.tick(1)
    t0, steps = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        one()
        share.tick(1)
        steps += 1
    dt = time.perf_counter() - t0
    print(json.dumps({"steps": steps, "seconds": dt, "rate": steps / dt, "late_s": late, **share.report()}))


def cell(
    policy: dict, scenario: str, workload: str, seconds: float, setup_s: float, device: str = "cpu"
) -> list[dict]:
    """Run one scenario: its qkv workers and the load beside them; the workers' results."""
    env = {k: v for k, v in os.environ.items() if k not in MANAGED} | policy
    load: list[subprocess.Popen] = []
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if scenario.startswith("busy"):
        load = [subprocess.Popen(BUSY, **quiet) for _ in range(int(scenario[-1]))]
    elif scenario == "tests":
        load = [
            subprocess.Popen(
                [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider"],
                cwd=HERE.parent,
                start_new_session=True,
                **quiet,
            )
        ]
    start_at = time.time() + setup_s
    cmd = [sys.executable, __file__, "worker", workload, str(start_at), str(seconds), device]
    n = 2 if scenario == "two" else 1
    workers = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        return [json.loads(w.communicate()[0].strip().splitlines()[-1]) for w in workers]
    finally:
        for p in load:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9) if scenario == "tests" else p.kill()
            p.wait()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", nargs="+", default=["train", "decode"], choices=["train", "decode"])
    p.add_argument("--policies", nargs="+", default=["before", "default"], choices=list(POLICIES))
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per cell")
    p.add_argument("--setup", type=float, default=25.0, help="seconds for the workers to build and warm up")
    p.add_argument("--device", default="cpu", help="cpu or cuda (two runs then share the GPU too)")
    p.add_argument("--out", type=Path, help="append the table (markdown) to this file")
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    from common import machine

    cpus = len(os.sched_getaffinity(0))
    lines = [
        f"machine: {machine()}; {cpus} CPUs in this process's affinity; device {args.device}; "
        f"{args.seconds:g} s per cell",
        "",
        "| workload | policy | scenario | steps/s (each run) | threads (each run, first to last) | "
        "sum / before alone |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for workload in args.workloads:
        base = None
        for name in args.policies:
            for scenario in args.scenarios:
                results = cell(POLICIES[name], scenario, workload, args.seconds, args.setup, args.device)
                total = sum(r["rate"] for r in results)
                if name == "before" and scenario == "alone":
                    base = total
                ratio = f"**{100 * total / base:.0f} %**" if base else "-"
                rates = ", ".join(f"{r['rate']:.2f}" for r in results)
                threads = "; ".join("→".join(map(str, r.get("threads", []))) for r in results)
                row = f"| {workload} | {name} | {scenario} | {rates} | {threads} | {ratio} |"
                lines.append(row)
                print(row, flush=True)
    if args.out:
        with args.out.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
