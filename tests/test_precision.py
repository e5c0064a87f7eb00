"""Precision chosen for the hardware: ``train.precision=auto|fp32|bf16`` (bf16 autocast only
where bfloat16 is native), its record in ``train_config.json``, the old ``amp_bf16`` key, and
``qkv generate --dtype auto``. The CPU probe is mocked, so these hold on any machine."""

from __future__ import annotations

import ast
import json
import logging
import os
from pathlib import Path

import pytest
import torch

from qkv import device as qdevice
from qkv.cli import main
from qkv.device import cpu_has_amx_bf16, cpu_has_native_bf16, resolve_precision
from qkv.errors import QkvError
from qkv.inference.lm import TextGenerator
from qkv.recipes.lm import LMRun, LMSettings
from qkv.recipes.translation import TranslationSettings
from qkv.settings import field_names, resolve
from qkv.train.loop import train_loop
from qkv.train.train_settings import TrainSettings

CPU = torch.device("cpu")
OLD_RUNS = Path(__file__).parent / "fixtures" / "old_runs"
DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


def _cpu(monkeypatch, native: bool, amx: bool | None = None) -> None:
    """A CPU with (``native``) or without native bfloat16; with it, AMX units unless ``amx=False``
    (AVX512_BF16 only)."""
    monkeypatch.setattr(qdevice, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(qdevice, "cpu_has_amx_bf16", lambda: native if amx is None else amx)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# ---------------------------------------------------------------- the rule


def test_auto_is_fp32_on_a_cpu_without_native_bf16(monkeypatch, qkv_logs):
    _cpu(monkeypatch, False)
    precision, why = resolve_precision("auto", CPU)
    assert precision == "fp32"
    assert why.startswith("auto: CPU (") and why.endswith("lacks native bfloat16"), why
    assert _warnings(qkv_logs) == [], "auto never warns: it picks what is fast"


def test_auto_is_bf16_on_a_cpu_with_amx(monkeypatch, qkv_logs):
    _cpu(monkeypatch, True)
    assert resolve_precision("auto", CPU) == (
        "bf16",
        f"auto: CPU ({qdevice.cpu_capability()}) has AMX bfloat16 units",
    )
    assert _warnings(qkv_logs) == []


def test_auto_is_fp32_on_a_cpu_with_avx512_bf16_but_no_amx(monkeypatch, qkv_logs):
    # Measured on such a CPU: bf16 matmuls at half the fp32 rate, training steps 1.39x slower.
    _cpu(monkeypatch, True, amx=False)
    precision, why = resolve_precision("auto", CPU)
    assert precision == "fp32" and why.endswith(
        "AVX512_BF16 but no AMX, where bf16 matmuls are slower than fp32"
    )
    assert _warnings(qkv_logs) == []
    assert resolve_precision("bf16", CPU) == (
        "bf16",
        f"set explicitly (no AMX on CPU ({qdevice.cpu_capability()}))",
    )
    [warning] = _warnings(qkv_logs)
    assert "no AMX is slower than fp32" in warning


def test_explicit_bf16_on_a_cpu_without_native_bf16_warns_and_is_kept(monkeypatch, qkv_logs):
    _cpu(monkeypatch, False)
    precision, why = resolve_precision("bf16", CPU)
    assert precision == "bf16" and why.startswith("set explicitly (emulated on CPU")
    [warning] = _warnings(qkv_logs)
    assert "emulated" in warning and "many times slower than fp32" in warning
    assert all(r.name == "qkv.device" for r in qkv_logs.records if r.levelno == logging.WARNING)


def test_explicit_choices_on_a_native_cpu(monkeypatch, qkv_logs):
    _cpu(monkeypatch, True)
    assert resolve_precision("bf16", CPU) == ("bf16", "set explicitly")
    assert resolve_precision("fp32", CPU) == ("fp32", "set explicitly")
    assert _warnings(qkv_logs) == []


def test_mps_auto_is_fp32_and_explicit_bf16_is_not_called_emulated(qkv_logs):
    mps = torch.device("mps")  # only the type is read: no Apple GPU needed
    precision, why = resolve_precision("auto", mps)
    assert precision == "fp32" and "MPS" in why
    assert resolve_precision("bf16", mps) == ("bf16", "set explicitly")
    assert _warnings(qkv_logs) == []


def test_unknown_precision_is_a_clean_error():
    with pytest.raises(QkvError, match="unknown precision 'fp16'"):
        resolve_precision("fp16", CPU)


def test_cpu_probe_reads_capabilities_and_never_raises(monkeypatch):
    monkeypatch.setattr(
        torch.cpu, "get_capabilities", lambda: {"avx2": True, "amx_bf16": True}, raising=False
    )
    assert cpu_has_native_bf16() is True and cpu_has_amx_bf16() is True
    monkeypatch.setattr(
        torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True, "amx_bf16": False}, raising=False
    )
    assert cpu_has_native_bf16() is True and cpu_has_amx_bf16() is False
    monkeypatch.setattr(
        torch.cpu, "get_capabilities", lambda: {"avx2": True, "avx512_bf16": False}, raising=False
    )
    assert cpu_has_native_bf16() is False and cpu_has_amx_bf16() is False

    def broken(*args, **kwargs):
        raise RuntimeError("no cpuinfo")

    # An older torch without get_capabilities: /proc/cpuinfo flags; unreadable too: no bf16.
    monkeypatch.setattr(torch.cpu, "get_capabilities", broken, raising=False)
    monkeypatch.setattr(Path, "read_text", lambda self, **kw: "flags : fpu avx2 avx512_bf16 sse")
    assert cpu_has_native_bf16() is True and cpu_has_amx_bf16() is False
    monkeypatch.setattr(Path, "read_text", lambda self, **kw: "flags : avx512_bf16 amx_bf16 amx_tile")
    assert cpu_has_amx_bf16() is True
    monkeypatch.setattr(Path, "read_text", broken)
    assert cpu_has_native_bf16() is False and cpu_has_amx_bf16() is False


