"""qkv.cpu_share: the OpenMP environment every entry point sets (the user's own variables kept),
the thread count that follows the machine's load, and the busy run that says so (warning at the
start, summary fields, the line after the result). Nothing here is timed: the load is a fake."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from cli_runs import TINY_LM, run_main

from qkv import cpu_share
from qkv.cpu_share import CpuShare, busy_note, pinned_threads


class FakeLoad:
    """A :class:`qkv.cpu_share.LoadSampler` whose other processes keep ``others`` CPUs busy."""

    def __init__(self, others: float, cpus: int = 2) -> None:
        self.others_now = others
        self.cpus = list(range(cpus))

    def others(self) -> tuple[float, float]:
        return 1.0, self.others_now


@pytest.fixture
def two_threads(monkeypatch):
    """torch starts with 2 threads and no variable pins them."""
    for name in ("QKV_THREADS", "OMP_NUM_THREADS", "QKV_CPU_SHARE"):
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(1)


# --- every entry point ---


def test_a_plain_python_process_keeps_openmp_as_it_was():
    """qkv changes no OpenMP variable (shorter spins were measured and not chosen): a process
    that imports qkv and runs it sees the environment it was given."""
    probe = "import os, qkv, qkv.cli; import torch; print(sorted(k for k in os.environ if 'OMP' in k))"
    env = {k: v for k, v in os.environ.items() if "OMP" not in k}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_an_entry_points_share_starts_the_thread_count_from_the_load(two_threads, monkeypatch):
    """What a verb, the server or ``qkv.show`` makes (:func:`qkv.cpu_share.for_command`): one
    look at the load, and the thread count set from it before anything decodes."""
    monkeypatch.setattr(cpu_share, "LoadSampler", lambda: FakeLoad(others=1.0))
    share = cpu_share.for_command()
    assert share.manage and share.threads == 1 and torch.get_num_threads() == 1
    share.tick()
    assert torch.get_num_threads() == 1


def test_a_share_that_only_measures_leaves_the_threads_alone(two_threads, monkeypatch):
    """``manage=False`` (a training run handed no share): the load is measured for the report,
    the environment is not read, and only the caller's own count is applied."""
    monkeypatch.setenv("QKV_THREADS", "3")
    share = CpuShare(interval_s=0.0, sampler=FakeLoad(others=1.5), manage=False)
    share.start(probe_s=0)
    share.tick(1)
    assert torch.get_num_threads() == 2 and share.report()["others_cpus"] == 1.5
    assert share.describe() == "CPU threads: 2 (torch's choice)"
    CpuShare(pinned=1, sampler=FakeLoad(others=0.0), manage=False)
    assert torch.get_num_threads() == 1  # what the caller gave is applied


def test_a_share_as_a_context_gives_the_threads_back(two_threads):
    with CpuShare(interval_s=0.0, sampler=FakeLoad(others=1.0)) as share:
        share.start(probe_s=0)
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_the_start_line_waits_for_the_work(two_threads, qkv_logs):
    """An entry point's share says its threads at the first tick, not at the start: a command
    refused in between says its refusal alone."""
    share = CpuShare(interval_s=10.0, sampler=FakeLoad(others=0.0))
    share.start(probe_s=0, say=False)
    assert "CPU threads" not in qkv_logs.text
    share.tick(1)
    share.tick(1)
    assert qkv_logs.text.count("CPU threads: 2 of 2 CPUs") == 1


def test_pinned_threads_come_from_the_setting_then_the_environment():
    assert pinned_threads(3, {"QKV_THREADS": "2"}) == 3
    assert pinned_threads(None, {"QKV_THREADS": "2", "OMP_NUM_THREADS": "4"}) == 2
    assert pinned_threads(None, {"OMP_NUM_THREADS": "4,2"}) == 4
    assert pinned_threads(None, {}) is None
    with pytest.raises(ValueError, match="QKV_THREADS='two'"):
        pinned_threads(None, {"QKV_THREADS": "two"})


# --- threads that follow the load ---


def test_threads_follow_the_load_and_come_back(two_threads):
    load = FakeLoad(others=0.0)
    share = CpuShare(interval_s=0.0, sampler=load)
    assert share.start(probe_s=0) == 2 and torch.get_num_threads() == 2
    load.others_now = 1.0  # another run took a CPU
    share.tick(1)
    assert share.threads == 1 and torch.get_num_threads() == 1
    load.others_now = 0.3  # a browser tab: no CPU taken
    share.tick(1)
    assert torch.get_num_threads() == 2
    load.others_now = 5.0  # more than the machine: still one thread
    share.tick(1)
    assert torch.get_num_threads() == 1
    assert share.report()["threads"] == [2, 1, 2, 1]


@pytest.mark.parametrize("how", ["setting", "off"])
def test_pinned_or_disabled_threads_stay(two_threads, monkeypatch, how):
    if how == "off":
        monkeypatch.setenv("QKV_CPU_SHARE", "0")
    share = CpuShare(pinned=2 if how == "setting" else None, interval_s=0.0, sampler=FakeLoad(others=1.5))
    share.start(probe_s=0)
    share.tick(1)
    assert torch.get_num_threads() == 2
    assert share.report()["others_cpus"] == 1.5  # measured all the same


