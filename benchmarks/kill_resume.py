"""Exact resume under SIGKILL: kill a real training run at random moments, resume it with
``--resume``, and check that it ends with the same weights as a run never interrupted.

What runs: ``qkv train lm`` on the real tiny-shakespeare characters (``$QKV_DATA_DIR``), a small
model with dropout 0.1 (so the RNG state matters), a step budget, fp32, one CPU thread, a
checkpoint every ``--eval-every`` steps. First one uninterrupted reference run, timed, with the
moment its first checkpoint appeared (training under way: before it the process is still
importing torch and tokenizing); then, for each trial, a fresh run killed with SIGKILL after a
random delay drawn uniformly from (that moment, the moment the reference wrote its last
checkpoint), so the kills land while it trains, validates or checkpoints (``--window whole``: up
to the reference's end, so also while it writes its samples and summary), then ``--resume``d
(again and again if it is killed before its first checkpoint: such a run is refused with a clear
message and started afresh, as a user would). ``--copy``: each run is made with a relative
``--out`` (``trial_N``, snapshots every 0.3 s, one kept, so a resumed run prunes snapshots all
along); once killed it is copied (``cp -r trial_N copies/trial_N``) and the copy is resumed
(``--out copies/trial_N``, from the same directory, where the recorded ``trial_N/...`` paths of
earlier versions named the original's files); the original must stay byte-identical.
A trial passes when every tensor of its final ``last.safetensors`` equals the reference's
bit for bit (and, with ``--copy``, the original is untouched).

Run (from the repository root; ``tests/test_fault_tolerance.py`` runs a 2-trial version):
    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/kill_resume.py --trials 10 --steps 3000
    (at 600 steps, training is over in about 2 s: ``--window whole`` kills mostly land after it)
Exit status 0 when every trial is bit-identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
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
    cmd: list[str], kill_after: float | None = None, watch: Path | None = None, cwd: Path | None = None
) -> tuple[int, str, float, float | None]:
    """Run ``cmd`` (in ``cwd``); with ``kill_after`` seconds, SIGKILL it then if still running
    (checked every 10 ms). Returns (exit status, stderr, seconds it ran, seconds until ``watch``
    first existed or ``None``); a killed process has status -9."""
    with tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=cwd)
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


def digest(run_dir: Path) -> dict[str, str]:
    """Every file under ``run_dir`` → SHA-256 of its bytes."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


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
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0, help="of the kill times")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument(
        "--shards",
        action="store_true",
        help="train from token shards (qkv prepare lm, 100,000 tokens per shard: windows cross shards)",
    )
    ap.add_argument(
        "--window",
        choices=("training", "whole"),
        default="training",
        help="kill moments drawn from the reference's training (its first to its last checkpoint: "
        "every kill lands between checkpoints) or from its whole run (the samples and the summary too)",
    )
    ap.add_argument(
        "--copy",
        action="store_true",
        help="resume a copy of each killed run (made with a relative --out, copied with cp -r) instead "
        "of the run itself; the original must stay byte-identical. Snapshots every 0.3 s, one kept, "
        "so the copy prunes snapshots all along",
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

    extra = ["train.snapshot_minutes=0.005", "train.keep_snapshots=1"] if args.copy else []

    def cmd(out: Path, resume: bool) -> list[str]:
        return command(out, args.steps, args.eval_every, resume, data) + extra

    ref = work / "reference"
    shutil.rmtree(ref, ignore_errors=True)
    started = time.time()
    code, err, wall, first = run(cmd(ref, False), watch=ref / "train_state.pt")
    first = wall if first is None else first
    if code != 0:
        print(f"reference run failed ({code}): {err.strip()[-500:]}", file=sys.stderr)
        return 1
    # the last checkpoint's write ends the training; after it come the samples and the summary
    trained = (ref / "train_state.pt").stat().st_mtime - started
    last = trained if args.window == "training" else wall
    print(
        f"reference: {args.steps} steps in {wall:.1f} s (process start included; first checkpoint "
        f"at {first:.1f} s, last at {trained:.1f} s); kill moments drawn from ({first:.1f} s, {last:.1f} s)"
    )

    passed = 0
    if args.copy:
        (work / "copies").mkdir(exist_ok=True)
    for trial in range(args.trials):
        # with --copy, run from `work` with a relative --out, as the README's commands do
        name = Path(f"trial_{trial}")
        out, cwd = (name, work) if args.copy else (work / name, None)
        shutil.rmtree(work / name, ignore_errors=True)
        delay = rng.uniform(first, last)
        code = run(cmd(out, False), kill_after=delay, cwd=cwd)[0]
        killed_at = "after the end" if code == 0 else "?"
        if code != 0:
            state = work / name / "train_state.pt"
            killed_at = (
                f"step {torch.load(state, weights_only=True)['loop']['step']}"
                if state.is_file()
                else "before the first checkpoint"
            )
        original, before = work / name, None
        if args.copy and code != 0:  # cp -r trial_N copies/trial_N; resume the copy, not the original
            out = Path("copies") / name
            shutil.rmtree(work / out, ignore_errors=True)
            shutil.copytree(original, work / out)
            before = digest(original)
        final = work / out
        restarts = 0
        while code != 0:
            code, err = run(cmd(out, True), cwd=cwd)[:2]
            if code == 2 and "nothing to resume" in err:  # killed before its first checkpoint
                restarts += 1
                shutil.rmtree(final, ignore_errors=True)
                code, err = run(cmd(out, False), cwd=cwd)[:2]
            if code != 0:
                print(f"trial {trial}: the resumed run failed ({code}): {err.strip()[-300:]}")
                break
        ok, why = (
            same_weights(ref / "last.safetensors", final / "last.safetensors")
            if code == 0
            else (False, "did not finish")
        )
        if before is not None:
            untouched = digest(original) == before
            ok, why = ok and untouched, f"{why}; the original {'untouched' if untouched else 'CHANGED'}"
        passed += ok
        print(
            f"trial {trial}: SIGKILL after {delay:.2f} s (last checkpoint: {killed_at}"
            f"{f', started afresh {restarts}x' if restarts else ''}) -> {why}"
        )
    print(f"{passed} of {args.trials} killed-and-resumed runs end bit-identical to the reference")
    return 0 if passed == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
