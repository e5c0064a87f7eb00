"""Exact resume under SIGKILL: kill a real training run at random moments, resume it with
``--resume``, and check that it ends with the same weights as a run never interrupted.

What runs: ``qkv train lm`` on the real tiny-shakespeare characters (``$QKV_DATA_DIR``), a small
model with dropout 0.1 (so the RNG state matters), a step budget, fp32, one CPU thread, a
checkpoint every ``--eval-every`` steps. First one uninterrupted reference run, timed, with the
moment its first checkpoint appeared (training under way: before it the process is still
importing torch and tokenizing); then, for each trial, a fresh run killed with SIGKILL after a
random delay drawn uniformly from (that moment, the reference's wall time), so the kills land
while it trains, validates, checkpoints or writes its summary, then ``--resume``d (again and again
if it is killed before its first checkpoint: such a run is refused with a clear message and
started afresh, as a user would).
A trial passes when every tensor of its final ``last.safetensors`` equals the reference's
bit for bit.

Run (from the repository root; ``tests/test_fault_tolerance.py`` runs a 2-trial version):
    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/kill_resume.py --trials 10
Exit status 0 when every trial is bit-identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

SETTINGS = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_layers=2",
    "model.dropout=0.1",
    "model.max_len=32",
    "batch_size=8",
    "eval_batches=2",
    "num_samples=1",
    "sample_tokens=8",
    "train.threads=1",
    "train.precision=fp32",
    "train.warmup_steps=10",
    "train.snapshot_minutes=1000",
]


def command(out: Path, steps: int, eval_every: int, resume: bool, data: Path | None = None) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qkv",
        "train",
        "lm",
        "--out",
        str(out),
        "--quiet",
        f"train.max_steps={steps}",
        f"train.eval_every={eval_every}",
        *SETTINGS,
        *([f"data={data}"] if data else []),
        *(["--resume"] if resume else []),
    ]


def run(
    cmd: list[str], kill_after: float | None = None, watch: Path | None = None
) -> tuple[int, str, float, float | None]:
    """Run ``cmd``; with ``kill_after`` seconds, SIGKILL it then if still running (checked every
    10 ms). Returns (exit status, stderr, seconds it ran, seconds until ``watch`` first existed
    or ``None``); a killed process has status -9."""
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        seen = None
        while proc.poll() is None:
            elapsed = time.perf_counter() - t
            if watch is not None and seen is None and watch.exists():
                seen = elapsed
            if kill_after is not None and elapsed >= kill_after:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.01)
        wall = time.perf_counter() - t
        err.seek(0)
        return proc.returncode, err.read(), wall, seen


def same_weights(a: Path, b: Path) -> tuple[bool, str]:
    x, y = load_file(str(a)), load_file(str(b))
    if x.keys() != y.keys():
        return False, "different tensor names"
    for k in x:
        if not torch.equal(x[k], y[k]):
            return False, f"{k} differs (max |diff| {(x[k] - y[k]).abs().max().item():.3g})"
    return True, "bit-identical"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="of the kill times")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument(
        "--shards",
        action="store_true",
        help="train from token shards (qkv prepare lm, 100,000 tokens per shard: windows cross shards)",
    )
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="kill_resume_"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    data = None
    if args.shards:
        data = work / "shards"
        shutil.rmtree(data, ignore_errors=True)
        prepare = [sys.executable, "-m", "qkv", "prepare", "lm", "tinyshakespeare", "--out", str(data)]
        subprocess.run([*prepare, "--quiet", "--shard-tokens", "100000"], check=True, capture_output=True)

    def cmd(out: Path, resume: bool) -> list[str]:
        return command(out, args.steps, args.eval_every, resume, data)

    ref = work / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    code, err, wall, first = run(cmd(ref, False), watch=ref / "train_state.pt")
    first = wall if first is None else first
    if code != 0:
        print(f"reference run failed ({code}): {err.strip()[-500:]}", file=sys.stderr)
        return 1
    print(
        f"reference: {args.steps} steps in {wall:.1f} s (process start included; first checkpoint "
        f"at {first:.1f} s); kill moments drawn from ({first:.1f} s, {wall:.1f} s)"
    )

    passed = 0
    for trial in range(args.trials):
        out = work / f"trial_{trial}"
        shutil.rmtree(out, ignore_errors=True)
        delay = rng.uniform(first, wall)
        code = run(cmd(out, False), kill_after=delay)[0]
        killed_at = "after the end" if code == 0 else "?"
        if code != 0:
            state = out / "train_state.pt"
            killed_at = (
                f"step {torch.load(state, weights_only=True)['loop']['step']}"
                if state.is_file()
                else "before the first checkpoint"
            )
        restarts = 0
        while code != 0:
            code, err = run(cmd(out, True))[:2]
            if code == 2 and "nothing to resume" in err:  # killed before its first checkpoint
                restarts += 1
                shutil.rmtree(out, ignore_errors=True)
                code, err = run(cmd(out, False))[:2]
            if code != 0:
                print(f"trial {trial}: the resumed run failed ({code}): {err.strip()[-300:]}")
                break
        ok, why = (
            same_weights(ref / "last.safetensors", out / "last.safetensors")
            if code == 0
            else (False, "did not finish")
        )
        passed += ok
        print(
            f"trial {trial}: SIGKILL after {delay:.2f} s (last checkpoint: {killed_at}"
            f"{f', started afresh {restarts}x' if restarts else ''}) -> {why}"
        )
    print(f"{passed} of {args.trials} killed-and-resumed runs end bit-identical to the reference")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
