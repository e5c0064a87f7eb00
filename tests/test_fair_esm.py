"""fair-esm ESM-2 → qkv: a random ``esm.model.esm2.ESM2`` (fair-esm's own code, no weights)
converted gives the same masked-LM logits, with and without ``<mask>`` tokens (token dropout
rescales every embedding by the observed mask ratio), and ``.pt`` checkpoints load safely."""

from __future__ import annotations

import argparse

import pytest
import torch

from qkv.errors import QkvError
from qkv.hub.fair_esm import ESM_ALPHABET, MASK_ID, from_fair_esm, load_fair_esm, named_sizes

esm = pytest.importorskip("esm")

SEQ = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQAPILSRVGDGTQDNLSGAEKAVQVKVKALPDAQFEVVHSLAKWKRQTLG"


def random_esm2(seed: int = 0, layers: int = 2, dim: int = 64, heads: int = 4):
    """A random fair-esm ESM2 in eval mode. Its token embeddings are redrawn at std 0.1 so the
    logits are of order 1 as a trained model's are (fair-esm's N(0, 1) initialisation gives
    logits near 30, where float32 rounding alone reaches 1e-5), and the parameters its
    initialisation sets to constants (LayerNorms, biases, the contact regression) are drawn
    too, so that a mix-up between them would show."""
    torch.manual_seed(seed)
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    model = esm.model.esm2.ESM2(
        num_layers=layers, embed_dim=dim, attention_heads=heads, alphabet=alphabet, token_dropout=True
    ).eval()
    with torch.no_grad():
        model.embed_tokens.weight.normal_(0, 0.1)
        model.embed_tokens.weight[alphabet.padding_idx] = 0
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias") or "contact_head" in name:
                p.normal_(1.0 if name.endswith("norm.weight") else 0.0, 0.1)
    return model, alphabet


@pytest.fixture(scope="module")
def pair():
    model, alphabet = random_esm2()
    return model, alphabet, from_fair_esm(model.state_dict(), 2, 64, 4)


def test_alphabet_is_fair_esms():
    alphabet = esm.data.Alphabet.from_architecture("ESM-1b")
    assert list(ESM_ALPHABET) == alphabet.all_toks and alphabet.mask_idx == MASK_ID


def test_tokenizer_frames_like_fair_esms_batch_converter(pair):
    _, alphabet, conv = pair
    _, _, tokens = alphabet.get_batch_converter()([("a", SEQ)])
    assert conv.tokenizer.encode(SEQ) == tokens[0].tolist()


@pytest.mark.parametrize("masked", [(), (3, 40), tuple(range(1, 30))])
def test_logits_match_fair_esm(pair, masked):
    model, alphabet, conv = pair
    _, _, tokens = alphabet.get_batch_converter()([("a", SEQ), ("b", SEQ[:50])])  # b is padded
    tokens[:, list(masked)] = alphabet.mask_idx
    with torch.no_grad():
        ref = model(tokens)["logits"]
        ours = conv.model(tokens).logits
    real = tokens != alphabet.padding_idx
    assert (ours - ref)[real].abs().max() <= 1e-5


def test_contact_regression_is_kept(pair):
    model, _, conv = pair
    kept = conv.kept
    assert set(kept) == {"esm.contact_head.regression.weight", "esm.contact_head.regression.bias"}
    assert torch.equal(kept["esm.contact_head.regression.weight"], model.contact_head.regression.weight)


