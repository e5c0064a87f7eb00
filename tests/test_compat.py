"""qkv.compat: every rule for reading what earlier versions wrote (config keys that were dropped
or renamed, the format version, the attention projections' old layout, old training states),
and the paper's modules carrying none of them."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from qkv import compat
from qkv.errors import ConfigError, QkvError
from qkv.files import load_weights, save_weights
from qkv.models import DecoderLM, LMConfig, Transformer, TransformerConfig
from qkv.models.config import EncoderConfig, ModelConfig, ViTConfig
from qkv.models.encoder import EncoderModel
from qkv.models.vit import VisionTransformer
from qkv.nn import MultiHeadAttention
from qkv.settings import resolve
from qkv.train import train_state
from qkv.train.train_settings import TrainSettings

# --------------------------------------------------------------------------- settings keys


def _qkv_classes() -> dict[str, type]:
    import qkv.models.config as configs
    import qkv.train.train_settings as train_settings

    return {
        name: obj
        for module in (configs, train_settings)
        for name, obj in vars(module).items()
        if isinstance(obj, type) and dataclasses.is_dataclass(obj)
    }


def test_every_table_entry_names_a_settings_class_and_fits_its_fields():
    """A class renamed or a field re-added would leave a rule that silently never applies."""
    classes = _qkv_classes()
    for name, dropped in compat.DROPPED_KEYS.items():
        fields = {f.name for f in dataclasses.fields(classes[name])}
        assert dropped and not set(dropped) & fields, name
    for name, renamed in compat.RENAMED_KEYS.items():
        fields = {f.name for f in dataclasses.fields(classes[name])}
        for old, (new, *_) in renamed.items():
            assert old not in fields and new in fields, (name, old)


def test_old_config_with_dropped_keys_reads_as_before(tmp_path):
    """An old protein encoder's config.json (the LM's fields at their only values) loads as
    today's config; another value is refused naming the key; a subclass inherits the rule."""
    old = {**EncoderConfig(vocab_size=30).to_dict(), "tie_embeddings": True, "bos_id": None, "eos_id": None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(old))
    assert EncoderConfig.load(path) == EncoderConfig(vocab_size=30)
    with pytest.raises(ConfigError, match="tie_embeddings .dropped: only true"):
        EncoderConfig.from_dict({**old, "tie_embeddings": False})
    with pytest.raises(ConfigError, match="unknown LMConfig keys: pooling"):
        LMConfig.from_dict({**LMConfig(vocab_size=30).to_dict(), "pooling": "cls"})

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MyEncoderConfig(EncoderConfig):
        pass

    assert compat.dropped_keys(MyEncoderConfig) == compat.dropped_keys(EncoderConfig)
    assert compat.dropped_keys(LMConfig) == {} and compat.dropped_keys(ModelConfig) == {}


def test_a_renamed_key_reads_as_today_s_key_in_files_and_overrides(tmp_path, qkv_logs):
    @dataclasses.dataclass(frozen=True)
    class Settings:
        train: TrainSettings = TrainSettings()

    assert resolve(Settings, None, ["train.amp_bf16=true"]).train.precision == "bf16"
    assert resolve(Settings, None, ["amp_bf16=false"]).train.precision == "fp32"
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"train": {"amp_bf16": True}}))
    assert resolve(Settings, path).train.precision == "bf16"
    assert "train.amp_bf16 is deprecated: read as train.precision=bf16" in qkv_logs.text
    with pytest.raises(QkvError, match="train.amp_bf16 must be bool"):
        resolve(Settings, None, ["train.amp_bf16=maybe"])


# --------------------------------------------------------------------------- format version


def test_config_json_carries_the_format_version_and_reads_back(tmp_path):
    config = LMConfig(vocab_size=30, n_layers=1)
    config.save(tmp_path / "config.json")
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["format_version"] == compat.FORMAT_VERSION and "format_version" not in config.to_dict()
    assert LMConfig.load(tmp_path / "config.json") == config
    del saved["format_version"]  # version 1: written before the key existed
    (tmp_path / "v1.json").write_text(json.dumps(saved))
    assert LMConfig.load(tmp_path / "v1.json") == config
    assert LMConfig.from_dict({**saved, "format_version": 1}) == config


