"""Run directories written before the refactor (unpacked Q/K/V projections, flat
train_config.json, encoder configs with fields the encoder never used) still load through the
public loaders and give the outputs that code computed (tests/fixtures/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv import runs
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
