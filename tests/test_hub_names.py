"""Hub names (``org/name``) wherever a checkpoint is taken, offline, on a Hugging Face cache laid
out by the test; and the Sapiens short names (fairseq RoBERTa) against transformers' RoBERTa."""

from __future__ import annotations

import argparse
import json
import re
import shutil

import httpx
import huggingface_hub
import pytest
import torch
import transformers
from cli_runs import DATA
from huggingface_hub import constants
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
from pretrained_marks import needs_sapiens

from qkv.cli import main
from qkv.errors import QkvError
from qkv.hub import pretrained
from qkv.hub.hub_names import download, is_hub_name, split_revision

MAIN, OTHER = "a" * 40, "b" * 40  # the two snapshots' commits; OTHER is also tagged v2
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"ACDEFGHIKLMNPQRSTVWY"]


def _bert_folder(folder, seed: int):
    """A tiny random BertForMaskedLM saved as an HF folder (config, safetensors, vocab.txt)."""
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    transformers.BertForMaskedLM(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding ``org/tiny``: ``main`` at commit MAIN, tag ``v2``
    at commit OTHER (another random model)."""
    cache = tmp_path / "hf" / "hub"
    repo = cache / "models--org--tiny"
    _bert_folder(repo / "snapshots" / MAIN, seed=0)
    _bert_folder(repo / "snapshots" / OTHER, seed=1)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(MAIN)
    (repo / "refs" / "v2").write_text(OTHER)
    # huggingface_hub reads these variables when imported: set both the variables and its constants
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return repo


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _logits(name, revision=None) -> torch.Tensor:
    model, tok = pretrained.load(name, revision=revision)
    ids = torch.tensor([tok.encode("MKTAYIAKQR")])
    with torch.no_grad():
        return model(ids, head="mlm").logits


def test_is_hub_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_name("facebook/esm2_t6_8M_UR50D")
    assert is_hub_name("org/name@v1.0")
    for text in ("minilm", "a/b/c", "/abs/path", "org/", "org/na me", "org/name@", "org//name", "org/--x"):
        assert not is_hub_name(text), text
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not is_hub_name("org/name")  # a path that exists is a path
    assert split_revision("org/name@v2") == ("org/name", "v2")
    assert split_revision("org/name", "v3") == ("org/name", "v3")
    with pytest.raises(QkvError, match="names revision 'v2', but revision 'v3'"):
        split_revision("org/name@v2", "v3")


def test_hub_name_loads_its_cached_snapshot_and_revision_picks_another(hub_cache):
    main_logits = _logits(hub_cache / "snapshots" / MAIN)
    other_logits = _logits(hub_cache / "snapshots" / OTHER)
    assert not torch.equal(main_logits, other_logits)
    assert torch.equal(_logits("org/tiny"), main_logits)
    assert torch.equal(_logits("org/tiny", revision="v2"), other_logits)
    assert torch.equal(_logits("org/tiny@v2"), other_logits)
    assert torch.equal(_logits("org/tiny", revision=OTHER), other_logits)  # a commit
    assert pretrained.hf_folder("org/tiny@v2") == (hub_cache / "snapshots" / OTHER, None, {})


def test_an_existing_path_wins_over_a_hub_name(hub_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(hub_cache / "snapshots" / OTHER, tmp_path / "org" / "tiny")
    assert torch.equal(_logits("org/tiny"), _logits(hub_cache / "snapshots" / OTHER))


def test_convert_hf_takes_a_hub_name_and_revision(hub_cache, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["convert", "hf", "org/tiny", str(run), "--revision", "v2"]) == 0
    assert torch.equal(_logits(run), _logits(hub_cache / "snapshots" / OTHER))
    assert json.loads((run / "hf.json").read_text())["source"] == "org/tiny@v2"


def test_uncached_hub_name_is_one_line_and_writes_nothing(hub_cache, tmp_path, capsys):
    cache = hub_cache.parent
    before = _files(cache)
    run = tmp_path / "run"
    for argv, name in (
        (["convert", "hf", "org/absent", str(run)], "org/absent"),
        (["convert", "hf", "org/tiny", str(run), "--revision", "v9"], "org/tiny@v9"),
        (["similarity", "a", "b", "--model", "org/absent", "--device", "cpu"], "org/absent"),
    ):
        capsys.readouterr()
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert err[0].startswith(
            f"error: {name} is not in the local cache and the Hub cannot be reached: offline mode"
        ), err[0]
        assert "hf download" in err[0]
    assert not run.exists()
    assert _files(cache) == before


def _http_error(kind, status: int):
    request = httpx.Request("GET", "https://huggingface.co/api/models/org/x")
    return kind("refused", response=httpx.Response(status, request=request))


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            _http_error(RepositoryNotFoundError, 401),
            "unknown Hub model org/x: no such model (nor local folder)",
        ),
        (_http_error(RevisionNotFoundError, 404), "Hub model org/x has no revision 'v2'"),
    ],
)
def test_hub_refusals_are_one_line(monkeypatch, error, message):
    def refuse(*args, **kwargs):
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(QkvError) as caught:
        download("org/x", "v2")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_unknown_name_mentions_hub_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    known = r"^unknown pretrained model 'no-such-model'; known: .*Hub name org/name, or an ESM-2 name"
    with pytest.raises(QkvError, match=known + r" such as esm2_t6_8M_UR50D\)$"):
        pretrained.load("no-such-model")
    with pytest.raises(QkvError, match="^HF folder not found: a/b/c$"):
        pretrained.load("a/b/c")


# --- Sapiens ---------------------------------------------------------------------------------

# fairseq RoBERTa → transformers' RobertaForMaskedLM, as transformers' own conversion script
# (convert_roberta_original_pytorch_checkpoint_to_pytorch) maps it: positions kept whole
_ROBERTA = (
    (r"embed_tokens", "roberta.embeddings.word_embeddings"),
    (r"embed_positions", "roberta.embeddings.position_embeddings"),
    (r"emb_layer_norm", "roberta.embeddings.LayerNorm"),
    *(
        (rf"layers\.(\d+)\.self_attn\.{short}_proj", rf"roberta.encoder.layer.\1.attention.self.{long}")
        for short, long in (("q", "query"), ("k", "key"), ("v", "value"))
    ),
    (r"layers\.(\d+)\.self_attn\.out_proj", r"roberta.encoder.layer.\1.attention.output.dense"),
    (r"layers\.(\d+)\.self_attn_layer_norm", r"roberta.encoder.layer.\1.attention.output.LayerNorm"),
    (r"layers\.(\d+)\.fc1", r"roberta.encoder.layer.\1.intermediate.dense"),
    (r"layers\.(\d+)\.fc2", r"roberta.encoder.layer.\1.output.dense"),
    (r"layers\.(\d+)\.final_layer_norm", r"roberta.encoder.layer.\1.output.LayerNorm"),
    (r"lm_head\.weight", "lm_head.decoder.weight"),
)


def _roberta_reference(chain: str) -> transformers.RobertaForMaskedLM:
    folder = pretrained.locate(f"sapiens-{chain}")[0]
    with torch.serialization.safe_globals([argparse.Namespace]):
        data = torch.load(folder / f"checkpoint_{chain}.pt", map_location="cpu", weights_only=True)
    state = {}
    for name, tensor in data["model"].items():
        name = name.removeprefix("decoder.sentence_encoder.").removeprefix("decoder.")
        for pattern, target in _ROBERTA:
            name = re.sub(f"^{pattern}", target, name)
        state[name] = tensor
    state["roberta.embeddings.token_type_embeddings.weight"] = torch.zeros(1, 128)
    config = transformers.RobertaConfig(
        vocab_size=25,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=8,
        intermediate_size=256,
        max_position_embeddings=len(state["roberta.embeddings.position_embeddings.weight"]),
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    model = transformers.RobertaForMaskedLM(config).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.decoder.bias", "lm_head.decoder.weight"}
    model.tie_weights()
    return model


def _vh_vl() -> dict[str, list[str]]:
    """The first 40 heavy and 40 light chains of the paratope test set (SAbDab structures)."""
    path = DATA / "antibody" / "paratope_test.tsv"
    if not path.is_file():
        pytest.skip(f"{path} not found (set QKV_DATA_DIR)")
    rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
    return {c: [r[5] for r in rows if r[1] == c][:40] for c in ("H", "L")}


@needs_sapiens
@pytest.mark.parametrize("chain", ["vh", "vl"])
def test_sapiens_mlm_logits_equal_transformers_roberta(chain):
    model, tok = pretrained.load(f"sapiens-{chain}")
    seqs = ["EVQLVESGGGLVQPGGSLRLSCAASGFTFS", "DIQMTQSPSSLSASVGDRV"]
    rows = [tok.encode(s) for s in seqs]
    assert rows[0][0] == 0 and rows[0][-1] == 2 and len(rows[0]) == len(seqs[0]) + 2  # <s> ... </s>
    ids = torch.tensor([r + [tok.pad_id] * (len(rows[0]) - len(r)) for r in rows])
    ids[0, 5] = tok.mask_id
    mask = ids != tok.pad_id
    with torch.no_grad():
        ours = model(ids, head="mlm").logits
        ref = _roberta_reference(chain)(input_ids=ids, attention_mask=mask.long()).logits
    assert (ours - ref)[mask].abs().max() <= 1e-5


@needs_sapiens
def test_sapiens_predicts_masked_residues_of_real_antibodies(tmp_path):
    chains = _vh_vl()
    assert pretrained.hf_folder("sapiens-vh") is None  # a fairseq checkpoint: no HF folder
    assert main(["convert", "hf", "sapiens-vh", str(tmp_path / "vh")]) == 0
    for name, chain in (("sapiens-vh", "H"), (str(tmp_path / "vh"), "H"), ("sapiens-vl", "L")):
        model, tok = pretrained.load(name)
        right = total = 0
        for seq in chains[chain]:
            ids = torch.tensor([tok.encode(seq[:142])])
            positions = torch.arange(1, ids.shape[1] - 1, 7)  # every 7th residue, masked at once
            target = ids[0, positions].clone()
            ids[0, positions] = tok.mask_id
            with torch.no_grad():
                guess = model(ids, head="mlm").logits[0, positions].argmax(-1)
            right += int((guess == target).sum())
            total += len(positions)
        assert right / total > 0.6, (name, right / total)  # chance: 1/20; the commonest residue ~0.12
