"""A model family declares itself: its logit-lens readout and its hook points come from its model
class, its ONNX graphs and its explainer from one registry entry each, keyed by its model type
(``qkv.models.model_types``). Held here by a rule (no ``isinstance`` on a family's model or
config class outside the family registries) and by a toy family added through CONTRIBUTING's
"A model family" list alone."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch
from torch import nn

from qkv.data.tokenizers import CharTokenizer
from qkv.explain.activations import logit_lens, readout, run_with_cache
from qkv.explain.explainer import Explainer, _Pass
from qkv.explain.hooks import hook_points, run_with_hooks
from qkv.files import save_weights, write_json
from qkv.hub import onnx_export
from qkv.models import model_types
from qkv.models.config import ModelConfig
from qkv.models.model_types import MODEL_TYPES, ModelType, for_model
from qkv.models.outputs import LMOutput
from qkv.nn.layers import SelfAttentionLayer, norm
from qkv.recipes import registry
from qkv.recipes.loading import load_explainer
from qkv.recipes.recipe import Recipe

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "qkv"

# The one module that may test a model's family by its class: the registry of model types
# (hub/families.py picks an HF family by the model type's name).
REGISTRIES = {"models/model_types.py"}
# every family's model and config class, read before any test adds a family
FAMILY_CLASSES = frozenset(
    name for kind in MODEL_TYPES.values() for name in (kind.model.__name__, kind.config.__name__)
)


def _names(node: ast.AST) -> set[str]:
    """The class names an ``isinstance`` target holds: a name, ``module.Name``, a tuple of them
    or a union ``A | B``."""
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(n) for n in node.elts))
    if isinstance(node, ast.BinOp):
        return _names(node.left) | _names(node.right)
    return set()


def family_checks(source: str) -> list[tuple[int, str]]:
    """``(line, class)`` of each ``isinstance``/``issubclass`` on a family's class, and each
    ``type(x) is Class`` (or ``==``), in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets: set[str] = set()
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
            targets = _names(node.args[1]) if len(node.args) == 2 else set()
        elif (
            isinstance(node, ast.Compare) and getattr(getattr(node.left, "func", None), "id", None) == "type"
        ):
            targets = set().union(*(_names(n) for n in node.comparators))
        found += [(node.lineno, name) for name in sorted(targets & FAMILY_CLASSES)]
    return found


def test_the_rule_finds_family_checks_in_every_form():
    source = (
        "isinstance(m, DecoderLM)\n"
        "isinstance(m, (models.EncoderModel, int))\n"
        "isinstance(c, LMConfig | ViTConfig)\n"
        "type(m) is CaptionModel\n"
        "issubclass(k, RNNSeq2Seq)\n"
        "isinstance(m, nn.Module)\n"
    )
    assert family_checks(source) == [
        (1, "DecoderLM"),
        (2, "EncoderModel"),
        (3, "LMConfig"),
        (3, "ViTConfig"),
        (4, "CaptionModel"),
        (5, "RNNSeq2Seq"),
    ]


def test_no_family_is_told_by_its_class_outside_the_registries():
    """A family's readout, graphs, hook roles and explainer are its own declarations; a check of a
    user's model goes through ``model_types.built_as``/``for_model``/``for_config``."""
    found = [
        f"src/qkv/{path.relative_to(PKG)}:{line}: {name}"
        for path in sorted(PKG.rglob("*.py"))
        if path.relative_to(PKG).as_posix() not in REGISTRIES
        for line, name in family_checks(path.read_text(encoding="utf-8"))
    ]
    assert not found, (
        "family classes tested outside the registries (ask models/model_types.py):\n" + "\n".join(found)
    )


def test_every_place_contributing_names_for_a_family_exists():
    """CONTRIBUTING's "A model family" list names files and registries that are there."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("### A model family", 1)[1].split("\n### ", 1)[0]
    paths = set(re.findall(r"`((?:models|hub|explain|recipes|nn|runs)/[\w/]+\.py)", section))
    assert {"models/model_types.py", "hub/onnx_export.py", "recipes/registry.py"} <= paths
    assert [p for p in sorted(paths) if not (PKG / p).is_file()] == []
    for name in ("readout", "readout_stack", "hook_roles", "GRAPHS", "explainer"):
        assert f"`{name}" in section, name


# ---- a toy family, added through CONTRIBUTING's list alone ------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToyConfig(ModelConfig):
    """1. a frozen config (``models/config.py`` for a real family)."""

    vocab_size: int = 12
    n_layers: int = 2
    d_model: int = 8
    n_heads: int = 2
    d_ff: int = 16
    dropout: float = 0.0
    norm_first: bool = True
    positional: Literal["none"] = "none"  # the toy has no position encodings
    max_len: int = 16


class ToyLM(nn.Module):
    """1. the model class, from ``qkv.nn`` blocks: embeddings, causal self-attention layers, a
    final norm and a head; its ``readout`` is the logit lens's head."""

    def __init__(self, config: ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(SelfAttentionLayer(config) for _ in range(config.n_layers))
        self.final_norm = norm(config)
        self.head = nn.Linear(config.d_model, config.vocab_size)

    def forward(self, tokens: torch.Tensor, need_weights: bool = False) -> LMOutput:
        x, weights = self.embed(tokens), []
        for layer in self.layers:
            x, w = layer(x, need_weights=need_weights, is_causal=True)
            weights.append(w)
        return LMOutput(self.readout(x), tuple(weights) if need_weights else ())

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.final_norm(hidden))


