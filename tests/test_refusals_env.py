"""Bad input refused in one line before any work or write (issue 69, item 2): the environment
variables qkv reads (``QKV_THREADS``, ``QKV_CPU_SHARE``, ``OMP_NUM_THREADS``, one parser, checked
by the CLI before any verb), model-config floats that float32 cannot hold, the ONNX opset
outside what the installed exporter writes (and ``onnx.json`` recording the opset the graphs
have), an ONNX folder under a file, fair-esm pickles crafted to trip the unpickler, and the
dry run's torch cache folder."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import tempfile
import typing
from pathlib import Path

import pytest
import torch
from cli_runs import TINY_LM, qkv, refused, run_main

from qkv import cpu_share
from qkv.errors import ConfigError, QkvError
from qkv.models import config as model_config
from qkv.settings import float32_problems

# ---------------------------------------------------------------- environment variables


def _verb(verb: str, runs: dict, tmp: Path) -> tuple[list[str], Path | None]:
    """The command line of ``verb`` on the tiny runs, and the path it would write (``None``:
    it writes nothing of its own: its output is stdout)."""
    fasta = tmp / "in.fasta"
    fasta.write_text(">a\nMKTAYIAKQR\n>b\nMKKLLE\n")
    out = tmp / "out"
    return {
        "generate": (["generate", str(runs["lm"]), "--prompt", "ROMEO", "--max-new-tokens", "2"], None),
        "train": (["train", "lm", "--out", str(out), "--max-minutes", "0.02", *TINY_LM], out),
        "embed": (["embed", str(runs["protein"]), str(fasta), "--out", str(out)], out),
        "explain --html": (["explain", str(runs["lm"]), "--input", "ROMEO", "--html", str(out)], out),
        "translate": (["translate", str(runs["translation"]), "Ein Mann fährt."], None),
        "train --dry-run": (["train", "lm", "--dry-run", *TINY_LM], None),
    }[verb]


# the review's 13 cases: every verb, every value
REVIEW_CASES = [
    ("generate", "0"),
    ("generate", " 2x"),
    ("train", "-1"),
    ("train", "abc"),
    ("embed", "abc"),
    ("embed", "0"),
    ("embed", " 2x"),
    ("explain --html", "-1"),
    ("explain --html", " 2x"),
    ("translate", "0"),
    ("translate", "abc"),
    ("train --dry-run", "-1"),
    ("train --dry-run", " 2x"),
]


@pytest.mark.parametrize(("verb", "value"), REVIEW_CASES)
def test_a_bad_qkv_threads_refuses_every_verb_before_it_writes(tiny_runs, tmp_path, verb, value):
    args, out = _verb(verb, tiny_runs, tmp_path)
    done = qkv(*args, cwd=tmp_path, env={"QKV_THREADS": value})
    line = refused(done, f"QKV_THREADS={value!r}", "a whole number from 1")
    assert "internal error" not in line
    assert out is None or not out.exists(), f"{verb} wrote {out}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fasta"], "nothing else written"


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("QKV_CPU_SHARE", "maybe", "one of 1, true, on, yes, 0, false, off, no"),
        ("QKV_CPU_SHARE", "2", "one of 1"),
        ("OMP_NUM_THREADS", "abc", "separated by commas"),
        ("OMP_NUM_THREADS", "4,0", "separated by commas"),
        ("OMP_NUM_THREADS", "3,", "separated by commas"),
        ("QKV_THREADS", "9" * 5000, "5000 characters"),
    ],
)
def test_the_other_variables_refuse_a_verb_in_one_line(
    tiny_runs, tmp_path, monkeypatch, capsys, name, value, needle
):
    """In this process (torch is loaded: an OMP_NUM_THREADS that libgomp refuses would add its
    own line to a new process's stderr before qkv runs)."""
    monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    line = refused(run_main(capsys, "train", "lm", "--out", str(out), *TINY_LM), name, needle)
    assert len(line) < 300
    assert not out.exists()


@pytest.mark.parametrize(
    ("env", "share", "threads"),
    [
        ({}, True, None),
        ({"QKV_THREADS": "", "OMP_NUM_THREADS": " ", "QKV_CPU_SHARE": ""}, True, None),  # empty: unset
        ({"QKV_THREADS": " 3 "}, True, 3),
        ({"QKV_THREADS": "2", "OMP_NUM_THREADS": "4"}, True, 2),
        ({"OMP_NUM_THREADS": "4, 2"}, True, 4),  # libgomp's nested list: qkv takes the first
        ({"OMP_NUM_THREADS": "+03"}, True, 3),
        ({"QKV_CPU_SHARE": " OFF "}, False, None),
        ({"QKV_CPU_SHARE": "no"}, False, None),
        ({"QKV_CPU_SHARE": "Yes", "QKV_THREADS": "1"}, True, 1),
    ],
)
def test_the_variables_qkv_reads_are_parsed_in_one_place(env, share, threads):
    assert cpu_share.read_environment(env) == cpu_share.ThreadEnvironment(share, threads)
    assert cpu_share.enabled(env) is share and cpu_share.pinned_threads(None, env) == threads


@pytest.mark.parametrize(
    "env",
    [
        {"QKV_THREADS": "0"},
        {"QKV_THREADS": "-1"},
        {"QKV_THREADS": "2.0"},
        {"QKV_THREADS": "٣"},  # a digit, but not one libgomp or a user means
        {"QKV_THREADS": str(2**31)},  # beyond torch.set_num_threads' C int
        {"OMP_NUM_THREADS": "1e2"},
        {"QKV_CPU_SHARE": "enabled"},
    ],
)
def test_library_callers_get_the_same_refusal(env):
    """pinned_threads and enabled raise the CLI's error (a ConfigError: a QkvError and a
    ValueError), whatever ``train.threads`` says: a bad variable is bad whichever one wins."""
    (name,) = env
    for call in (lambda: cpu_share.pinned_threads(2, env), lambda: cpu_share.enabled(env)):
        with pytest.raises(ConfigError, match=f"^environment variable {name}=") as caught:
            call()
        assert "\n" not in str(caught.value)


def test_a_cpu_share_reads_the_environment_through_the_parser(monkeypatch):
    monkeypatch.setenv("QKV_THREADS", "abc")
    with pytest.raises(QkvError, match="QKV_THREADS='abc'"):
        cpu_share.CpuShare()


# ---------------------------------------------------------------- float32 model settings


def _model_configs() -> list[type]:
    """Every model config class (the families' and their bases that are built)."""
    return [
        cls
        for cls in vars(model_config).values()
        if isinstance(cls, type)
        and issubclass(cls, model_config.SavedConfig)
        and dataclasses.is_dataclass(cls)
    ]


def _float_fields() -> list[tuple[type, str]]:
    out = []
    for cls in _model_configs():
        hints = typing.get_type_hints(cls)
        out += [(cls, f.name) for f in dataclasses.fields(cls) if hints[f.name] is float]
    return out


def test_every_float_model_setting_is_checked():
    """The rule walks the annotations: every float field of every family is under it."""
    names = {name for _, name in _float_fields()}
    assert {"dropout", "attention_dropout", "activation_dropout", "layer_norm_eps", "dyt_alpha"} <= names
    assert {cls.__name__ for cls, _ in _float_fields()} >= {"LMConfig", "TransformerConfig", "RNNConfig"}


@pytest.mark.parametrize(("cls", "name"), _float_fields(), ids=lambda x: getattr(x, "__name__", x))
def test_a_float_model_setting_float32_cannot_hold_is_refused_naming_it(cls, name):
    with pytest.raises(ConfigError, match=rf"\b{name} \(1e\+308\)") as caught:
        cls(**{name: 1e308})
    assert "\n" not in str(caught.value)
    message = str(caught.value)
    assert message.count(f"{name} (") == 1, "one problem per field"


@pytest.mark.parametrize(
    ("name", "value", "needle"),
    [
        ("dyt_alpha", 1e308, "does not fit in float32"),
        ("layer_norm_eps", 1e-300, "is 0 in float32"),
        ("dyt_alpha", 10**40, "does not fit in float32"),  # an int beyond float32, from JSON
    ],
)
def test_overflow_and_underflow_name_the_setting(name, value, needle):
    with pytest.raises(ConfigError, match=f"{name} .*{needle}"):
        model_config.LMConfig(**{name: value})


@dataclasses.dataclass
class Floats:
    x: float = 0.0
    y: float | None = None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (-3.5e38, "x (-3.5e+38) does not fit in float32"),
        (-1e-300, "x (-1e-300) is 0 in float32"),
        (float("nan"), "x (nan) does not fit in float32"),  # standalone: no earlier check named it
        (-3.4e38, None),
        (0.0, None),
        (1.5e-45, None),  # float32's smallest subnormal
    ],
)
def test_the_float32_rule(value, problem):
    found = float32_problems(Floats(x=value, y=value))
    if problem is None:
        assert found == []
    else:
        assert found[0].startswith(problem) and found[1].startswith(problem.replace("x (", "y ("))
        assert float32_problems(Floats(x=value), named=["x must be a finite number"]) == []
    config = model_config.LMConfig(dyt_alpha=3e38, layer_norm_eps=1e-44, dropout=0.0)
    assert config.dyt_alpha == 3e38 and float32_problems(config) == []


