"""``qkv convert --to hf`` / ``--to peft`` write a model card (``README.md``) that
``huggingface_hub`` reads back offline, holding what the run measured and nothing else, and
``--push REPO`` uploads the folder (mocked here: no network) or refuses in one line before
anything is written (:mod:`qkv.hub.model_card`)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_runs import TINY_LM, TINY_TRANSLATION, qkv, refused, run_main, tiny_gpt2_folder

import qkv as qkv_package
from qkv.errors import QkvError
from qkv.hub.families import FAMILIES
from qkv.hub.model_card import ARCHITECTURES, CARD, check_card

hub = pytest.importorskip("huggingface_hub")
transformers = pytest.importorskip("transformers")

from huggingface_hub import ModelCard, metadata_load  # noqa: E402
from huggingface_hub.repocard_data import model_index_to_eval_results  # noqa: E402

# exportable as GPT-2 / Marian: biases, learned positions; post-LN, shared embeddings, sines then cosines
LM = [*TINY_LM, "model.bias=true", "train.threads=1", "--quiet"]
MT = [
    *(s for s in TINY_TRANSLATION if s != "test=false"),
    *("test=true", "beam_size=1", "model.norm_first=false", "model.share_embeddings=true"),
    *("model.positional=sinusoidal_halves", "train.threads=1", "--quiet"),
]
# what summary.json holds beside the figures: counts and decoding settings (not measurements)
NOT_FIGURES = {"n", "tokens", "split", "beam_size", "alpha", "decode_seconds", "examples"}


def _train(root: Path, *args: str) -> Path:
    from qkv.cli import main

    assert main(["train", *args, "--out", str(root / "run")]) == 0
    return root / "run"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """Tiny trained runs that export: an lm (tinyshakespeare, 6 steps) and a translation
    (Multi30k, 4 steps, scored on test2016 with greedy decoding)."""
    return {
        "lm": _train(tmp_path_factory.mktemp("lm"), "lm", "--max-steps", "6", *LM),
        "translation": _train(tmp_path_factory.mktemp("mt"), "translation", "--max-steps", "4", *MT),
    }


def _convert(capsys, run: Path, out: Path, *extra: str) -> ModelCard:
    code, stdout, err = run_main(capsys, "convert", "--to", "hf", str(run), str(out), *extra)
    assert code == 0, err
    assert not stdout and f"({CARD}, config.json, model.safetensors, tokenizer.json)" in err
    return check_card(out / CARD)


def _figures(summary: dict, split_keys: dict[str, str]) -> dict[tuple[str, str], float]:
    return {
        (split, name): value
        for key, split in split_keys.items()
        for name, value in summary.get(key, {}).items()
        if name not in NOT_FIGURES
    }


def _snippet_class(card: ModelCard) -> str:
    return re.search(r"^from transformers import (\w+)$", card.text, flags=re.M).group(1)


def _run_snippet(card: ModelCard, out: Path) -> dict:
    """The card's first Python snippet, run on the folder it names ``path/to/<out's name>``."""
    code = re.search(r"```python\n(.*?)```", card.text, flags=re.S).group(1)
    assert f'"path/to/{out.name}"' in code
    namespace: dict = {}
    exec(code.replace(f'"path/to/{out.name}"', repr(str(out))), namespace)  # noqa: S102
    return namespace


@pytest.mark.parametrize(
    ("recipe", "task", "family", "datasets", "splits"),
    [
        ("lm", "text-generation", "gpt2", ["tinyshakespeare"], {"validation": "validation"}),
        (
            "translation",
            "translation",
            "marian",
            ["multi30k"],
            {"validation": "validation", "test2016": "test2016"},
        ),
    ],
)
def test_card_parses_and_holds_what_the_run_measured(
    recipe, task, family, datasets, splits, trained, tmp_path, capsys
):
    run, out = trained[recipe], tmp_path / "hf"
    card = _convert(capsys, run, out)
    assert sorted(p.name for p in out.iterdir()) == [
        CARD,
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    loaded = ModelCard.load(out / CARD)  # the library's own reader, offline
    data = loaded.data
    assert data.library_name == "transformers" and data.pipeline_tag == task
    assert data.tags[:3] == ["qkv", recipe, family] and task in data.tags
    assert data.datasets == datasets
    assert data.qkv["version"] == qkv_package.__version__ and data.qkv["recipe"] == recipe
    summary = json.loads((run / "summary.json").read_text())
    assert data.qkv["steps"] == summary["steps"] and data.qkv["parameters"] == summary["parameters"]
    # every figure of summary.json, exactly, and nothing else; model-index converts back alike
    results = {(r.dataset_split, r.metric_name): r.metric_value for r in data.eval_results}
    assert results == _figures(summary, splits) and len(results) == len(data.eval_results)
    assert {r.task_type for r in data.eval_results} == {task}
    assert {r.dataset_type for r in data.eval_results} == set(datasets)
    index = metadata_load(out / CARD)["model-index"]
    assert (
        model_index_to_eval_results(index)
        == (out.name, data.eval_results)
        == (card.data.model_name, card.data.eval_results)
    )
    # the settings block is train_config.json
    settings = json.loads(re.search(r"```json\n(.*?)```", loaded.text, flags=re.S).group(1))
    assert settings == json.loads((run / "train_config.json").read_text())
    # the snippet runs: its Auto class builds the exported architecture from the folder
    architecture = json.loads((out / "config.json").read_text())["architectures"][0]
    model = _run_snippet(loaded, out)["model"]
    assert type(model).__name__ == architecture and f"`{architecture}`" in loaded.text


def test_translation_card_tokenizer_snippet_and_language(trained, tmp_path, capsys):
    """A BPE run's tokenizer.json is a tokenizers file: transformers' fast tokenizer reads
    it with the run's own ids; a Multi30k run names its language pair."""
    from qkv.data.tokenizers import load_tokenizer

    out = tmp_path / "hf"
    card = _convert(capsys, trained["translation"], out)
    assert card.data.language == ["de", "en"]
    assert 'PreTrainedTokenizerFast.from_pretrained("path/to/hf")' in card.text
    fast = transformers.PreTrainedTokenizerFast.from_pretrained(out)
    ours = load_tokenizer(trained["translation"] / "tokenizer.json")
    sentence = "Ein Mann fährt mit dem Fahrrad."
    assert fast(sentence, add_special_tokens=False)["input_ids"] == ours.encode(sentence)


