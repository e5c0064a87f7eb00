"""Fine-tuning from a checkpoint: ``qkv train lm --init`` and LoRA adapters
(``train.lora_rank``, :mod:`qkv.train.adapters`)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cli_runs import run_main, tiny_gpt2_folder
from pretrained_marks import installed

from qkv.cli import main
from qkv.models.config import EncoderConfig, LMConfig
from qkv.models.decoder_lm import DecoderLM
from qkv.models.encoder import EncoderModel
from qkv.recipes.lm import evaluate_run
from qkv.train.adapters import LoraSettings, add_lora, has_lora, merge_lora
from qkv.train.optim import make_optimizer
from qkv.train.train_settings import TrainSettings

peft = pytest.importorskip("peft")

# A small corpus with a newline in every sentence and enough characters for 32-token windows.
SENTENCES = [
    "The cat sat on the mat.",
    "A dog ran in the park, and the cat watched it.",
    "Two birds sang in the old tree by the river.",
    "She reads a book while he cooks dinner.",
]
TEXT = "\n".join(SENTENCES * 40) + "\n"
LM_SMOKE = [
    "train.warmup_steps=2",
    "model.max_len=32",
    "batch_size=4",
    "eval_every=5",
    "sample_tokens=10",
    "num_samples=1",
    "--quiet",
]


def _tiny_lm(**kw) -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(LMConfig(vocab_size=50, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=32, **kw))


@pytest.mark.parametrize("modules", ["qkv,o", "qkv,o,ffn", "ffn"])
def test_lora_adds_rank_times_in_plus_out_parameters_per_adapted_projection(modules):
    model = _tiny_lm()
    names = {"qkv,o": ("w_qkv", "w_o"), "qkv,o,ffn": ("w_qkv", "w_o", "w_1", "w_2"), "ffn": ("w_1", "w_2")}
    linears = [m for n, m in model.named_modules() if n.rpartition(".")[2] in names[modules]]
    expected = sum(4 * (m.in_features + m.out_features) for m in linears)
    before = sum(p.numel() for p in model.parameters())
    add_lora(model, LoraSettings(rank=4, alpha=8.0, dropout=0.0, modules=modules))
    assert has_lora(model)
    assert sum(p.numel() for p in model.parameters()) - before == expected
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) == expected
    # 2 layers: w_qkv (16 → 48) and w_o (16 → 16) per layer, w_1 (16 → 32) and w_2 (32 → 16)
    assert (
        expected
        == {"qkv,o": 2 * 4 * (64 + 32), "qkv,o,ffn": 2 * 4 * (64 + 32 + 48 + 48), "ffn": 2 * 4 * 96}[modules]
    )


def test_lora_trains_only_adapters_and_head_and_merges_to_the_same_outputs():
    torch.manual_seed(0)
    cfg = EncoderConfig(vocab_size=30, d_model=16, n_heads=2, d_ff=32, n_layers=2, max_len=20, num_labels=3)
    model = EncoderModel(cfg)
    tokens = torch.randint(5, 30, (8, 12))
    labels = torch.randint(0, 3, (8,))
    model.eval()
    with torch.no_grad():
        base_logits = model(tokens, head="sequence").logits
    frozen = {k: v.clone() for k, v in model.state_dict().items() if not k.startswith("sequence_head")}
    head = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("sequence_head")}
    add_lora(model, LoraSettings(4, 8.0, 0.0, "qkv,o,ffn"), trainable=("sequence_head.",))
    with torch.no_grad():  # B starts at zero: the adapted model is the pretrained one
        assert torch.equal(model(tokens, head="sequence").logits, base_logits)
    opt = make_optimizer(model, TrainSettings(weight_decay=0.1))
    for group in opt.param_groups:
        group["lr"] = 1e-2
    model.train()
    for _ in range(5):
        loss = torch.nn.functional.cross_entropy(model(tokens, head="sequence").logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    state = model.state_dict()
    for key, value in frozen.items():  # the pretrained weights, under PEFT's base_layer names
        moved = key.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        assert torch.equal(state[key if key in state else moved], value), key
    assert any(not torch.equal(state[k], v) for k, v in head.items()), "the head trains"
    assert any(k.endswith("lora_B.default.weight") and v.abs().sum() > 0 for k, v in state.items())
    with torch.no_grad():
        adapted = model(tokens, head="sequence").logits
        merge_lora(model)
        merged = model(tokens, head="sequence").logits
    assert not has_lora(model)
    assert set(model.state_dict()) == set(frozen) | set(head), "merged: the pretrained architecture's names"
    assert (adapted - merged).abs().max() <= 1e-5
    assert not torch.allclose(adapted, base_logits, atol=1e-4), "training changed the outputs"


def test_lora_settings_are_checked():
    with pytest.raises(ValueError, match="lora_modules"):
        TrainSettings(lora_rank=4, lora_modules="qkv,mlp")
    with pytest.raises(ValueError, match=r"lora_rank \(-1\)"):
        TrainSettings(lora_rank=-1)
    with pytest.raises(ValueError, match="lora_dropout"):
        TrainSettings(lora_rank=2, lora_dropout=1.0)


_run = run_main


def _refused(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """A random-init tiny GPT-2 saved by ``transformers`` with a byte-level BPE tokenizer: what
    ``qkv convert`` and ``--init`` read from an HF folder."""
    pytest.importorskip("transformers")
    # no start/end id in this vocabulary: the run starts its samples from the corpus's newline
    return tiny_gpt2_folder(tmp_path_factory.mktemp("gpt2"), SENTENCES)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def test_lm_init_from_a_gpt2_folder_continues_on_tiny_shakespeare_and_reloads(gpt2_folder, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, err = _run(
        capsys, "train", "lm", "--init", str(gpt2_folder), "corpus=tinyshakespeare", "--out", str(out),
        "--max-steps", "20", "train.lr=1e-2", "--json", *LM_SMOKE,
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads(stdout)
    before, after = summary["init_validation"]["val_loss"], summary["validation"]["val_loss"]
    assert summary["init"] == str(gpt2_folder)
    assert math.isclose(before, math.log(300), rel_tol=0.1), "a random model: about log(vocabulary size)"
    assert after < before - 0.5, (before, after)
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["n_layers"], config["max_len"]) == (32, 2, 32), "window cut to 32"
    # The run reloads to the outputs it was scored with, and the zero-shot figure is the
    # checkpoint's own on the same windows.
    assert abs(evaluate_run(out)["loss"] - after) <= 1e-5
    assert json.loads((out / "init.json").read_text())["validation"]["val_loss"] == before


def test_lm_init_with_lora_stores_adapters_merges_and_resumes(gpt2_folder, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "lm", "--init", str(gpt2_folder), f"corpus={corpus}", "--out", str(out)]
    lora = ["train.lora_rank=4", "train.lora_modules=qkv,o,ffn", "train.lr=1e-2", "--json", *LM_SMOKE]
    code, stdout, err = _run(capsys, *args, "--max-steps", "5", *lora)
    assert code == 0, err
    first = json.loads(stdout)
    assert first["trainable_parameters"] == 2 * 4 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["rank"] == 4 and adapter["target_modules"] == ["w_1", "w_2", "w_o", "w_qkv"]
    assert abs(evaluate_run(out)["loss"] - first["validation"]["val_loss"]) <= 1e-5
    # The merged weights are an ordinary run: they convert to an HF GPT-2 with the same logits
    # and the explainer reads them.
    transformers = pytest.importorskip("transformers")
    from qkv.explain.explainer import DecodingOptions
    from qkv.recipes.loading import load_explainer
    from qkv.runs import load_run

    assert main(["convert", "--to", "hf", str(out), str(tmp_path / "hf")]) == 0
    ours, _ = load_run(out, family="lm")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, ours.eval()(tokens).logits, atol=1e-4, rtol=1e-4)
    explanation = load_explainer(out).explain("The cat", DecodingOptions(max_new_tokens=2, temperature=0))
    assert explanation.attention[0].weights.shape[:2] == (2, 2)  # (layers, heads)
    capsys.readouterr()
    code, stdout, err = _run(capsys, *args, "--resume", "--max-steps", "10", *lora)
    assert code == 0, err
    second = json.loads(stdout)
    assert second["steps"] == 10 and second["init_validation"] == first["init_validation"]
    assert second["validation"]["val_loss"] < first["init_validation"]["val_loss"]


def test_lm_init_refusals_write_nothing(gpt2_folder, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    fasta = tmp_path / "proteins.fasta"
    fasta.write_text(">sp|P69905|HBA_HUMAN\nMVLSPADKTNVKAAWGKVGAHAGEYGAEALERMF\n" * 30)
    char_run = tmp_path / "char"
    code, _, err = _run(
        capsys, "train", "lm", f"corpus={corpus}", "--out", str(char_run), "--max-steps", "2",
        "d_model=16", "n_heads=2", "d_ff=32", "n_layers=1", *LM_SMOKE,
    )  # fmt: skip
    assert code == 0, err
    cases = [
        (
            [f"--init={char_run}", f"corpus={fasta}", "model.max_len=32"],
            ("init=", "'>'"),
        ),  # a character run on FASTA
        ([f"--init={gpt2_folder}", f"corpus={corpus}", "model.max_len=128"], ("model.max_len (128)", "(64)")),
        ([f"--init={gpt2_folder}", f"corpus={corpus}", "model.d_model=64"], ("model.d_model=64",)),
        ([f"corpus={corpus}", "train.lora_rank=4"], ("lora_rank", "init")),
        ([f"--init={tmp_path / 'nothing'}", f"corpus={corpus}"], ("nothing",)),
    ]
    for extra, needles in cases:
        _refused(
            *_run(capsys, "train", "lm", *extra, "--out", str(out), "--max-steps", "2", "--quiet"), *needles
        )
        assert not out.exists(), extra
    _refused(
        *_run(capsys, "train", "translation", "train.lora_rank=4", "--out", str(out)),
        "lora_rank",
        "translation",
    )
    assert not out.exists()


@pytest.mark.skipif(not installed("iglm"), reason="IgLM not installed (make pretrained)")
def test_iglm_continues_on_antibody_chains_and_refuses_text(tmp_path, capsys):
    chains = tmp_path / "chains.txt"
    chains.write_text(
        "[HEAVY] [HUMAN] EVQLVESGGGLVQPGGSLRLSCAASGFTFSSYAMSWVRQAPGKGLEWVSAISGSGGSTYYADSVKG\n"
        "[LIGHT] [HUMAN] DIQMTQSPSSLSASVGDRVTITCRASQSISSYLNWYQQKPGKAPKLLIYAASSLQSGVPSRFSGSG\n" * 6
    )
    out = tmp_path / "run"
    code, stdout, err = _run(
        capsys, "train", "lm", "--init", "iglm", f"corpus={chains}", "--out", str(out), "--max-steps", "2",
        "model.max_len=64", "batch_size=2", "sample_tokens=5", "num_samples=1", "--json", "--quiet",
    )  # fmt: skip
    assert code == 0, err
    before = json.loads(stdout)["init_validation"]["val_ppl"]
    # One chain per row from position 0, as IgLM was trained: it knows this germline light chain
    # (windows across chains scored it several times worse; a random model's ppl is ~33).
    assert 1.0 < before < 2.0, before
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    _refused(
        *_run(
            capsys,
            "train",
            "lm",
            "--init",
            "iglm",
            f"corpus={text}",
            "--out",
            str(tmp_path / "r2"),
            "--quiet",
        ),
        "init=iglm",
        "[UNK]",
    )
    assert not (tmp_path / "r2").exists()
