"""Sharing a busy CPU: a thread count that follows the machine's load, and a run that says
what share of the machine it had.

Why: PyTorch's CPU kernels run on OpenMP threads (GNU libgomp in the Linux wheels). Between two
parallel regions an idle thread spins (GNU's default: 300,000 polls, the libgomp manual's
``GOMP_SPINCOUNT``) instead of sleeping, which costs nothing on a quiet machine and everything
on a busy one: two runs on 2 cores, each with 2 spinning threads, make a quarter of one run's
steps between them or less, since each spends its time slices waiting for a thread that the
other one holds. So:

1. :class:`CpuShare`: the number of torch threads follows the CPUs that other processes leave
   free, chosen at the start and re-checked every few seconds between training steps and
   decoding batches (``torch.set_num_threads`` takes effect at the next parallel region). One
   thread cannot spin against itself, and a quiet machine keeps torch's own count, so a run
   alone is what it was. Pinned, it stays: ``train.threads``, ``QKV_THREADS`` or
   ``OMP_NUM_THREADS``.
2. :meth:`CpuShare.report`: the share of a quiet run's steps a run made, from its own step rate
   in quiet and busy stretches, for the summary line, the progress bar and ``summary.json``.

Shorter spins (``OMP_WAIT_POLICY=PASSIVE``, ``GOMP_SPINCOUNT``) were measured too and are not
set: they cost a quiet run up to a third of its speed (decoding most) and gained nothing beside
other work over the thread count alone (``benchmarks/busy_machine.py``; the table is in the
performance guide, ``docs/guides/performance.md``). ``QKV_CPU_SHARE=0`` (or ``false``, ``off``,
``no``) turns 1 off (torch's own thread count, as qkv had before).

The variables are parsed in one place, :func:`read_environment`, which refuses a value it cannot
read in one line (the CLI checks them before any verb runs).

Who sets the threads: the entry points alone (the CLI's verbs, the explainer server,
``qkv.show``), each with one :func:`for_command` that it hands to the decoders and the training
run it calls (their ``cpu=`` argument). A library function given no :class:`CpuShare` leaves
torch's thread count as the calling program set it and never sleeps: a program that calls
``qkv.inference`` keeps its own threads (issue 70).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from .errors import ConfigError

# The probe's one sleep goes through this name so that tests can watch it alone (a global
# ``time.sleep`` is also called by ``subprocess``'s wait loop, e.g. the run's git lookup).
_sleep = time.sleep

logger = logging.getLogger(__name__)

INTERVAL_S = 2.0  # seconds between two looks at the machine's load
PROBE_S = 0.1  # an entry point's first look at the load, before it sets the threads
# the kernel counts CPU time in ticks of 10 ms: a shorter window than this is mostly rounding
MIN_WINDOW_S = 0.5
QUIET_CORES = 0.3  # other processes below this many busy CPUs: a quiet stretch
# a CPU counts as taken when other processes keep it busy at least this fraction of the time
TAKEN_FROM = 0.6
BUSY_BELOW = 0.9  # a run that made under this share of a quiet run's steps says so...
BUSY_FROM = 0.5  # ...when other processes kept at least this many CPUs busy on average


# QKV_CPU_SHARE's words, case and surrounding spaces aside (unset or empty: on)
SHARE_ON = ("1", "true", "on", "yes")
SHARE_OFF = ("0", "false", "off", "no")
MAX_THREADS = 2**31 - 1  # torch.set_num_threads takes a C int


@dataclass(frozen=True)
class ThreadEnvironment:
    """What the environment says about this process's CPU threads (:func:`read_environment`):
    ``share`` (``QKV_CPU_SHARE``: qkv may choose the count from the load) and ``threads``
    (``QKV_THREADS``, else the first number of ``OMP_NUM_THREADS``; ``None``: not pinned)."""

    share: bool
    threads: int | None


def read_environment(environ: MutableMapping[str, str] | None = None) -> ThreadEnvironment:
    """The one parser of the variables qkv reads about threads (``environ``: default
    ``os.environ``), each checked whichever one wins, so that a bad value is refused whatever
    else is set; the CLI calls it before any verb runs (a refusal writes nothing).

    - ``QKV_CPU_SHARE``: one of :data:`SHARE_ON` or :data:`SHARE_OFF` (any case); unset or
      empty: on.
    - ``QKV_THREADS``: a whole number from 1 to :data:`MAX_THREADS`; unset or empty: not pinned.
    - ``OMP_NUM_THREADS``: what the OpenMP runtime under torch reads too (GNU libgomp: positive
      whole numbers separated by commas, spaces around each allowed); qkv pins to the first.
      A value outside that is refused rather than ignored: libgomp ignores it too (with a
      ``libgomp: Invalid value`` line), so the count the user meant to fix would silently be
      the default, and only a refusal says so.

    Raises:
        ConfigError: one line naming the variable, its value and what it accepts.
    """
    env = os.environ if environ is None else environ
    share = env.get("QKV_CPU_SHARE", "").strip().lower()
    if share and share not in SHARE_ON + SHARE_OFF:
        raise _refused("QKV_CPU_SHARE", env, f"one of {', '.join(SHARE_ON + SHARE_OFF)} (unset: 1)")
    qkv_threads = env.get("QKV_THREADS", "").strip()
    threads = None
    if qkv_threads:
        threads = _count(qkv_threads)
        if threads is None:
            raise _refused("QKV_THREADS", env, f"a whole number from 1 to {MAX_THREADS}")
    omp = env.get("OMP_NUM_THREADS", "")
    if omp.strip():
        counts = [_count(part.strip()) for part in omp.split(",")]
        if None in counts:
            accepts = f"whole numbers from 1 to {MAX_THREADS} separated by commas (qkv pins to the first)"
            raise _refused("OMP_NUM_THREADS", env, accepts)
        threads = threads or counts[0]
    return ThreadEnvironment(share=share not in SHARE_OFF, threads=threads)


def _count(text: str) -> int | None:
    """A thread count written as libgomp reads one (digits, a leading ``+`` allowed), or ``None``."""
    digits = text[1:] if text.startswith("+") else text
    # past 10 significant digits it is beyond MAX_THREADS (and int() refuses 4,300 digits)
    if not (digits.isascii() and digits.isdigit()) or len(digits.lstrip("0")) > 10:
        return None
    return int(digits) if 1 <= int(digits) <= MAX_THREADS else None


def _refused(name: str, env: MutableMapping[str, str], accepts: str) -> ConfigError:
    value = env[name] if len(env[name]) <= 40 else f"{env[name][:20]}... ({len(env[name])} characters)"
    return ConfigError(f"environment variable {name}={value!r} is not valid: expected {accepts}")


def enabled(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether qkv chooses the thread count from the load (``QKV_CPU_SHARE`` on).

    Raises:
        ConfigError: a variable :func:`read_environment` refuses.
    """
    return read_environment(environ).share