def test_lm_card_qkv_snippet_reads_the_folder(trained, tmp_path, capsys):
    """A character-level run: its tokenizer is qkv's own, so the card sends the reader to
    ``qkv.load``, which reads the exported folder back with the run's outputs."""
    import torch

    from qkv.runs import load_run

    out = tmp_path / "hf"
    card = _convert(capsys, trained["lm"], out)
    assert "qkv's character tokenizer" in card.text and 'qkv.load("path/to/hf")' in card.text
    model, tok = qkv_package.load(out)
    ours, our_tok = load_run(trained["lm"])
    ids = torch.tensor([our_tok.encode("ROMEO: soft")])
    assert tok.encode("ROMEO: soft") == our_tok.encode("ROMEO: soft")
    torch.testing.assert_close(model(ids).logits, ours(ids).logits, rtol=0, atol=1e-5)


def test_a_classifier_heads_figures_stay_out_of_the_model_index(tiny_runs, tmp_path, capsys):
    """A protein classifier exports as EsmForMaskedLM, without its head: the card says so, lists
    the head's figures in the body only, and tags the model as a protein one."""
    run = shutil.copytree(tiny_runs["protein"], tmp_path / "protein")
    figures = {"accuracy": 0.75, "mcc": 0.5, "n": 8}
    (run / "summary.json").write_text(json.dumps({"validation": figures, "test": figures, "steps": 3}))
    card = _convert(capsys, run, tmp_path / "hf")
    data = card.data
    assert data.pipeline_tag == "fill-mask" and data.tags == [
        "qkv",
        "protein-cls",
        "esm",
        "fill-mask",
        "protein",
    ]
    assert data.eval_results is None and "model-index" not in metadata_load(tmp_path / "hf" / CARD)
    assert "| test (n = 8) | `mcc` | 0.5 |" in card.text and "task head" in card.text
    assert "classification head has no counterpart" in card.text
    model = getattr(transformers, _snippet_class(card)).from_pretrained(tmp_path / "hf")
    assert type(model).__name__ == "EsmForMaskedLM"