@pytest.mark.parametrize(
    "override", ["model.dyt_alpha=1e308", "model.layer_norm_eps=1e-300", "model.attention_dropout=1e308"]
)
def test_the_review_overflow_is_refused_before_the_run_folder_exists(tmp_path, capsys, override):
    out = tmp_path / "R"
    line = refused(run_main(capsys, "train", "lm", "--out", str(out), override), override.split("=")[0][6:])
    assert "internal error" not in line
    assert "float32" in line or "must be in [0, 1)" in line
    assert not out.exists()


def test_a_config_json_float32_cannot_hold_is_refused_naming_file_and_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**model_config.LMConfig(vocab_size=10).to_dict(), "dyt_alpha": 1e300}))
    with pytest.raises(ConfigError, match=rf"{path}.*dyt_alpha \(1e\+300\) does not fit in float32"):
        model_config.LMConfig.load(path)


# ---------------------------------------------------------------- ONNX


@pytest.fixture
def onnx_export():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    from qkv.hub import onnx_export

    return onnx_export


def test_the_opset_range_is_the_installed_exporters(onnx_export):
    import onnx.defs

    newest = onnx_export.max_opset()
    assert onnx_export.DEFAULT_OPSET <= newest <= onnx.defs.onnx_opset_version()
    for opset in (onnx_export.MIN_OPSET, onnx_export.DEFAULT_OPSET, newest):
        onnx_export.check_opset(opset)
    with pytest.raises(QkvError, match=f"too old.*{onnx_export.MIN_OPSET}"):
        onnx_export.check_opset(onnx_export.MIN_OPSET - 1)
    with pytest.raises(QkvError, match=f"opset {newest + 1} is too new.*{onnx_export.MIN_OPSET} to {newest}"):
        onnx_export.check_opset(newest + 1)