# ---------------------------------------------------------------- settings and the old key


def test_precision_replaces_amp_bf16_in_train_settings():
    assert TrainSettings().precision == "auto"
    assert not hasattr(TrainSettings(), "amp_bf16")
    with pytest.raises(ValueError, match="precision must be one of 'auto', 'fp32', 'bf16'"):
        TrainSettings(precision="fp16")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("amp_bf16=true", "bf16"),
        ("train.amp_bf16=true", "bf16"),
        ("amp_bf16=false", "fp32"),
        ("train.amp_bf16=false", "fp32"),
    ],
)
def test_amp_bf16_override_is_read_as_precision_with_a_deprecation_warning(override, expected, qkv_logs):
    assert resolve(LMSettings, None, [override]).train.precision == expected
    [warning] = _warnings(qkv_logs)
    assert warning == f"{override.split('=')[0]} is deprecated: read as train.precision={expected}"


@pytest.mark.parametrize("data", [{"train": {"amp_bf16": True}}, {"amp_bf16": True}], ids=["nested", "flat"])
def test_amp_bf16_in_a_config_file_is_read_as_precision(tmp_path, data, qkv_logs):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    assert resolve(LMSettings, path).train.precision == "bf16"
    assert resolve(LMSettings, path, ["train.precision=auto"]).train.precision == "auto", (
        "a later key wins, as for any key"
    )
    assert any("amp_bf16 is deprecated" in w for w in _warnings(qkv_logs))


def test_amp_bf16_bad_value_and_wrong_section_are_refused():
    with pytest.raises(QkvError) as err:
        resolve(LMSettings, None, ["amp_bf16=maybe", "model.amp_bf16=true"])
    msg = str(err.value)
    assert "amp_bf16 must be bool (true or false), got 'maybe'" in msg
    assert "unknown key model.amp_bf16" in msg


def test_old_run_settings_with_amp_bf16_resolve(tmp_path):
    """An old run's settings (flat, ``amp_bf16: false``), less its provenance keys, resolve."""
    old = json.loads((OLD_RUNS / "translation" / "train_config.json").read_text())
    assert old["amp_bf16"] is False
    names = {n.rsplit(".", 1)[-1] for n in field_names(TranslationSettings)}
    path = tmp_path / "old.json"
    path.write_text(json.dumps({k: v for k, v in old.items() if k in names or k == "amp_bf16"}))
    assert resolve(TranslationSettings, path).train.precision == "fp32"


# ---------------------------------------------------------------- the loop and the recipes


def test_train_loop_autocasts_only_for_bf16(monkeypatch, tmp_path):
    seen = []

    def loss_fn(model, batch):
        seen.append(torch.is_autocast_enabled("cpu"))
        return model(batch).sum(), 1

    def autocast(cfg_precision: str, precision: str | None = None) -> bool:
        model = torch.nn.Linear(4, 1)
        train_loop(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            lambda s, used: 0.1,
            lambda epoch: [torch.ones(2, 4)],
            loss_fn,
            None,
            tmp_path / str(len(seen)),
            TrainSettings(max_steps=1, snapshot_minutes=1e9, precision=cfg_precision),
            progress=False,
            precision=precision,
        )
        return seen.pop()

    assert autocast("fp32", precision="bf16") is True, "the resolved precision passed in wins"
    assert autocast("bf16", precision="fp32") is False
    _cpu(monkeypatch, False)
    assert autocast("auto") is False, "none passed: the settings' precision, resolved here"
    _cpu(monkeypatch, True)
    assert autocast("auto") is True


needs_data = pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)