@pytest.mark.parametrize("cls", [LMConfig, EncoderConfig, TransformerConfig, ViTConfig])
def test_a_newer_format_version_is_refused_in_one_line(cls, tmp_path):
    data = {**cls().to_dict(), "format_version": compat.FORMAT_VERSION + 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as info:
        cls.load(path)
    msg = str(info.value)
    assert msg.startswith(f"{path} was written by a newer qkv") and "\n" not in msg, msg
    assert f"format_version {compat.FORMAT_VERSION + 1}" in msg
    with pytest.raises(ConfigError, match="written by a newer qkv"):
        cls.from_dict(data)


@pytest.mark.parametrize("version", [0, -1, "2", 2.0, True, None])
def test_a_malformed_format_version_is_refused(version):
    with pytest.raises(ConfigError, match="format_version must be a whole number"):
        compat.check_format_version({"format_version": version}, "x")


def test_check_format_version_does_not_change_its_argument():
    data = {"format_version": 1, "d_model": 8}
    assert compat.check_format_version(data) == {"d_model": 8} and "format_version" in data
    assert compat.with_format_version({"a": 1}) == {"format_version": compat.FORMAT_VERSION, "a": 1}


# --------------------------------------------------------------------------- old projection layout


def _old_state_dict(module: MultiHeadAttention, prefix: str = "") -> dict:
    """The state dict the pre-packing code saved: separate w_q, w_k, w_v (same values)."""
    inner = module.n_heads * module.d_k
    sd = {}
    for kind in ("weight", "bias"):
        packed = (
            torch.cat([module.w_q.state_dict()[kind], module.w_kv.state_dict()[kind]])
            if module.cross
            else module.w_qkv.state_dict()[kind]
        )
        for i, name in enumerate(("w_q", "w_k", "w_v")):
            sd[f"{prefix}{name}.{kind}"] = packed[i * inner : (i + 1) * inner].clone()
        sd[f"{prefix}w_o.{kind}"] = module.w_o.state_dict()[kind].clone()
    return sd


def _unpacked(model: nn.Module) -> dict:
    """``model``'s state dict in the old layout (every attention module unpacked)."""
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            for key in [k for k in state if k.startswith(f"{name}.w_")]:
                del state[key]
            state.update(_old_state_dict(module, f"{name}."))
    return state


def test_the_paper_s_attention_module_carries_no_compatibility_hook():
    mha = MultiHeadAttention(16, 4)
    assert not mha._load_state_dict_pre_hooks
    old = _old_state_dict(MultiHeadAttention(16, 4))
    with pytest.raises(RuntimeError, match="Missing key.*w_qkv"):
        mha.load_state_dict(old)  # a bare module reads today's layout only


@pytest.mark.parametrize("cross", [False, True])
def test_old_projections_convert_to_identical_outputs(cross):
    """A state dict with w_q/w_k/w_v (the layout before packing) loads, nested in a larger
    module that asked compat to read old weights, to the same outputs; nothing is reported
    missing or unexpected."""
    torch.manual_seed(1)
    source = nn.ModuleDict({"attn": MultiHeadAttention(16, 4, cross=cross)}).eval()
    target = nn.ModuleDict({"attn": MultiHeadAttention(16, 4, cross=cross)}).eval()
    compat.read_old_weights(target)
    old = _old_state_dict(source["attn"], "attn.")
    assert "attn.w_k.weight" in old and not any("w_qkv" in k or "w_kv" in k for k in old)
    result = target.load_state_dict(old, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    kw = {"memory": memory} if cross else {}
    with torch.no_grad():
        assert torch.equal(target["attn"](x, **kw)[0], source["attn"](x, **kw)[0])


def _families():
    return [
        lambda: Transformer(
            TransformerConfig(
                src_vocab_size=20,
                tgt_vocab_size=20,
                d_model=16,
                n_heads=2,
                d_ff=32,
                n_encoder_layers=1,
                n_decoder_layers=2,
                max_len=16,
            )
        ),
        lambda: DecoderLM(
            LMConfig(
                vocab_size=20,
                d_model=16,
                n_heads=2,
                d_ff=32,
                n_layers=2,
                max_len=16,
                positional="rotary",
                bias=True,
            )
        ),
        lambda: EncoderModel(
            EncoderConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=16, num_labels=2)
        ),
        lambda: VisionTransformer(
            ViTConfig(d_model=16, n_heads=2, d_ff=32, n_layers=1, image_size=8, patch_size=4, max_len=8)
        ),
    ]


@pytest.mark.parametrize("family", range(4))
def test_every_model_family_reads_old_weights_files_to_identical_outputs(family, tmp_path):
    """Through load_weights (safetensors, the path of every run directory) and through
    load_state_dict (a train_state.pt's "model"): same tensors, same outputs."""
    torch.manual_seed(family)
    make = _families()[family]
    source = make().eval()
    old = _unpacked(source)
    assert any(k.endswith("w_k.weight") for k in old) and not any("w_qkv" in k for k in old)
    once: dict[int, str] = {}  # tied weights are stored once, as save_weights does
    for key in sorted(old):
        once.setdefault(old[key].data_ptr(), key)
    save_file({k: old[k].contiguous() for k in once.values()}, str(tmp_path / "old.safetensors"))
    by_file, by_state = make().eval(), make().eval()
    load_weights(by_file, tmp_path / "old.safetensors")
    by_state.load_state_dict(old, strict=True)
    for model in (by_file, by_state):
        for name, p in source.state_dict().items():
            assert torch.equal(model.state_dict()[name], p), name
    x = (torch.randn(2, 1, 8, 8),) if family == 3 else (torch.randint(3, 20, (2, 5)),)
    if family == 0:
        x = (*x, torch.randint(3, 20, (2, 4)))
    with torch.no_grad():
        assert torch.equal(by_file(*x).logits, source(*x).logits)


def test_an_incomplete_old_file_reports_what_is_missing_by_name(tmp_path):
    """Only a complete old projection is rewritten: the packed key is reported missing and the
    old keys left over unexpected, by name (the comparison can fail)."""

    def make():
        return nn.ModuleDict(
            {
                "self_attn": MultiHeadAttention(16, 4),
                "cross_attn": MultiHeadAttention(16, 4, cross=True),
            }
        ).eval()

    source, target = make(), make()
    compat.read_old_weights(target)
    old = {
        **_old_state_dict(source["self_attn"], "self_attn."),
        **_old_state_dict(source["cross_attn"], "cross_attn."),
    }
    del old["self_attn.w_v.weight"]
    save_file(old, str(tmp_path / "broken.safetensors"))
    with pytest.raises(QkvError) as err:
        load_weights(target, tmp_path / "broken.safetensors")
    missing, unexpected = str(err.value).split("unexpected")
    assert "self_attn.w_qkv.weight" in missing and "self_attn.w_qkv.bias" not in missing
    assert "self_attn.w_q.weight" in unexpected and "self_attn.w_k.weight" in unexpected
    assert "cross_attn" not in str(err.value)


def test_today_s_weights_pass_unchanged(tmp_path):
    model = DecoderLM(LMConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16))
    state = model.state_dict()
    before = dict(state)
    compat.upgrade_state_dict(state, model)
    assert list(state) == list(before) and all(state[k] is before[k] for k in state)