def test_base_model_is_the_hub_model_a_run_started_from(tiny_runs, tmp_path, capsys):
    """``init`` as a Hub name (its revision dropped), an ESM-2 name (the Hub's facebook/ copy),
    or a local run converted from a Hub model; a local folder or a short name is none."""
    from qkv.hub.fair_esm import ESM2_NAMES
    from qkv.hub.model_card import _hub_origin

    assert [_hub_origin(n) for n in ESM2_NAMES] == [f"facebook/{n}" for n in ESM2_NAMES]
    assert _hub_origin("org/model@v1") == "org/model"
    converted = tmp_path / "converted"
    converted.mkdir()
    (converted / "train_config.json").write_text(json.dumps({"recipe": "encoder", "converted_from": "org/m"}))
    assert _hub_origin(str(converted)) == "org/m"
    assert _hub_origin(str(tmp_path)) is _hub_origin("minilm") is _hub_origin(None) is None
    run = shutil.copytree(tiny_runs["protein"], tmp_path / "protein")
    (run / "train_config.json").write_text(json.dumps({"recipe": "protein-cls", "init": "esm2_t6_8M_UR50D"}))
    card = _convert(capsys, run, tmp_path / "hf")
    assert card.data.base_model == "facebook/esm2_t6_8M_UR50D"
    assert "starting from `esm2_t6_8M_UR50D`" in card.text


def test_every_architecture_qkv_writes_has_the_auto_class_that_builds_it():
    from transformers.models.auto import modeling_auto as auto

    names = {
        "AutoModel": auto.MODEL_MAPPING_NAMES,
        "AutoModelForMaskedLM": auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
        "AutoModelForCausalLM": auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "AutoModelForSeq2SeqLM": auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        "AutoModelForImageClassification": auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES,
    }
    written = {
        (family.model_types[0], arch)
        for family in FAMILIES.values()
        for arch in [*(a for a, _ in family.architectures), family.base_model]
        if arch
    }
    assert {arch for _, arch in written} == set(ARCHITECTURES)
    for model_type, arch in written:
        built = names[ARCHITECTURES[arch][0]][model_type]
        assert arch in ((built,) if isinstance(built, str) else built), (arch, built)


def test_check_card_refuses_what_huggingface_hub_cannot_read(tmp_path):
    bad = tmp_path / CARD
    bad.write_text("---\nmodel-index:\n- name: x\n  results: 3\n---\n\n# x\n", encoding="utf-8")
    with pytest.raises(QkvError, match="not a model card huggingface_hub reads"):
        check_card(bad)
    unread = "model-index:\n- name: x\n  results:\n  - task: {type: t, colour: red}\n"
    bad.write_text(
        f"---\n{unread}    dataset: {{type: d, name: d}}\n    metrics: [{{type: m, value: 1}}]\n---\n"
    )
    with pytest.raises(QkvError, match="entries huggingface_hub does not read"):
        check_card(bad)
    bad.write_text("---\n- a list\n---\n", encoding="utf-8")
    with pytest.raises(QkvError, match="not a model card huggingface_hub reads"):
        check_card(bad)


def test_push_is_refused_offline_without_a_token_or_with_another_export(trained, tmp_path):
    run, out = trained["lm"], tmp_path / "hf"
    offline = qkv(
        "convert",
        "--to",
        "hf",
        str(run),
        str(out),
        "--push",
        "me/tiny",
        env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": "hf_x"},
    )
    refused(offline, "--push me/tiny", "offline mode (HF_HUB_OFFLINE")
    home = tmp_path / "hf_home"  # no token file there
    anonymous = qkv(
        "convert", "--to", "hf", str(run), str(out), "--push", "me/tiny",
        env={"HF_HUB_OFFLINE": "0", "HF_TOKEN": "", "HF_HOME": str(home)},
    )  # fmt: skip
    refused(anonymous, "--push me/tiny: not logged in", "`hf auth login`")
    onnx = qkv("convert", "--to", "onnx", str(run), str(out), "--push", "me/tiny", env={"HF_TOKEN": "hf_x"})
    refused(onnx, "--push uploads what --to hf or --to peft writes, not --to onnx")
    named = qkv("convert", "--to", "hf", str(run), str(out), "--push", "me/a b", env={"HF_TOKEN": "hf_x"})
    refused(named, "--push me/a b: not a Hub repository id")
    assert not out.exists() and not home.exists()