def test_checkpoint_file_with_fairseq_prefix_and_regression(tmp_path, pair):
    model, _, conv = pair
    state = model.state_dict()
    regression = {k: v for k, v in state.items() if k.startswith("contact_head.")}
    body = {f"encoder.sentence_encoder.{k}": v for k, v in state.items() if k not in regression}
    cfg = argparse.Namespace(
        encoder_layers=2, encoder_embed_dim=64, encoder_attention_heads=4, token_dropout=True
    )
    path = tmp_path / "esm2_tiny.pt"
    torch.save({"model": body, "cfg": {"model": cfg}}, path)
    torch.save({"model": regression}, tmp_path / "esm2_tiny-contact-regression.pt")
    loaded = load_fair_esm(path)
    tokens = torch.tensor([conv.tokenizer.encode(SEQ)])
    assert torch.equal(loaded.model(tokens).logits, conv.model(tokens).logits)
    assert torch.equal(loaded.kept["esm.contact_head.regression.bias"], model.contact_head.regression.bias)


def test_refusals(tmp_path, pair):
    model, _, _ = pair
    with pytest.raises(QkvError, match="unknown tensor.*layers.0.bogus"):
        from_fair_esm({**model.state_dict(), "layers.0.bogus": torch.zeros(1)}, 2, 64, 4)
    with pytest.raises(QkvError, match="shape"):
        from_fair_esm(model.state_dict(), 2, 32, 4)  # sizes that are not the state dict's
    evil = tmp_path / "evil.pt"
    torch.save({"model": {}, "cfg": {"model": QkvError("a pickled object")}}, evil)
    with pytest.raises(QkvError, match="refused .*never unpickles"):
        load_fair_esm(evil)
    with pytest.raises(QkvError, match="not found"):
        load_fair_esm(tmp_path / "missing.pt")
    plain = tmp_path / "plain.pt"
    torch.save({"model": {}}, plain)
    with pytest.raises(QkvError, match="not a fair-esm checkpoint qkv can read \\(no .args.\\)"):
        load_fair_esm(plain)


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("esm2_t6_8M_UR50D", (6, 320)),
        ("esm2_t12_35M_UR50D", (12, 480)),
        ("esm2_t30_150M_UR50D", (30, 640)),
        ("esm2_t33_650M_UR50D", (33, 1280)),
        ("esm2_t36_3B_UR50D", (36, 2560)),
        ("esm2_t48_15B_UR50D", (48, 5120)),
        ("esm1b_t33_650M_UR50S", (33, 1280)),
        ("esm1v_t33_650M_UR90S_3", (33, 1280)),
        ("esm1_t34_670M_UR50S", (34, 1280)),
        ("esm1_t6_43M_UR50S", (6, 768)),
        ("esm_msa1b_t12_100M_UR50S", (12, 768)),
        ("esm2_t33_650M_UR50D_finetuned", (33, 1280)),  # what follows the size is not read
        ("esm2_tiny", None),
        ("esm2_t7_1M_UR50D", None),  # no released model of that size
        ("my_model", None),
    ],
)
def test_esm_names_state_their_layers_and_width(name, sizes):
    assert named_sizes(name) == sizes


def test_a_file_named_as_an_esm_model_must_have_its_sizes(tmp_path, pair):
    model, _, _ = pair  # 2 layers of width 64
    cfg = argparse.Namespace(encoder_layers=2, encoder_embed_dim=64, encoder_attention_heads=4)
    # both sizes wrong; the width wrong; the width wrong under a suffix of one's own
    for name in ("esm2_t6_8M_UR50D", "esm2_t2_8M_UR50D", "esm2_t2_35M_UR50D_mine"):
        path = tmp_path / f"{name}.pt"
        torch.save({"model": model.state_dict(), "cfg": {"model": cfg}}, path)
        layers, width = named_sizes(name)
        with pytest.raises(QkvError) as caught:
            load_fair_esm(path)
        assert str(caught.value) == (
            f"{path}: the name {name} says {layers} layers of width {width}, but the checkpoint holds 2 "
            "layers of width 64; a file named as an ESM model must be that model (rename it)"
        )
    path = tmp_path / "esm2_t2_8M_UR50D.pt"
    path.rename(tmp_path / "two_layers.pt")  # a name that is no ESM model's: not checked
    assert len(load_fair_esm(tmp_path / "two_layers.pt").model.layers) == 2
