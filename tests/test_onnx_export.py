"""ONNX export (``qkv convert --to onnx``): every exported family's graphs compute the model's
own numbers through onnxruntime (logits within 1e-4; incremental decoding with the exported
cache gives the same greedy tokens as qkv's decoding), the tokenizer.json reads the same ids
in Hugging Face ``tokenizers``, and bad requests are refused in one line before anything is
written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv import runs
from qkv.cli import main
from qkv.errors import QkvError
from qkv.hub.onnx_export import (
    DEFAULT_OPSET,
    MIN_OPSET,
    empty_cache,
    export_onnx,
    read_manifest,
    written_opset,
)

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOLERANCE = 1e-4  # the issue's: logits within 1e-4 of PyTorch's (float32)


def close(onnx_value: np.ndarray, torch_value: np.ndarray) -> None:
    """Equal within TOLERANCE (absolute); the same infinities (the diffusion LM's -inf mask logit)."""
    np.testing.assert_allclose(onnx_value, torch_value, rtol=0, atol=TOLERANCE)


def session(folder, name):
    return ort.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exported(tiny_runs, tiny_vit_run, tiny_caption_run, tmp_path_factory):
    """Each family's tiny run exported with attention outputs: ``{family: (run, folder)}``."""
    out = {}
    root = tmp_path_factory.mktemp("onnx")
    sources = {k: v for k, v in tiny_runs.items() if k != "translation-rnn"}
    for family, run in {**sources, "vit": tiny_vit_run, "caption": tiny_caption_run}.items():
        out[family] = (run, export_onnx(run, root / family, attentions=True).out)
    return out


def test_the_lm_decodes_incrementally_with_the_exported_cache(exported):
    run, folder = exported["lm"]
    model, tok = runs.load_run(run)
    decoder, cfg = session(folder, "decoder.onnx"), model.config
    prompt = torch.tensor([tok.encode("ROMEO:\nBut")] * 2)
    logits, keys, values, weights = decoder.run(None, {"tokens": prompt.numpy(), **empty_cache(cfg, 2)})
    with torch.no_grad():
        ref = model(prompt, need_weights=True)
    close(logits, ref.logits.numpy())
    close(weights, torch.stack(ref.attentions).numpy())
    assert keys.shape == (cfg.n_layers, 2, cfg.n_heads, prompt.size(1), cfg.d_model // cfg.n_heads)
    # 20 greedy steps, one token at a time through the cache, against the full forward each time
    ids, step = prompt[:1], prompt[:1].numpy()
    cache = {"past_keys": keys[:, :1], "past_values": values[:, :1]}
    last = logits[:1, -1]
    for _ in range(20):
        token = last.argmax(-1)
        ids = torch.cat([ids, torch.from_numpy(token)[:, None]], 1)
        last, cache["past_keys"], cache["past_values"], _ = decoder.run(
            None, {"tokens": token[:, None], **cache}
        )
        last = last[:, -1]
        with torch.no_grad():
            full = model(ids).logits[:, -1].numpy()
        close(last, full)
    del step


@pytest.mark.parametrize("family", ["translation", "caption"])
def test_the_encoder_decoder_decodes_greedily_as_qkv_does(exported, family):
    from qkv.inference.search import greedy_decode
    from qkv.nn.masks import padding_mask

    run, folder = exported[family]
    model, tok = runs.load_run(run)
    cfg = model.config
    encoder, decoder = session(folder, "encoder.onnx"), session(folder, "decoder.onnx")
    if family == "translation":
        x = torch.tensor([tok.encode("Ein Mann fährt mit dem Fahrrad.") + [cfg.eos_id]])
    else:
        x = torch.rand(1, cfg.channels, cfg.image_size, cfg.image_size) * 2 - 1
    memory, enc_weights = encoder.run(None, {encoder.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        ref_memory, _, ref_weights = model.encode(x, need_weights=True)
    close(memory, ref_memory.numpy())
    close(enc_weights, torch.stack(ref_weights).numpy())
    extra = {"src": x.numpy()} if family == "translation" else {}
    with torch.no_grad():
        expected = greedy_decode(model, x)[0]  # stops at eos or at its length limit
    cache = empty_cache(cfg, 1)
    token, out = np.array([[cfg.bos_id]]), []
    for _ in range(len(expected) + 1):
        logits, cache["past_keys"], cache["past_values"], *_ = decoder.run(
            None, {"tgt": token, "memory": memory, **extra, **cache}
        )
        token = logits[:, -1:].argmax(-1)
        if int(token[0, 0]) == cfg.eos_id:
            break
        out.append(int(token[0, 0]))
    assert out[: len(expected)] == expected
    # teacher-forced, whole target at once: logits and both kinds of attention
    tgt = torch.tensor([[cfg.bos_id, *expected[:3]]]) if expected else torch.tensor([[cfg.bos_id]])
    logits, _, _, self_w, cross_w = decoder.run(
        None, {"tgt": tgt.numpy(), "memory": memory, **extra, **empty_cache(cfg, 1)}
    )
    src_mask = padding_mask(x, cfg.pad_id) if family == "translation" else None
    with torch.no_grad():
        ref_logits, ref_self, ref_cross = model.decode(tgt, ref_memory, src_mask, need_weights=True)
    close(logits, ref_logits.numpy())
    close(self_w, torch.stack(ref_self).numpy())
    close(cross_w, torch.stack(ref_cross).numpy())


@pytest.mark.parametrize("family", ["diffusion-lm", "protein", "vit"])
def test_one_pass_models_match(exported, family):
    run, folder = exported[family]
    model, tok = runs.load_run(run)
    cfg = model.config
    graph = session(folder, "model.onnx")
    if family == "vit":
        x = torch.rand(3, cfg.channels, cfg.image_size, cfg.image_size) * 2 - 1
        kwargs = {}
    else:
        text = "MKTAYIAKQRQISFVKSHFSRQ" if family == "protein" else "But soft, what light"
        x = torch.tensor([tok.encode(text)] * 3)
        kwargs = {"head": "sequence"} if family == "protein" else {}
    logits, weights = graph.run(None, {graph.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        ref = model(x, need_weights=True, **kwargs)
    ref_weights = ref.attentions if hasattr(ref, "attentions") else ref.encoder_attentions
    assert logits.shape == tuple(ref.logits.shape)
    close(logits, ref.logits.numpy())
    close(weights, torch.stack(ref_weights).numpy())


@pytest.mark.parametrize("family", ["lm", "translation", "protein"])
def test_tokenizer_json_reads_the_same_ids_in_hf_tokenizers(exported, family):
    from tokenizers import Tokenizer

    run, folder = exported[family]
    _, tok = runs.load_run(run)
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = {"lm": "ROMEO:\nBut soft", "translation": "Ein Mann liest ein Buch.", "protein": "MKTAYIAKQR"}
    text = texts[family]
    # as qkv's own encode: the subword and character tokenizers add no specials (the decoding
    # loops add bos and eos, which onnx.json's config names); a protein is <cls> residues <eos>
    assert hf.encode(text).ids == tok.encode(text)


def test_manifest_names_graphs_files_and_config(exported):
    _, folder = exported["translation"]
    manifest = read_manifest(folder)
    assert manifest["recipe"] == "translation"
    assert set(manifest["graphs"]) == {"encoder.onnx", "decoder.onnx"}
    assert manifest["graphs"]["decoder.onnx"]["inputs"] == [
        "tgt",
        "memory",
        "src",
        "past_keys",
        "past_values",
    ]
    assert {"encoder.onnx", "decoder.onnx", "tokenizer.json"} <= set(manifest["files"])
    assert all(len(f["sha256"]) == 64 for f in manifest["files"].values())
    assert manifest["config"]["eos_id"] is not None
    # the opset read back from the files written, each graph's and the folder's
    assert manifest["opset"] == DEFAULT_OPSET
    for name, graph in manifest["graphs"].items():
        assert graph["opset"] == written_opset(folder / name) == DEFAULT_OPSET


def test_refusals_are_one_line_and_write_nothing(tiny_runs, tmp_path, capsys):
    with pytest.raises(QkvError, match="cannot be exported to ONNX yet"):
        export_onnx(tiny_runs["translation-rnn"], tmp_path / "rnn")
    assert not (tmp_path / "rnn").exists()
    with pytest.raises(QkvError, match=f"opset 13 is too old.*{MIN_OPSET}"):
        export_onnx(tiny_runs["lm"], tmp_path / "old", opset=13)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert main(["convert", "--to", "onnx", str(tiny_runs["lm"]), str(full)]) != 0
    err = capsys.readouterr().err.strip()
    assert "already exists and is not empty" in err and len(err.splitlines()) == 1
    assert (full / "keep.txt").read_text() == "mine" and len(list(full.iterdir())) == 1


def test_half_weights_are_the_models_tensors_rounded_to_float16(tiny_runs, tmp_path):
    import copy

    from qkv.hub.onnx_export import store_half

    run = tiny_runs["lm"]
    folder = export_onnx(run, tmp_path / "lm").out
    store_half(folder / "decoder.onnx", least=2)  # every tensor (the tiny model's are all small)
    model, tok = runs.load_run(run)
    ids = torch.tensor([tok.encode("ROMEO: But soft")])
    logits, *_ = session(folder, "decoder.onnx").run(
        None, {"tokens": ids.numpy(), **empty_cache(model.config, 1)}
    )
    with torch.no_grad():
        rounded = copy.deepcopy(model).half().float()(ids).logits.numpy()
        exact = model(ids).logits.numpy()
    close(logits, rounded)
    assert np.abs(logits - exact).max() > 10 * np.abs(logits - rounded).max()  # it did round
    mt = export_onnx(tiny_runs["translation"], tmp_path / "mt", weights="float16")
    assert read_manifest(mt.out)["weights"] == "float16"
    with pytest.raises(QkvError, match="float32 or float16, not 'int4'"):
        export_onnx(run, tmp_path / "int4", weights="int4")
    assert not (tmp_path / "int4").exists()


def test_cli_exports_a_run_and_names_what_it_wrote(tiny_runs, tiny_vit_run, tmp_path, capsys):
    assert main(["convert", "--to", "onnx", str(tiny_runs["diffusion-lm"]), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.onnx").is_file()
    assert "model.onnx (dynamo exporter), tokenizer.json, onnx.json" in capsys.readouterr().err
    assert main(["convert", "--to", "onnx", str(tiny_vit_run), str(tmp_path / "vit")]) == 0
    said = capsys.readouterr().err
    assert "model.onnx (dynamo exporter), onnx.json" in said and "tokenizer" not in said  # a ViT has none


def test_every_graph_is_dynamo_exported(exported):
    # the exporter "where it works": it works for every family today; a fallback to
    # TorchScript's would show here first
    manifests = [read_manifest(folder) for _, folder in exported.values()]
    assert {graph["exporter"] for m in manifests for graph in m["graphs"].values()} == {"dynamo"}
