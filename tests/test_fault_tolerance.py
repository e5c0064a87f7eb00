"""A real training run killed with SIGKILL at random moments resumes to the same bits."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("QKV_DATA_DIR", ROOT.parent / "shared" / "data"))


@pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)
@pytest.mark.parametrize("source", ["text", "shards"])
def test_sigkill_at_random_moments_then_resume_is_bit_identical(tmp_path, source):
    # Two kill points here (benchmarks/kill_resume.py --trials 10 is the acceptance run); the
    # corpus read into memory, or from token shards (qkv prepare lm) whose windows cross shards.
    env = {**os.environ, "QKV_DATA_DIR": str(DATA)}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "kill_resume.py"),
            "--trials",
            "2",
            "--steps",
            "60",
            "--eval-every",
            "10",
            "--seed",
            "3",
            "--workdir",
            str(tmp_path),
            *(["--shards"] if source == "shards" else []),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 of 2 killed-and-resumed runs end bit-identical" in done.stdout