# --- honest budgets ---


def test_the_share_is_measured_against_the_quiet_stretches(two_threads):
    load = FakeLoad(others=0.0)
    share = CpuShare(interval_s=0.0, sampler=load)
    share.start(probe_s=0)
    for _ in range(20):  # 20 quiet seconds at 10 steps/s (the first is the warm-up)
        share.tick(10)
    load.others_now = 1.0
    for _ in range(20):  # 20 busy seconds at 4 steps/s
        share.tick(4)
    report = share.report()
    assert report["quiet_share"] == pytest.approx((200 + 80) / 40 / 10, abs=1e-3)
    assert report["busy"] and not report["estimated"]
    assert report["others_cpus"] == pytest.approx(0.5)
    note = busy_note(report)
    assert note is not None and "the machine was busy: 70 % of the steps a quiet run" in note


def test_with_no_quiet_stretch_the_share_is_estimated_from_the_load(two_threads):
    share = CpuShare(interval_s=0.0, sampler=FakeLoad(others=1.0))
    share.start(probe_s=0)
    for _ in range(30):
        share.tick(3)
    report = share.report()
    assert report["estimated"] and report["quiet_share"] == 0.5 and report["busy"]
    assert "estimated from the load" in (busy_note(report) or "")
    assert "it ran at 50 % of a quiet run's speed" in (busy_note(report, time_budget=False) or "")


def test_a_gpu_run_with_no_quiet_stretch_claims_no_share(two_threads):
    share = CpuShare(interval_s=0.0, sampler=FakeLoad(others=1.0), cpu_bound=False)
    share.start(probe_s=0)
    for _ in range(30):
        share.tick(3)
    report = share.report()
    assert report["quiet_share"] is None and not report["busy"] and busy_note(report) is None


def test_a_little_load_is_no_busy_machine(two_threads):
    """A browser tab (0.3 of a CPU) that slows the run by a fifth: not called busy."""
    load = FakeLoad(others=0.0)
    share = CpuShare(interval_s=0.0, sampler=load)
    share.start(probe_s=0)
    for _ in range(20):
        share.tick(10)
    load.others_now = 0.6
    for _ in range(20):
        share.tick(6)
    report = share.report()
    assert report["quiet_share"] == 0.8 and report["others_cpus"] == 0.3 and not report["busy"]


def test_a_quiet_run_is_not_busy(two_threads):
    share = CpuShare(interval_s=0.0, sampler=FakeLoad(others=0.1))
    share.start(probe_s=0)
    for _ in range(30):
        share.tick(5)
    report = share.report()
    assert not report["busy"] and report["quiet_share"] == 1.0
    assert busy_note(report) is None and busy_note({}) is None


def test_a_busy_run_warns_at_start_and_says_so_in_its_summary(tmp_path, capsys, monkeypatch):
    """A training run on a machine whose other processes keep 1.5 of its 2 CPUs busy: a warning
    when it starts, ``cpu_share`` in ``summary.json``, and the sentence after the result."""
    monkeypatch.setattr(cpu_share, "LoadSampler", lambda: FakeLoad(others=1.5))
    monkeypatch.setattr(cpu_share, "INTERVAL_S", 0.0)
    run = tmp_path / "lm"
    code, out, err = run_main(capsys, "train", "lm", "--out", str(run), "--max-minutes", "0.02", *TINY_LM)
    assert code == 0, err
    assert "warning: the machine is busy: other processes keep 1.5 of 2 CPUs busy" in err
    summary = json.loads((run / "summary.json").read_text())
    share = summary["cpu_share"]
    assert share["busy"] and share["others_cpus"] == 1.5 and share["cpus"] == 2
    assert share["threads"] == [1]
    assert "warning: the machine was busy: 25 % of the steps a quiet run of this machine makes" in err


def test_a_quiet_run_summary_says_it_was_not_busy(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cpu_share, "LoadSampler", lambda: FakeLoad(others=0.0))
    run = tmp_path / "lm"
    code, out, err = run_main(capsys, "train", "lm", "--out", str(run), "--max-minutes", "0.02", *TINY_LM)
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["cpu_share"]["busy"] is False
    assert "the machine was busy" not in err


def test_a_mark_right_after_a_look_measures_no_window_of_rounding(two_threads):
    """Two marks a few milliseconds apart (the run's start, then the loop's): the second takes
    no look, whose load over so short a time would be the kernel's 10-ms ticks."""
    load = FakeLoad(others=1.0)
    share = CpuShare(interval_s=0.0, sampler=load)
    share.start(probe_s=0)
    share._last -= 1.0  # a second of data preparation since the start
    first = share.mark()
    load.others_now = 2.0  # what a look of a few milliseconds could read
    assert share.mark() == first and share.windows[-1].others == 1.0


def test_the_warning_comes_from_the_start_look_when_training_starts_at_once(two_threads, qkv_logs):
    """Data and model ready within half a second of the start: no window since, so the loop's
    warning reads the start's look."""
    share = CpuShare(interval_s=10.0, sampler=FakeLoad(others=1.0))
    share.start(probe_s=0)
    share.mark()
    share.warn_if_busy()
    assert "the machine is busy: other processes keep 1.0 of 2 CPUs busy" in qkv_logs.text