@pytest.fixture
def hub_calls(monkeypatch) -> list:
    """``HfApi.create_repo`` and ``upload_folder`` recorded instead of sent, with a token."""
    from huggingface_hub import HfApi, constants

    calls: list = []
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/{repo_id}"

    def upload_folder(self, **kwargs):
        calls.append(("upload_folder", kwargs, sorted(p.name for p in Path(kwargs["folder_path"]).iterdir())))

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def test_push_creates_the_repository_and_uploads_the_folder(trained, tmp_path, capsys, hub_calls):
    out = tmp_path / "hf"
    code, _, err = run_main(
        capsys, "convert", "--to", "hf", str(trained["lm"]), str(out), "--push", "me/tiny-lm"
    )
    assert code == 0, err
    assert err.strip().splitlines()[-1] == f"pushed {out} to https://huggingface.co/me/tiny-lm"
    (create, repo, options), (upload, kwargs, files) = hub_calls
    assert (create, repo, options) == ("create_repo", "me/tiny-lm", {"exist_ok": True})
    assert (
        upload == "upload_folder" and kwargs["repo_id"] == "me/tiny-lm" and Path(kwargs["folder_path"]) == out
    )
    assert files == [CARD, "config.json", "model.safetensors", "tokenizer.json"]
    card = check_card(out / CARD)  # the card names the repository it went to
    assert card.data.model_name == "tiny-lm" and 'from_pretrained("me/tiny-lm")' in card.text


def test_a_failed_upload_is_one_line_naming_the_repository_and_keeps_the_folder(
    trained, tmp_path, capsys, hub_calls, monkeypatch
):
    import httpx
    from huggingface_hub import HfApi

    def unreachable(self, **kwargs):
        raise httpx.ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(HfApi, "upload_folder", unreachable)
    out = tmp_path / "hf"
    code, stdout, err = run_main(
        capsys, "convert", "--to", "hf", str(trained["lm"]), str(out), "--push", "me/x"
    )
    assert code == 2 and not stdout
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: could not push {out} to me/x: [Errno -3] Temporary failure")
    assert f"`hf upload me/x {out}`" in last and "Traceback" not in err
    assert check_card(out / CARD).data.library_name == "transformers"  # the folder stays written


def test_peft_export_card(tmp_path, capsys):
    """A LoRA lm run from a local GPT-2 folder: a PEFT card (library peft, no base_model: the
    base is a local folder, shipped in base/), its snippet loads base and adapter, and no
    local path of the run reaches the card."""
    peft = pytest.importorskip("peft")
    from qkv.cli import main

    sentences = ["The cat sat on the mat.", "A dog ran in the park, and the cat watched it."]
    folder = tiny_gpt2_folder(tmp_path, sentences)
    corpus = tmp_path / "text.txt"
    corpus.write_text("\n".join(sentences * 40) + "\n", encoding="utf-8")
    run, out = tmp_path / "run", tmp_path / "peft"
    args = [
        "--init",
        str(folder),
        f"corpus={corpus}",
        "--max-steps",
        "4",
        "train.lora_rank=4",
        "train.warmup_steps=1",
    ]
    tiny = ["model.max_len=32", "batch_size=4", "eval_every=4", "sample_tokens=4", "num_samples=1", "--quiet"]
    assert main(["train", "lm", *args, *tiny, "--out", str(run)]) == 0
    code, _, err = run_main(capsys, "convert", "--to", "peft", str(run), str(out))
    assert code == 0, err
    card = check_card(out / CARD)
    data = card.data
    assert data.library_name == "peft" and data.pipeline_tag == "text-generation"
    assert data.tags[:3] == ["qkv", "lm", "lora"] and data.get("base_model") is None
    summary = json.loads((run / "summary.json").read_text())
    assert {(r.dataset_split, r.metric_name): r.metric_value for r in data.eval_results} == _figures(
        summary, {"validation": "validation"}
    )
    assert {r.dataset_type for r in data.eval_results} == {"text.txt"} and data.get("datasets") is None
    assert str(tmp_path) not in (out / CARD).read_text(encoding="utf-8")
    snippet = _run_snippet(card, out)  # base from base/, the adapter on it, the tokenizer
    assert isinstance(snippet["model"], peft.PeftModel)
    assert (
        type(snippet["base"]).__name__ == "GPT2LMHeadModel"
        and len(snippet["tokenizer"]) == snippet["base"].config.vocab_size
    )
