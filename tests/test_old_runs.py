"""Run directories written before the refactor (unpacked Q/K/V projections, flat
train_config.json, encoder configs with fields the encoder never used) still load through the
public loaders and give the outputs that code computed (tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv import runs
from qkv.errors import QkvError
from qkv.inference.protein import ProteinEncoder

OLD = Path(__file__).parent / "fixtures" / "old_runs"
EXPECTED = load_file(str(OLD / "expected.safetensors"))
TOL = 1e-5


def test_old_translation_run_gives_the_same_logits():
    model, tok = runs.load_run(OLD / "translation")
    with torch.no_grad():
        logits = model(EXPECTED["mt_src"], EXPECTED["mt_tgt"]).logits
    assert (logits - EXPECTED["mt_logits"]).abs().max() <= TOL
    assert "w_qkv" in " ".join(model.state_dict()), "loaded into today's packed layout"


def test_old_lm_run_gives_the_same_logits():
    model, _ = runs.load_run(OLD / "lm", family="lm")
    with torch.no_grad():
        logits = model(EXPECTED["lm_tokens"]).logits
    assert (logits - EXPECTED["lm_logits"]).abs().max() <= TOL


def test_old_protein_run_gives_the_same_logits():
    encoder = ProteinEncoder.from_run(OLD / "protein")
    assert encoder.classes == ("non-AMP", "AMP") and encoder.level == "sequence"
    tokens = EXPECTED["protein_tokens"]
    with torch.no_grad():
        assert (encoder.model(tokens).logits - EXPECTED["protein_mlm_logits"]).abs().max() <= TOL
        cls = encoder.model.classify_sequence(tokens).logits
    assert (cls - EXPECTED["protein_cls_logits"]).abs().max() <= TOL


def test_a_changed_weight_in_an_old_run_is_noticed(tmp_path):
    """The comparison above can fail: perturb one old (unpacked) key tensor and the logits move."""
    import shutil

    from safetensors.torch import save_file

    run = tmp_path / "lm"
    shutil.copytree(OLD / "lm", run)
    weights = load_file(str(run / "model.safetensors"))
    key = next(k for k in weights if k.endswith("self_attn.w_k.weight"))
    weights[key] = weights[key] + torch.randn_like(weights[key])
    save_file(weights, str(run / "model.safetensors"))
    model, _ = runs.load_run(run, family="lm")
    with torch.no_grad():
        logits = model(EXPECTED["lm_tokens"]).logits
    assert (logits - EXPECTED["lm_logits"]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["translation", "lm", "protein"])
def test_old_runs_read_through_every_family_loader(name):
    model, tok = runs.load_run(OLD / name)
    assert not model.training and tok.vocab_size > 0


@pytest.mark.parametrize(
    "name, recipe, model_type",
    [
        ("lm", "lm", "decoder-lm"),
        ("protein", "protein-cls", "encoder"),
        ("translation", "translation", "transformer"),
        ("translation_absolute", "translation", "transformer"),
    ],
)
def test_every_old_layout_reads_through_the_one_run_directory_reader(name, recipe, model_type, tmp_path):
    """qkv.runs is the one reader of a run's files: each old layout gives its kind, its
    architecture (from the recipe where train_config.json named none) and its settings; a run of
    the first versions, with no train_config.json at all, is told by its config.json."""
    info = runs.RunInfo.read(OLD / name)
    assert (info.recipe, info.model_type.name) == (recipe, model_type)
    assert info.settings["recipe"] == recipe and runs.run_recipe(OLD / name) == recipe
    assert runs.model_type_of(OLD / name).name == model_type
    assert runs.run_settings(OLD / name) == info.settings
    if name == "protein":
        assert runs.run_json(OLD / name, "task.json")["classes"] == ["non-AMP", "AMP"]
        assert info.get("task") == "amp-scanner"
    assert runs.run_json(OLD / name, "no-such.json", missing={}) == {}
    first = tmp_path / "first"
    first.mkdir()
    (first / "config.json").write_bytes((OLD / name / "config.json").read_bytes())
    guessed = "lm" if name == "lm" else "translation" if name.startswith("translation") else None
    if guessed:
        assert runs.RunInfo.read(first).recipe == guessed and runs.run_settings(first) == {}


def test_a_run_directory_that_says_nothing_is_one_line(tmp_path):
    with pytest.raises(QkvError, match="cannot tell what kind of run"):
        runs.RunInfo.read(tmp_path)
    (tmp_path / "task.json").write_text("[1, 2]")
    with pytest.raises(QkvError, match="not a JSON object"):
        runs.run_json(tmp_path, "task.json")
    with pytest.raises(QkvError, match="cannot read"):
        runs.run_json(tmp_path, "summary.json")
