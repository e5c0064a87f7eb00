"""torchrun + DistributedDataParallel on CPU (gloo): two processes train like one process with
the same global batch, and write one run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
pytestmark = pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)

# dropout 0: with dropout the two set-ups draw different masks and can only agree on average
SETTINGS = [
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_layers=2",
    "model.dropout=0",
    "model.max_len=32",
    "batch_size=8",
    "eval_batches=2",
    "num_samples=1",
    "sample_tokens=8",
    "train.precision=fp32",
    # gloo on the CPU whatever the machine: two processes need two GPUs on CUDA (refused on one)
    "train.device=cpu",
    "train.warmup_steps=5",
    "train.eval_every=20",
    "train.accum_steps=2",
]


def _qkv(*args: str, nproc: int = 1) -> subprocess.CompletedProcess:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    env = {**os.environ, "QKV_DATA_DIR": str(DATA), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [*launcher, "-m", "qkv", *args], capture_output=True, text=True, env=env, timeout=600
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    out = {}
    for nproc in (1, 2):
        out[nproc] = root / f"p{nproc}"
        done = _qkv(
            "train", "lm", "--out", str(out[nproc]), "--quiet", "train.max_steps=40", *SETTINGS, nproc=nproc
        )
        assert done.returncode == 0, done.stderr[-2000:]
    return out


def _rows(run: Path, key: str) -> list[tuple[int, float]]:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r[key]) for r in rows if key in r]


def test_two_processes_match_one_with_the_same_global_batch(runs):
    # Same global batch (2 micro-batches of 8 windows per step), summed in another order:
    # the curves agree to float32 round-off, grown a little over 40 Adam steps.
    for key in ("train_loss", "val_loss"):
        one, two = _rows(runs[1], key), _rows(runs[2], key)
        assert [s for s, _ in one] == [s for s, _ in two] and one
        for (_, a), (_, b) in zip(one, two, strict=True):
            assert abs(a - b) < 1e-4 * abs(a), (key, a, b)
    w1, w2 = load_file(str(runs[1] / "last.safetensors")), load_file(str(runs[2] / "last.safetensors"))
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], atol=1e-4, rtol=1e-3)


def test_two_processes_write_one_run_directory(runs):
    def listing(run):
        return sorted(str(p.relative_to(run)) for p in run.rglob("*"))

    assert listing(runs[2]) == listing(runs[1])  # no stray files from rank 1
    state = torch.load(runs[2] / "train_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2  # each rank's random streams


def test_resume_on_another_number_of_processes_is_refused(runs):
    done = _qkv("train", "lm", "--out", str(runs[2]), "--resume", "--quiet", "train.max_steps=50", *SETTINGS)
    assert done.returncode == 2
    assert "was trained on 2 process(es); resume it on as many" in done.stderr


def _one_and_two_processes_agree(tmp_path: Path, settings: list[str]) -> None:
    one, two = tmp_path / "p1", tmp_path / "p2"
    for run, nproc in ((one, 1), (two, 2)):
        done = _qkv("train", "lm", "--out", str(run), "--quiet", *settings, nproc=nproc)
        assert done.returncode == 0, done.stderr[-2000:]
    for key in ("train_loss", "val_loss"):
        a, b = _rows(one, key), _rows(two, key)
        assert [s for s, _ in a] == [s for s, _ in b] and a
        for (_, x), (_, y) in zip(a, b, strict=True):
            assert abs(x - y) < 1e-4 * abs(x), (key, x, y)


def test_the_defaults_train_under_torchrun_with_the_global_batch_of_one_process(tmp_path):
    """With fewer micro-batches per step than processes (accum_steps 1, the default), each
    process takes its rows of every micro-batch: the same global batch as one process."""
    _one_and_two_processes_agree(tmp_path, [*SETTINGS, "train.accum_steps=1", "train.max_steps=20"])


def test_two_processes_on_token_shards_train_as_one(tmp_path):
    """From token shards (qkv prepare lm, windows crossing 100,000-token shards) each process
    reads only the windows of its micro-batches: the same global batch as one process."""
    data = tmp_path / "shards"
    done = _qkv("prepare", "lm", "tinyshakespeare", "--out", str(data), "--shard-tokens", "100000", "--quiet")
    assert done.returncode == 0, done.stderr[-2000:]
    _one_and_two_processes_agree(tmp_path, [*SETTINGS, f"data={data}", "train.max_steps=20"])


def test_lora_from_a_checkpoint_trains_under_torchrun_as_in_one_process(runs, tmp_path):
    """``--init`` of a run with LoRA adapters: two processes (the frozen base on both, DDP over
    the adapters) give one process's losses, and the merged weights."""
    pytest.importorskip("peft")
    settings = [*SETTINGS, "train.accum_steps=1", "train.max_steps=20", "train.eval_every=10"]
    settings = [s for s in settings if not s.startswith(("model.d_", "model.n_"))]  # the checkpoint's
    settings += ["train.lora_rank=4", "train.lr=1e-2"]
    one, two = tmp_path / "p1", tmp_path / "p2"
    for run, nproc in ((one, 1), (two, 2)):
        done = _qkv(
            "train", "lm", "--init", str(runs[1]), "--out", str(run), "--quiet", *settings, nproc=nproc
        )
        assert done.returncode == 0, done.stderr[:3000]
    for key in ("train_loss", "val_loss"):
        a, b = _rows(one, key), _rows(two, key)
        assert [s for s, _ in a] == [s for s, _ in b] and a
        for (_, x), (_, y) in zip(a, b, strict=True):
            assert abs(x - y) < 1e-4 * abs(x), (key, x, y)
    assert (two / "adapter_model.safetensors").is_file()
    merged = load_file(two / "model.safetensors")
    assert (
        not [k for k in merged if "lora_" in k]
        and merged.keys() == load_file(runs[1] / "model.safetensors").keys()
    )


