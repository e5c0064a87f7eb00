"""Thread policy at the entry points (issue 70): the CLI's verbs, the explainer server and
``qkv.show`` choose torch's thread count (:func:`qkv.cpu_share.for_command`); library code
takes the :class:`~qkv.cpu_share.CpuShare` it is given and, given none, leaves the calling
program's thread count alone and never sleeps. The load is a fake; the probe's sleep
(``cpu_share._sleep``) raises."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from cli_runs import run_main
from test_cpu_share import FakeLoad

from qkv import cpu_share
from qkv.cpu_share import CpuShare

SRC = Path(__file__).resolve().parents[1] / "src" / "qkv"
# the entry points, which own the policy: every CLI verb, the server, qkv.show
ENTRY_POINTS = ("cli/", "explain/server.py", "recipes/loading.py")
POLICY_MODULE = "cpu_share.py"
THREAD_SETTERS = {"set_num_threads", "set_num_interop_threads"}


@pytest.fixture
def busy_two_threads(monkeypatch):
    """The calling program runs torch on 2 threads; other processes keep 1 of 2 CPUs busy
    (a managed share would drop to 1 thread); nothing may sleep."""
    for name in ("QKV_THREADS", "OMP_NUM_THREADS", "QKV_CPU_SHARE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu_share, "LoadSampler", lambda: FakeLoad(others=1.0))
    monkeypatch.setattr(cpu_share, "INTERVAL_S", 0.0)  # every tick looks at the load

    def no_sleep(seconds: float) -> None:
        raise AssertionError(f"slept {seconds} s")

    monkeypatch.setattr(cpu_share, "_sleep", no_sleep)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(1)


# --- the rule, read from the source ---------------------------------------------------------


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (p.relative_to(SRC).as_posix(), ast.parse(p.read_text(encoding="utf-8"))) for p in SRC.rglob("*.py")
    ]


def _calls(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    """Every call in ``tree`` with the name it calls (``a.b.f(...)`` and ``f(...)``: ``f``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            out.append((name, node))
    return out


def _is_entry_point(rel: str) -> bool:
    return any(rel == e or (e.endswith("/") and rel.startswith(e)) for e in ENTRY_POINTS)


def test_the_entry_points_named_here_exist():
    """The rule's list is not stale: each entry point is where this test says."""
    for entry in ENTRY_POINTS:
        assert (SRC / entry).exists(), entry
    calls = {rel: {name for name, _ in _calls(tree)} for rel, tree in _modules()}
    assert "for_command" in calls["explain/server.py"] and "for_command" in calls["recipes/loading.py"]


def test_only_the_policy_module_and_the_entry_points_set_torch_threads():
    found = []
    for rel, tree in _modules():
        if rel == POLICY_MODULE or _is_entry_point(rel):
            continue
        found += [f"{rel}:{call.lineno} {name}" for name, call in _calls(tree) if name in THREAD_SETTERS]
        for node in ast.walk(tree):  # `from torch import set_num_threads as f`: a call under another name
            if isinstance(node, ast.ImportFrom):
                found += [
                    f"{rel}:{node.lineno} import {a.name}" for a in node.names if a.name in THREAD_SETTERS
                ]
    assert not found, found


def test_only_the_entry_points_make_a_share_that_sets_threads():
    """``for_command`` only at the entry points; elsewhere a :class:`CpuShare` is built only
    to measure (``manage=False``: the training run handed none)."""
    found = []
    for rel, tree in _modules():
        if rel == POLICY_MODULE or _is_entry_point(rel):
            continue
        for name, call in _calls(tree):
            measuring = any(
                k.arg == "manage" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in call.keywords
            )
            if name == "for_command" or (name == "CpuShare" and not measuring):
                found.append(f"{rel}:{call.lineno} {name}")
    assert not found, found


def test_no_module_keeps_a_process_wide_share():
    """The singleton is gone: nothing to tick behind the caller's back."""
    for name in ("_current", "current", "tick", "start"):
        assert not hasattr(cpu_share, name), name


# --- the library takes what it is given -----------------------------------------------------


def _generator(run, cpu=None):
    from qkv.inference.lm import TextGenerator

    return TextGenerator.from_run(run, cpu=cpu)


def _translator(run, cpu=None):
    from qkv.inference.translator import Translator

    return Translator.from_run(run, beam_size=2, batch_size=1, cpu=cpu)


def _embedder(run, cpu=None):
    from qkv.inference.embed import Embedder
    from qkv.inference.protein import ProteinEncoder

    return Embedder(ProteinEncoder.load(run), max_tokens=12, cpu=cpu)


def _decode(kind: str, tiny_runs, cpu=None) -> None:
    """Decode a few batches (or tokens) with the library, ``cpu`` given or not."""
    if kind == "lm":
        _generator(tiny_runs["lm"], cpu).generate(["ROMEO:"], max_new_tokens=4, seed=0)
    elif kind == "translation":
        _translator(tiny_runs["translation"], cpu).translate(["Ein Mann.", "Eine Frau liest."])
    else:
        _embedder(tiny_runs["protein"], cpu).embed(["GIGKFLHSAKKF", "MKT"], ["a", "b"])


@pytest.mark.parametrize("kind", ["lm", "translation", "embed"])
def test_the_library_given_no_share_keeps_the_callers_threads_and_never_sleeps(
    tiny_runs, busy_two_threads, kind
):
    _decode(kind, tiny_runs)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("kind", ["lm", "translation", "embed"])
def test_the_library_given_a_share_follows_it(tiny_runs, busy_two_threads, kind):
    """The policy works where it is handed down: a share that sees one CPU taken drops to
    one thread at the decoder's first tick (started without a look, so nothing sleeps)."""
    load = FakeLoad(others=0.0)
    share = CpuShare(sampler=load, interval_s=0.0)
    share.start(probe_s=0)
    assert torch.get_num_threads() == 2
    load.others_now = 1.0
    _decode(kind, tiny_runs, share)
    assert torch.get_num_threads() == 1 and share.threads == 1
    assert sum(w.steps for w in share.windows) >= 1  # the decoder counted its steps


def test_generate_tokens_takes_a_share_too(tiny_runs, busy_two_threads):
    """The function under :class:`TextGenerator` (what a program that holds a model calls)."""
    from qkv.inference.lm import generate_tokens

    model = _generator(tiny_runs["lm"]).model
    generate_tokens(model, [[1, 2, 3]], 3, do_sample=False)
    assert torch.get_num_threads() == 2
    share = CpuShare(sampler=FakeLoad(others=1.0), interval_s=0.0)
    share.start(probe_s=0)
    generate_tokens(model, [[1, 2, 3]], 3, do_sample=False, cpu=share)
    assert torch.get_num_threads() == 1


# --- the entry points own it ----------------------------------------------------------------


@pytest.fixture
def probe_allowed(monkeypatch):
    """The entry point's look at the load may sleep (it is the one place that does)."""
    slept = []
    monkeypatch.setattr(cpu_share, "_sleep", slept.append)
    return slept


def test_a_verb_sets_the_threads_from_the_load_and_says_so_when_it_decodes(
    tiny_runs, busy_two_threads, probe_allowed, capsys
):
    code, out, err = run_main(capsys, "translate", str(tiny_runs["translation"]), "Ein Mann.", "--beam", "1")
    assert code == 0, err
    assert probe_allowed == [cpu_share.PROBE_S] and torch.get_num_threads() == 1
    assert "CPU threads: 1 of 2 CPUs (other processes keep 1.0 busy" in err


def test_a_refused_command_says_its_refusal_alone(tiny_runs, busy_two_threads, probe_allowed, capsys):
    """The share is made before the decoder's own checks; its line waits for the first tick."""
    code, out, err = run_main(capsys, "generate", str(tiny_runs["lm"]), "--temperature", "-1")
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err


def test_show_sets_the_threads_while_it_draws_and_gives_them_back(
    tiny_runs, busy_two_threads, probe_allowed, monkeypatch
):
    from qkv.explain import standalone
    from qkv.recipes.loading import show

    seen = []
    monkeypatch.setattr(standalone, "standalone_page", lambda *a, **k: seen.append(torch.get_num_threads()))
    show(tiny_runs["lm"], "ROMEO:")
    assert seen == [1] and torch.get_num_threads() == 2