def pinned_threads(
    train_threads: int | None = None, environ: MutableMapping[str, str] | None = None
) -> int | None:
    """The thread count the user fixed, or ``None`` when qkv may choose: ``train_threads``
    (``train.threads``), else ``QKV_THREADS``, else ``OMP_NUM_THREADS`` (its first number).

    Raises:
        ConfigError: (a ``ValueError``) a variable :func:`read_environment` refuses, whether or
            not ``train_threads`` wins.
    """
    threads = read_environment(environ).threads
    return train_threads or threads


class LoadSampler:
    """How many CPUs other processes kept busy since the last look: the busy time of this
    process's CPUs (its affinity) from the kernel's counters, less this process's own CPU time,
    over the wall time between (``psutil``)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()
        try:
            self.cpus = sorted(os.sched_getaffinity(0))
        except AttributeError:  # macOS, Windows: every CPU
            self.cpus = list(range(psutil.cpu_count() or 1))
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        per_cpu = self._psutil.cpu_times(percpu=True)
        busy = 0.0
        for i in self.cpus:
            if i < len(per_cpu):
                t = per_cpu[i]
                # user (guest time is in it), kernel, interrupts and what a hypervisor took;
                # niced processes yield to this one (their weight is small): not taken
                busy += t.user + t.system + sum(getattr(t, k, 0.0) for k in ("irq", "softirq", "steal"))
        own = self._process.cpu_times()
        return time.monotonic(), busy, own.user + own.system

    def others(self) -> tuple[float, float]:
        """``(seconds since the last look, CPUs other processes kept busy meanwhile)``."""
        now = self._read()
        (t0, busy0, own0), (t1, busy1, own1) = self._last, now
        self._last = now
        dt = t1 - t0
        if dt <= 0:
            return 0.0, 0.0
        return dt, min(float(len(self.cpus)), max(0.0, ((busy1 - busy0) - (own1 - own0)) / dt))


@dataclass
class _Window:
    seconds: float
    steps: int
    others: float
    threads: int


@dataclass
class CpuShare:
    """The CPU threads of one run, chosen from the load, and the share of the machine it had.

    Call :meth:`start` once (it looks at the load for ``probe_s`` seconds and sets the thread
    count), then :meth:`tick` between steps (the training loop does, after each optimizer
    step; the decoders between batches): every ``interval_s`` seconds it looks at the load again
    and sets ``torch.set_num_threads(max(1, cpus - taken))``, ``taken`` the CPUs other processes
    keep busy (:data:`TAKEN_FROM` of one or more), at most the count torch started with. A
    pinned count (:func:`pinned_threads`) or ``QKV_CPU_SHARE=0`` leaves the threads alone, but
    the load is still measured for :meth:`report`. Used as a context manager (``with``), it
    gives torch back the thread count it found.

    Args:
        pinned: the user's thread count (``train.threads``), or ``None``; applied at once.
        interval_s: seconds between looks at the load (default :data:`INTERVAL_S`).
        sampler: what measures the load (tests pass a fake).
        cpu_bound: the work runs on the CPU (``False`` for a GPU run, whose speed the CPUs'
            load does not set: its share is then measured against its quiet stretches only).
        manage: whether the thread count may follow the load. ``True`` (an entry point's,
            :func:`for_command`): it does unless pinned (``pinned``, ``QKV_THREADS``,
            ``OMP_NUM_THREADS``) or ``QKV_CPU_SHARE=0``. ``False`` (a library function handed
            no :class:`CpuShare`): measure the load for :meth:`report` only, and pin nothing
            but ``pinned`` (the environment is not read; start it with ``probe_s=0``, no
            sleep).

    Raises:
        ConfigError: (``manage``) a variable :func:`read_environment` refuses.
    """

    pinned: int | None = None
    interval_s: float | None = None
    sampler: LoadSampler | None = None
    cpu_bound: bool = True
    manage: bool = True
    windows: list[_Window] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        import torch

        self._torch = torch
        self._found = torch.get_num_threads()  # what __exit__ gives back
        if self.interval_s is None:
            self.interval_s = INTERVAL_S
        # QKV_CPU_SHARE=0 (or a caller's manage=False) keeps torch's count: describe() says which
        self._why_unmanaged = "QKV_CPU_SHARE=0: torch's choice" if self.manage else "torch's choice"
        if self.manage:
            self.pinned = pinned_threads(self.pinned)
            self.manage = enabled() and self.pinned is None
        if self.pinned is not None:
            torch.set_num_threads(self.pinned)
        self.max_threads = torch.get_num_threads()
        self.threads = self.max_threads
        self.probe_others = 0.0  # what the start's look saw
        self._unsaid: str | None = None  # the start's line, until the work begins (announce)
        self._steps = 0
        self._last = time.monotonic()

    def __enter__(self) -> CpuShare:
        return self

    def __exit__(self, *exc: object) -> None:
        """Give torch back the thread count it had before this share: an entry point inside
        another program (``qkv.show`` in a notebook) leaves it as it found it."""
        if self._torch.get_num_threads() != self._found:
            self._torch.set_num_threads(self._found)

    @property
    def cpus(self) -> int:
        return len(self._sampler().cpus)

    def _sampler(self) -> LoadSampler:
        if self.sampler is None:
            self.sampler = LoadSampler()
        return self.sampler

    def start(self, probe_s: float = PROBE_S, say: bool = True) -> int:
        """Look at the load for ``probe_s`` seconds, choose the thread count and return it.
        ``say``: log :meth:`describe` (INFO) now; else :meth:`announce` does, or the first
        :meth:`tick`, :meth:`mark` or :meth:`warn_if_busy`: when the work begins, so that a
        command refused before then says its refusal alone."""
        self._sampler()
        if probe_s > 0:
            _sleep(probe_s)
        self._look(0)
        others = self.probe_others = self.windows[-1].others
        self.windows.clear()  # the probe is no training window
        self._last = time.monotonic()
        self._unsaid = self.describe(others)
        if say:
            self.announce()
        return self.threads

    def announce(self) -> None:
        """Log :meth:`describe`'s line of the start (INFO), once: later calls do nothing."""
        if self._unsaid is not None:
            logger.info(self._unsaid)
            self._unsaid = None

    def warn_if_busy(self) -> None:
        """Log a warning when, at the latest look, other processes kept a CPU or more busy: what
        the training loop says as it starts (after every check of the run's inputs, so that a
        refused command stays one line)."""
        self.announce()
        others = self.windows[-1].others if self.windows else self.probe_others
        if others >= TAKEN_FROM:
            logger.warning(
                f"the machine is busy: other processes keep {others:.1f} of {self.cpus} CPUs busy, so "
                f"qkv runs slower than on a quiet machine ({_threads(self.threads)}); a time budget "
                "makes fewer steps (the summary will say how many)"
            )

    def mark(self) -> int:
        """Close the window in progress and return where the next stretch begins, for
        :meth:`report` ``(since=...)`` (the training loop marks its start: what came before,
        data and model preparation, is no training). A window shorter than
        :data:`MIN_WINDOW_S` stays open (its load would be rounding)."""
        self.announce()
        if time.monotonic() - self._last >= MIN_WINDOW_S:
            self._look(self._steps)
            self._steps = 0
            self._last = time.monotonic()
        return len(self.windows)

    def tick(self, steps: int = 0) -> None:
        """Count ``steps`` more steps done; every ``interval_s`` seconds, look at the load again
        (and change the thread count when it moved)."""
        self.announce()
        self._steps += steps
        if time.monotonic() - self._last >= (self.interval_s or 0.0):
            self._look(self._steps)
            self._steps = 0
            self._last = time.monotonic()

    def _look(self, steps: int) -> None:
        seconds, others = self._sampler().others()
        self.windows.append(_Window(seconds, steps, others, self.threads))
        if not self.manage:
            return
        taken = math.floor(others + (1 - TAKEN_FROM))
        want = max(1, min(self.max_threads, self.cpus - taken))
        if want != self.threads:
            logger.debug(
                f"others keep {others:.1f} of {self.cpus} CPUs busy: {self.threads} -> {want} threads"
            )
            self._torch.set_num_threads(want)
            self.threads = want

    def describe(self, others: float = 0.0) -> str:
        """One line: the threads and why (``others``: the CPUs other processes keep busy)."""
        if self.pinned is not None:
            return f"CPU threads: {self.threads} (pinned)"
        if not self.manage:
            return f"CPU threads: {self.threads} ({self._why_unmanaged})"
        return (
            f"CPU threads: {self.threads} of {self.cpus} CPUs (other processes keep {others:.1f} busy; "
            f"re-checked every {self.interval_s:g} s)"
        )

    def report(self, since: int = 0) -> dict:
        """The machine during the run (the windows from :meth:`mark`'s ``since`` on):
        ``cpus``, ``others_cpus`` (CPUs other processes kept busy, mean over the run),
        ``threads`` (the counts used, first to last, repeats dropped),
        ``quiet_share`` (steps made / steps a quiet run of this machine makes in the same time:
        the step rate of the quiet stretches (others under :data:`QUIET_CORES` CPUs) against
        the whole run's; with no quiet stretch, estimated from the load as
        ``(cpus - others) / cpus``, or ``None`` for work that is not ``cpu_bound``),
        ``estimated`` (no quiet stretch to compare with) and ``busy`` (``quiet_share`` under
        :data:`BUSY_BELOW` while others kept :data:`BUSY_FROM` CPUs or more busy). ``{}``
        before any window."""
        windows = [w for w in self.windows[since:] if w.seconds > 0]
        if not windows:
            return {}
        seconds = sum(w.seconds for w in windows)
        others = sum(w.others * w.seconds for w in windows) / seconds
        steps = sum(w.steps for w in windows)
        # the first window holds the warm-up (allocation, first shapes): it is no reference
        quiet = [w for w in windows[1:] if w.others < QUIET_CORES and w.steps > 0]
        quiet_s = sum(w.seconds for w in quiet)
        estimated = quiet_s < min(10.0, 0.1 * seconds) or steps == 0
        share: float | None
        if estimated:
            share = max(0.0, (self.cpus - others) / self.cpus) if self.cpu_bound else None
        else:
            quiet_rate = sum(w.steps for w in quiet) / quiet_s
            share = min(1.0, steps / seconds / quiet_rate)
        threads: list[int] = []
        for w in windows:
            if not threads or threads[-1] != w.threads:
                threads.append(w.threads)
        if threads[-1] != self.threads:
            threads.append(self.threads)
        return {
            "cpus": self.cpus,
            "others_cpus": round(others, 2),
            "threads": threads,
            "quiet_share": None if share is None else round(share, 3),
            "estimated": estimated,
            "busy": share is not None and share < BUSY_BELOW and others >= BUSY_FROM,
        }


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def for_command(pinned: int | None = None) -> CpuShare:
    """The :class:`CpuShare` of an entry point (a CLI verb, the explainer server, ``qkv.show``):
    the thread count follows the load (unless pinned: ``pinned``, the recipe's
    ``train.threads``, else ``QKV_THREADS`` or ``OMP_NUM_THREADS``), started with a look of
    :data:`PROBE_S` seconds. The entry point hands it to what it calls (their ``cpu=``); its
    line (:meth:`CpuShare.describe`) is logged when the work begins (:meth:`CpuShare.announce`),
    after the checks that may refuse the command.

    Raises:
        ConfigError: a variable :func:`read_environment` refuses.
    """
    share = CpuShare(pinned)
    share.start(PROBE_S, say=False)
    return share


def busy_note(report: dict, time_budget: bool = True) -> str | None:
    """The sentence a result carries when its run was slowed by a busy machine, or ``None``:
    under a time budget (``time_budget``) the steps it lost, else the time it took longer."""
    if not report.get("busy"):
        return None
    how = "estimated from the load" if report["estimated"] else "measured against its quiet stretches"
    share = f"{100 * report['quiet_share']:.0f} %"
    what = (
        f"{share} of the steps a quiet run of this machine makes"
        if time_budget
        else f"it ran at {share} of a quiet run's speed on this machine"
    )
    return (
        f"the machine was busy: {what} ({how}; other processes kept {report['others_cpus']:.1f} of "
        f"{report['cpus']} CPUs busy)"
    )
