"""Run every side-by-side comparison in ``benchmarks/`` in one go and append one dated section
to ``benchmarks/HISTORY.md``, the dated record: machine, CPU flags, GPU, torch, date, and each
script's own table (medians, ranges and ratios, as the script prints them), its command, exit
status and time. ``benchmarks/RESULTS.md`` holds the current figure of each benchmark: update its
tables by hand from the new section.

Scripts: ``bench_lm.py`` (vs HF GPT-2), ``bench_translation.py`` (vs the PyTorch tutorial's
``nn.Transformer``), ``compile_step.py`` (eager vs ``torch.compile``), ``mfu.py`` (step FLOPs vs
the measured matmul peak, and where the time goes), ``kill_resume.py`` (SIGKILL + resume,
bit-identical), ``limits.py`` (inference as fractions of the bandwidth and FLOP bounds; its
translation workload needs a trained run and is run on its own), ``bench_encode.py`` (MiniLM
sentence encoding vs HF ``BertModel``, sdpa and eager). Longer studies (``demo_sweep.py``,
``norms.py``, the protein and ViT runs) are training runs, not comparisons, and keep their own
sections.

Run from the repository root, with the machine to itself (``--quick``: a few seconds per
script, a check that they run, not results; it does not touch HISTORY.md):
    QKV_DATA_DIR=../shared/data .venv/bin/python benchmarks/run_all.py
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
HISTORY = HERE / "HISTORY.md"

# script → (arguments of a full run, arguments of --quick)
SCRIPTS = {
    "bench_lm.py": ([], ["--quick"]),
    "bench_translation.py": ([], ["--quick"]),
    "compile_step.py": ([], ["--repeats", "1", "--steps", "2"]),
    "mfu.py": ([], ["--workloads", "translation", "--steps", "1", "--repeats", "1"]),
    "kill_resume.py": (["--trials", "10"], ["--trials", "1", "--steps", "30"]),
    "limits.py": ([], ["--quick"]),  # (c) needs a trained run: limits.py --translation-run RUN
    "bench_encode.py": ([], ["--repeats", "1", "--batches", "1"]),  # needs `make pretrained` (MiniLM)
}


def machine_lines() -> list[str]:
    from common import machine  # benchmarks/common.py

    from qkv.device import cpu_capability, cpu_has_amx_bf16, cpu_has_native_bf16

    cpu = (
        f"{cpu_capability()} vectors, native bf16: {'yes' if cpu_has_native_bf16() else 'no'}, "
        f"AMX bf16: {'yes' if cpu_has_amx_bf16() else 'no'}"
    )
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return [f"- machine: {machine()}", f"- CPU: {cpu}", f"- GPU: {gpu}"]


def demote_headings(text: str) -> str:
    """A script's own ``## title`` lines become ``####``, under this section's ``###``."""
    return "\n".join("##" + line if line.startswith("## ") else line for line in text.splitlines())


def run(script: str, args: list[str]) -> tuple[int, float, str]:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True)
    out = done.stdout.strip() or done.stderr.strip()[-2000:]
    return done.returncode, time.perf_counter() - t, out


def append(path: Path, section: str) -> None:
    """Add ``section`` at the end of ``path``: earlier runs stay as they were written."""
    text = path.read_text(encoding="utf-8")
    path.write_text(text.rstrip("\n") + "\n\n" + section + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="+", choices=sorted(SCRIPTS), help="run these scripts only")
    args = ap.parse_args(argv)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    parts = [
        f"## All comparisons in one run ({'quick check' if args.quick else 'results'}) — {date}",
        "",
        f"- command: `python benchmarks/run_all.py{' --quick' if args.quick else ''}`",
        *machine_lines(),
        "",
    ]
    failed = 0
    for script in args.only or SCRIPTS:
        script_args = SCRIPTS[script][1 if args.quick else 0]
        code, seconds, out = run(script, script_args)
        failed += code != 0
        print(f"{script}: exit {code}, {seconds:.0f} s", file=sys.stderr, flush=True)
        parts += [
            f"### {script} {' '.join(script_args)}".rstrip() + f" — exit {code}, {seconds:.0f} s",
            "",
            demote_headings(out),
            "",
        ]
    section = "\n".join(parts)
    print(section)
    if not args.quick:
        append(HISTORY, section)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