@pytest.mark.parametrize("opset", ["99", str(10**30)])
def test_an_opset_the_exporter_cannot_write_is_refused_before_any_work(
    onnx_export, tiny_runs, tmp_path, capsys, opset
):
    out = tmp_path / "onnx"
    line = refused(
        run_main(capsys, "convert", "--to", "onnx", str(tiny_runs["lm"]), str(out), "--opset", opset)
    )
    assert "is too new" in line and len(line) < 200
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_a_folder_under_a_file_is_refused_naming_the_users_path(onnx_export, tiny_runs, tmp_path, capsys):
    file = tmp_path / "FILE"
    file.write_text("mine")
    line = refused(run_main(capsys, "convert", "--to", "onnx", str(tiny_runs["lm"]), str(file / "sub")))
    assert f"{file / 'sub'}: cannot make a folder there, {file} is a file" in line
    assert "tmp" not in line.replace(str(tmp_path), "")  # no temporary folder named
    assert file.read_text() == "mine" and list(tmp_path.iterdir()) == [file]


def _identity_graph(path: Path, opset: int) -> None:
    """A one-node ONNX graph of ``opset``: what an exporter that could not convert writes."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))


def test_onnx_json_records_the_opset_the_graph_has(onnx_export, tiny_runs, tmp_path, monkeypatch, qkv_logs):
    """An exporter that keeps its own opset where the conversion to the one asked for fails
    (torch's does: the graph stays at 18): onnx.json says what the file holds, with a warning."""
    monkeypatch.setattr(
        onnx_export, "_export", lambda graph, path, opset: _identity_graph(path, 18) or "dynamo"
    )
    done = onnx_export.export_onnx(tiny_runs["lm"], tmp_path / "onnx", opset=20)
    manifest = onnx_export.read_manifest(done.out)
    assert manifest["opset"] == 18 and manifest["graphs"]["decoder.onnx"]["opset"] == 18
    assert onnx_export.written_opset(done.out / "decoder.onnx") == 18
    assert "could not convert the graph to opset 20; it has opset 18" in qkv_logs.text


# ---------------------------------------------------------------- fair-esm pickles

RAN: list[str] = []  # what a crafted pickle's own code would add, if it ever ran


class ReduceWithArguments:
    """Unpickled as ``argparse.Namespace("positional")``: Namespace takes keywords only."""

    def __reduce__(self):
        return (argparse.Namespace, ("positional", "arguments"))


class StateNamespaceRefuses:
    """``argparse.Namespace()`` whose state, set as ``__setstate__`` would, is no dict."""

    def __reduce__(self):
        return (argparse.Namespace, (), ["not", "a", "dict"])


class SwappedClass:
    """``argparse.Namespace()`` whose ``__class__`` the state swaps to another allowed class."""

    def __reduce__(self):
        return (argparse.Namespace, (), (None, {"__class__": collections.OrderedDict}))


class NamespaceWithSetstate(argparse.Namespace):
    """A Namespace subclass whose ``__setstate__`` is code: never to be run."""

    def __setstate__(self, state):
        RAN.append("__setstate__")


class RunsCode:
    """A pickle that runs a shell command when unpickled: it would make ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _checkpoint(path: Path, settings: object) -> Path:
    torch.save({"model": {}, "cfg": {"model": settings}}, path)
    return path


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        (ReduceWithArguments(), "TypeError"),
        (StateNamespaceRefuses(), "ValueError"),
        (SwappedClass(), "__class__ assignment"),
    ],
    ids=["reduce-with-arguments", "setstate-refused", "class-swap"],
)
def test_a_crafted_fair_esm_pickle_is_refused_in_one_line(tmp_path, settings, needle):
    from qkv.hub.fair_esm import load_fair_esm
    from qkv.hub.sapiens import read_sapiens

    path = _checkpoint(tmp_path / "crafted.pt", settings)
    with pytest.raises(QkvError, match=f"^{path} is not a fair-esm checkpoint qkv can read \\(.*{needle}"):
        load_fair_esm(path)
    # Sapiens's files are fairseq's too, read by the same reader
    with pytest.raises(QkvError, match=f"^{path} is not a Sapiens checkpoint qkv can read \\(.*{needle}"):
        read_sapiens(path, tmp_path / "dict.txt")


@pytest.mark.parametrize("kind", ["setstate", "reduce"])
def test_a_fair_esm_pickle_with_code_is_refused_and_the_code_never_runs(tmp_path, kind):
    from qkv.hub.fair_esm import load_fair_esm

    marker = tmp_path / "ran"
    settings = NamespaceWithSetstate(encoder_layers=2) if kind == "setstate" else RunsCode(marker)
    path = _checkpoint(tmp_path / "code.pt", settings)
    RAN.clear()
    with pytest.raises(QkvError, match="never unpickles code"):
        load_fair_esm(path)
    assert RAN == [] and not marker.exists()


def test_the_cli_refuses_a_crafted_fair_esm_file_and_writes_no_run(tmp_path, capsys):
    path = _checkpoint(tmp_path / "esm2_crafted.pt", SwappedClass())
    run = tmp_path / "run"
    refused(run_main(capsys, "convert", "hf", str(path), str(run)), "not a fair-esm checkpoint qkv can read")
    assert not run.exists()


def test_settings_that_are_no_numbers_are_refused_too(tmp_path):
    from qkv.hub.fair_esm import load_fair_esm

    settings = argparse.Namespace(encoder_layers=float("inf"), encoder_embed_dim=8, encoder_attention_heads=2)
    path = _checkpoint(tmp_path / "inf.pt", settings)
    with pytest.raises(QkvError, match="not a fair-esm checkpoint qkv can read .*OverflowError"):
        load_fair_esm(path)


# ---------------------------------------------------------------- the dry run's torch cache


def test_the_dry_run_leaves_no_torch_cache_folder(tmp_path):
    """The first optimizer step imports torch._dynamo, whose disk cache makes
    ``<temp dir>/torchinductor_<user>``: a new process's dry run removes the empty folder."""
    tmp, cwd = tmp_path / "tmp", tmp_path / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    env = {"TMPDIR": str(tmp)}
    done = qkv("train", "lm", "--dry-run", "--quiet", *TINY_LM, "train.threads=1", cwd=cwd, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(tmp.iterdir()) == [] and list(cwd.iterdir()) == []


@pytest.mark.parametrize("before", ["absent", "there", "cached"])
def test_only_an_empty_cache_folder_the_dry_run_made_is_removed(tmp_path, monkeypatch, before):
    from qkv.train.dry_run import _no_empty_torch_cache_left

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    folder = tmp_path / "torchinductor_someone"
    if before == "there":
        folder.mkdir()
    with _no_empty_torch_cache_left():
        (folder / "dynamo").mkdir(parents=True)  # what torch makes
        if before == "cached":
            (folder / "dynamo" / "entry").write_text("a compiled graph")
    assert folder.exists() is (before != "absent")
    if before == "cached":
        assert (folder / "dynamo" / "entry").read_text() == "a compiled graph"