TOY = ModelType("toy", ToyConfig, ToyLM)
TEXT = "abcab"


class ToyExplainer(Explainer[str]):
    """4. its explainer (named by its recipe's ``explainer``): attention over the input."""

    family, kinds = "toy", ("decoder",)

    def __init__(self, run_dir, device="cpu", max_chars=100) -> None:
        from qkv import runs

        model, self.tokenizer = runs.load_run(run_dir, device=device)
        super().__init__(model, run_dir, max_chars)

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def _prepare(self, text, options):
        ids = self.tokenizer.encode(text)
        tokens = torch.tensor([ids])
        pieces = list(text)

        def forward(need_weights):
            return {"decoder": self.model(tokens, need_weights=need_weights).attentions}

        return _Pass(forward, {"decoder": (pieces, pieces)}, {"text": text})


@pytest.fixture
def toy_run(tmp_path, monkeypatch):
    """The toy family registered as CONTRIBUTING lists (its model type, its ONNX graphs, a recipe
    naming its explainer), and a run directory of it."""
    monkeypatch.setitem(MODEL_TYPES, TOY.name, TOY)  # 2. its line in models/model_types.py
    monkeypatch.setitem(onnx_export.GRAPHS, TOY.name, onnx_export.token_graphs)  # 3. hub/onnx_export.py
    recipe = Recipe("toy", None, None, None, (), None, TOY, ToyExplainer, "text")
    monkeypatch.setitem(registry.RECIPES, "toy", recipe)  # 4. recipes/registry.py
    torch.manual_seed(0)
    tokenizer = CharTokenizer.train("abc")
    config = ToyConfig(vocab_size=tokenizer.vocab_size)
    run = tmp_path / "toy"
    run.mkdir()
    save_weights(ToyLM(config), run / "model.safetensors")
    write_json(run / "config.json", config.to_dict())
    write_json(run / "train_config.json", {"recipe": "toy", "model_type": "toy"})
    tokenizer.save(run / "tokenizer.json")
    return run, tokenizer


def test_a_toy_family_reads_its_logit_lens_and_hook_points_from_its_class(toy_run):
    model = ToyLM(ToyConfig()).eval()
    assert for_model(model) is TOY and model_types.built_as(model, TOY)
    tokens = torch.tensor([[1, 2, 3, 1]])
    out, cache = run_with_cache(model, tokens)
    stack, head = readout(model)
    assert stack == "" and head == model.readout
    lens = logit_lens(model, cache)  # (n_layers, B, T, V); its last row is the model's logits
    assert lens.shape == (2, 1, 4, 12)
    torch.testing.assert_close(lens[-1], out.logits)
    names = hook_points(model)
    for name in ("layers.1.self_attn.pattern", "layers.0.ffn.hidden", "final_norm", "logits"):
        assert name in names and name in cache
    assert cache["layers.0.self_attn.pattern"].shape == (1, 2, 4, 4)

    def zero(z, name):
        return torch.zeros_like(z)

    patched = run_with_hooks(model, tokens, hooks=[("layers.1.resid_post", zero)]).logits
    torch.testing.assert_close(patched, model.readout(torch.zeros(1, 4, 8)))


def test_a_toy_family_exports_to_onnx_through_its_registry_entry(toy_run, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    run, tokenizer = toy_run
    folder = onnx_export.export_onnx(run, tmp_path / "onnx").out
    assert onnx_export.read_manifest(folder)["graphs"]["model.onnx"]["inputs"] == ["tokens"]
    from qkv import runs

    model, _ = runs.load_run(run)
    ids = np.array([tokenizer.encode("abcba")], dtype=np.int64)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"tokens": ids})
    with torch.no_grad():
        expected = model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-4)


def test_a_toy_family_is_explained_by_the_explainer_its_recipe_names(toy_run):
    run, tokenizer = toy_run
    explainer = load_explainer(run)
    assert isinstance(explainer, ToyExplainer)
    explanation = explainer.explain(TEXT)
    assert [m.kind for m in explanation.attention] == ["decoder"]
    assert explanation.attention[0].weights.shape == (2, 2, 5, 5)  # (layers, heads, T, T)
    block = explanation.output["block"]  # the logit lens over the toy's own readout
    assert (
        block["stack"] == "layers"
        and len(block["layers"]) == 2
        and block["vocab_size"] == tokenizer.vocab_size
    )
    value = explainer.activation(TEXT, "layers.0.ffn.hidden", 2)
    assert value["shape"] == [1, 5, 16]