def test_a_micro_batch_is_shared_out_by_rows():
    from qkv.data.batching import make_batch
    from qkv.distributed import share

    rows = torch.arange(5)
    assert [share(rows, r, 2).tolist() for r in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert share(list("abc"), 2, 4) == ["c"] and share(list("abc"), 3, 4) == []
    batch = make_batch([([5, 6], [7]), ([5], [7, 8, 9]), ([6], [8])], [10, 11, 12], 0, 1, 2)
    part = share(batch, 1, 2)  # the second pair: 3 target tokens + eos
    assert part.index == [11] and part.n_tgt_tokens == 4 and part.tgt_out.tolist() == [[7, 8, 9, 2]]
    assert share(batch, 0, 2).n_tgt_tokens + part.n_tgt_tokens == batch.n_tgt_tokens


def test_more_processes_than_gpus_is_refused_before_joining(monkeypatch):
    """torchrun --nproc_per_node=2 on a one-GPU machine: rank 1 gets a one-line refusal instead
    of a CUDA traceback in set_device, before any process group is joined."""
    from qkv import distributed
    from qkv.errors import QkvError

    for name, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    joined = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: joined.append(a))
    with pytest.raises(QkvError, match=r"process 1 on a machine with 1 GPU\(s\).*train.device=cpu"):
        distributed.init("auto")
    assert not joined and not distributed.context().enabled


def test_a_masked_diffusion_lm_trains_under_torchrun(tmp_path):
    """diffusion-lm shares lm's loop under torchrun. Each process draws its own masking ratios
    and masks (global RNG per process), so two processes follow one process only in
    distribution: the same steps, and validation bounds a few per cent apart."""
    bounds = {}
    for nproc in (1, 2):
        run = tmp_path / f"p{nproc}"
        settings = [*SETTINGS, "train.accum_steps=1", "train.max_steps=40", "bound_samples=2"]
        done = _qkv("train", "diffusion-lm", "--out", str(run), "--quiet", *settings, nproc=nproc)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads((run / "summary.json").read_text())
        assert summary["steps"] == 40
        bounds[nproc] = summary["validation"]["val_loss"]
    assert abs(bounds[2] - bounds[1]) < 0.05 * bounds[1], bounds