@needs_data
def test_a_real_run_logs_and_records_the_resolved_precision(monkeypatch, tmp_path, qkv_logs):
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    _cpu(monkeypatch, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # auto must mean this CPU
    import qkv.train.run as skeleton

    passed = []

    def recording_loop(*args, **kwargs):
        passed.append(kwargs.get("precision"))
        return train_loop(*args, **kwargs)

    monkeypatch.setattr(skeleton, "train_loop", recording_loop)  # what every recipe's run calls
    recipe = resolve(
        LMSettings,
        None,
        [
            "train.max_steps=2",
            "train.eval_every=2",
            "train.device=auto",
            "sample_tokens=5",
            "num_samples=1",
            "d_model=16",
            "n_heads=2",
            "d_ff=32",
            "n_layers=1",
            "eval_batches=2",
        ],
    )
    LMRun.train(recipe, tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["train"]["precision"] == "auto", "the setting as given"
    assert saved["resolved"] == {
        "device": "cpu",
        "precision": "fp32",
        "processes": 1,
        "why": f"auto: CPU ({qdevice.cpu_capability()}) lacks native bfloat16",
    }
    assert passed == ["fp32"]
    info = [r.getMessage() for r in qkv_logs.records if r.levelno == logging.INFO]
    assert f"device: cpu (no CUDA or MPS), {torch.get_num_threads()} threads" in info
    assert any(m.startswith("precision: fp32 (auto: CPU (") for m in info), info


# ---------------------------------------------------------------- qkv generate --dtype


def _generate_dtype(monkeypatch, capsys, run_dir, *args: str) -> tuple[torch.dtype, str]:
    dtypes = []
    real = TextGenerator.from_run.__func__

    def recording(cls, *a, **kw):
        gen = real(cls, *a, **kw)
        dtypes.append(next(gen.model.parameters()).dtype)
        return gen

    monkeypatch.setattr(TextGenerator, "from_run", classmethod(recording))
    capsys.readouterr()
    assert (
        main(
            ["generate", str(run_dir), "--prompt", "ROMEO", "--max-new-tokens", "2", "--device", "cpu", *args]
        )
        == 0
    )
    [dtype] = dtypes
    # the entry point's thread line (qkv.cpu_share.for_command) is said by every decoding verb
    err = capsys.readouterr().err.splitlines(keepends=True)
    return dtype, "".join(line for line in err if not line.startswith("CPU threads: "))


def test_generate_dtype_auto_is_float32_on_a_cpu_without_native_bf16(monkeypatch, capsys, tiny_runs):
    _cpu(monkeypatch, False)
    assert _generate_dtype(monkeypatch, capsys, tiny_runs["lm"]) == (torch.float32, ""), (
        "the default is auto, and it says nothing on stderr"
    )
    assert _generate_dtype(monkeypatch, capsys, tiny_runs["lm"], "--dtype", "auto")[0] == torch.float32


def test_generate_dtype_auto_is_bfloat16_on_a_cpu_with_amx(monkeypatch, capsys, tiny_runs):
    _cpu(monkeypatch, True)
    assert _generate_dtype(monkeypatch, capsys, tiny_runs["lm"], "--dtype", "auto")[0] == torch.bfloat16
    assert _generate_dtype(monkeypatch, capsys, tiny_runs["lm"], "--dtype", "float32")[0] == torch.float32


def test_generate_explicit_bfloat16_on_a_cpu_with_avx512_bf16_only_does_not_warn(
    monkeypatch, capsys, tiny_runs
):
    """Decoding streams weights, so bf16 pays without AMX too: no training-style warning."""
    _cpu(monkeypatch, True, amx=False)
    dtype, err = _generate_dtype(monkeypatch, capsys, tiny_runs["lm"], "--dtype", "bfloat16")
    assert dtype == torch.bfloat16 and "warning" not in err, err
    assert _generate_dtype(monkeypatch, capsys, tiny_runs["lm"])[0] == torch.float32, "auto stays fp32"


def test_generate_explicit_bfloat16_on_a_cpu_without_native_bf16_warns(monkeypatch, capsys, tiny_runs):
    _cpu(monkeypatch, False)
    dtype, err = _generate_dtype(monkeypatch, capsys, tiny_runs["lm"], "--dtype", "bfloat16")
    assert dtype == torch.bfloat16
    assert err.startswith("warning: bf16 on CPU (") and "emulated" in err, err


def test_every_recipe_passes_its_resolved_precision_to_the_loop():
    """The one run flow (``qkv.train.run``) calls ``train_loop(..., precision=self.context.precision)``
    and records what ``self.context`` resolved with the settings; no recipe calls the loop or
    writes its settings itself (so none can forget either)."""
    src = Path(__file__).resolve().parents[1] / "src" / "qkv"

    def calls(name: str) -> dict[str, ast.Call]:
        tree = ast.parse((src / f"{name}.py").read_text(encoding="utf-8"))
        return {
            c.func.id: c for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
        }

    flow = calls("train/run")
    loop_kwargs = {k.arg: ast.unparse(k.value) for k in flow["train_loop"].keywords}
    assert loop_kwargs["precision"] == "self.context.precision"
    assert "self.context.to_dict()" in [ast.unparse(a) for a in flow["write_settings"].args]
    for name in (
        "translation",
        "lm",
        "protein_mlm",
        "protein_tasks",
        "text_cls",
        "vit",
        "caption",
        "diffusion_lm",
    ):
        assert not {"train_loop", "write_settings", "start_run"} & set(calls(f"recipes/{name}")), name