# --------------------------------------------------------------------------- old training states


def _lm() -> DecoderLM:
    return DecoderLM(LMConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=16))


def test_an_old_train_state_upgrades(tmp_path):
    """Before the weights moved into train_state.pt and before per-process streams: the weights
    come from last.safetensors, the RNG states become a one-process list with no NumPy stream,
    and the process count is one."""
    torch.manual_seed(0)
    trained = _lm()
    save_weights(trained, tmp_path / "last.safetensors")
    py_state, torch_state = random.getstate(), torch.get_rng_state()
    old = {"step": 7, "optimizer": {}, "py_rng": py_state, "torch_rng": torch_state}
    model = _lm()
    new = train_state.upgrade_train_state(old, tmp_path, model)
    assert new["world_size"] == 1 and new["step"] == 7
    assert len(new["rng"]) == 1 and new["rng"][0]["numpy"] is None and new["rng"][0]["cuda"] == []
    assert new["rng"][0]["python"] == py_state and torch.equal(new["rng"][0]["torch"], torch_state)
    assert "py_rng" not in new and "torch_rng" not in new and "py_rng" in old  # old left alone
    for name, p in trained.state_dict().items():
        assert torch.equal(new["model"][name], p), name


def test_an_old_train_state_without_its_weights_file_is_refused(tmp_path):
    old = {"step": 1, "py_rng": random.getstate(), "torch_rng": torch.get_rng_state()}
    with pytest.raises(QkvError, match="weights file not found"):
        train_state.upgrade_train_state(old, tmp_path, _lm())


def test_today_s_train_state_passes_unchanged(tmp_path):
    state = {
        "step": 3,
        "model": _lm().state_dict(),
        "world_size": 2,
        "rng": [{"python": random.getstate(), "torch": torch.get_rng_state(), "numpy": None, "cuda": []}] * 2,
    }
    new = train_state.upgrade_train_state(state, tmp_path, _lm())
    assert new.keys() == state.keys() and all(new[k] is state[k] for k in state)


def test_the_atomic_writers_write_on_any_rank(tmp_path, monkeypatch):
    """A library caller on torchrun rank 1 gets its file: which process writes a training run's
    files is the run's decision (rank 0), not the writer's."""
    from qkv import distributed
    from qkv.files import write_json

    monkeypatch.setattr(distributed, "is_main", lambda: False)
    write_json(tmp_path / "a.json", {"x": 1})
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
