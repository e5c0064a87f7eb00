"""Parity of qkv's hook points with TransformerLens (issue 68): on one random GPT-2 converted by
qkv's own converter and loaded into TransformerLens's ``HookedTransformer`` with the same
weights (TransformerLens's GPT-2 conversion, no weight processing), the logits after (a) zeroing
head 3 of layer 5, (b) patching layer 6's ``resid_pre`` at the last position from a second
input, (c) zeroing 10 FFN neurons equal TransformerLens's ``run_with_hooks`` to ≤ 1e-4, and the
recorded activations equal its ``run_with_cache``. The head ablation is one call
(two lines of user code with its import; TransformerLens's takes four).

The model keeps GPT-2 small's 12 layers, 12 heads and settings (GELU-tanh, LayerNorm, biases,
tied embeddings) at a quarter of its width (d_model 192, d_ff 768), vocabulary 1000, context 64:
at the full width (d_model 768, d_ff 3072) this file took 29 s instead of 12 on a shared 2-core
CPU (each about 10 s of it importing transformer-lens; the rest mostly building the 85 M random
parameters). ``benchmarks/transformer_lens_parity.py``
runs the same comparisons at GPT-2 small's full shape.

Runs when transformer-lens < 4 is installed (``pip install -e '.[interp]'``): transformer-lens
4.0 removed ``HookedTransformer``. It is imported inside the fixture, not at collection:
importing it takes seconds (it loads ``datasets``, ``pandas``, ``pyarrow``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from qkv.explain import ablate_heads, ablate_neurons, patch_from, run_with_cache, run_with_hooks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformer_lens") is None,
    reason="the parity reference is not installed (pip install -e '.[interp]': transformer-lens < 4)",
)

TOL = 1e-4
LAYERS, D_MODEL, HEADS, D_FF, VOCAB, N_CTX = 12, 192, 12, 768, 1000, 64
NEURONS = [7, 100, 101, 250, 333, 400, 512, 600, 701, 767]  # of layer 2's FFN


def _benchmark() -> ModuleType:
    """benchmarks/transformer_lens_parity.py as a module: its ``build`` makes the two models (one
    place for the weight loading both sides must agree on)."""
    folder = Path(__file__).resolve().parent.parent / "benchmarks"
    spec = importlib.util.spec_from_file_location(
        "transformer_lens_parity", folder / "transformer_lens_parity.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    sys.path.insert(0, str(folder))  # for its `from common import machine`
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
    return module


@pytest.fixture(scope="module")
def models():
    """(qkv DecoderLM, TransformerLens HookedTransformer) with the weights of one random HF
    ``GPT2LMHeadModel`` (never downloaded), built by the benchmark's ``build``."""
    pytest.importorskip("transformers", reason="builds the HF GPT-2: pip install transformers")
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError as exc:  # 4.0 raises ImportError with a migration note for HookedTransformer
        pytest.skip(f"this transformer-lens has no HookedTransformer (4.0 removed it; install < 4): {exc}")
    bench = _benchmark()
    config = bench.gpt2_config(
        layers=LAYERS, d_model=D_MODEL, heads=HEADS, d_ff=D_FF, vocab=VOCAB, n_ctx=N_CTX
    )
    return bench.build(config, seed=0)


@pytest.fixture(scope="module")
def inputs():
    """Two inputs of the same length (batch 2 × 16 tokens): the run, and the patch's source."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (2, 16), generator=g), torch.randint(0, VOCAB, (2, 16), generator=g)


def _check(ours: torch.Tensor, theirs: torch.Tensor, plain: torch.Tensor) -> None:
    """Equal to TransformerLens's logits, and moved by the intervention (far beyond the bound),
    so the agreement is not that of two untouched runs."""
    assert (ours - theirs).abs().max().item() <= TOL
    assert (ours - plain).abs().max().item() > 100 * TOL


@torch.no_grad()
def test_unhooked_logits_agree(models, inputs):
    ours, tl = models
    tokens, _ = inputs
    assert (ours(tokens).logits - tl(tokens)).abs().max().item() <= TOL


@torch.no_grad()
def test_zeroing_head_3_of_layer_5_matches_transformer_lens(models, inputs):
    ours, tl = models
    tokens, _ = inputs

    def zero_head(z, hook):  # TransformerLens: z (B, T, H, d_head)
        z[:, :, 3] = 0
        return z

    theirs = tl.run_with_hooks(tokens, fwd_hooks=[("blocks.5.attn.hook_z", zero_head)])
    mine = run_with_hooks(ours, tokens, hooks=ablate_heads("layers.5.self_attn", 3)).logits
    _check(mine, theirs, ours(tokens).logits)


@torch.no_grad()
def test_patching_resid_pre_of_layer_6_at_the_last_position_matches_transformer_lens(models, inputs):
    ours, tl = models
    tokens, source = inputs
    _, tl_cache = tl.run_with_cache(source)

    def patch_last(resid, hook):
        resid[:, -1] = tl_cache[hook.name][:, -1]
        return resid

    theirs = tl.run_with_hooks(tokens, fwd_hooks=[("blocks.6.hook_resid_pre", patch_last)])
    _, cache = run_with_cache(ours, source)
    mine = run_with_hooks(ours, tokens, hooks=patch_from(cache, "layers.6.resid_pre", positions=[-1])).logits
    plain = ours(tokens).logits
    _check(mine, theirs, plain)
    assert torch.equal(mine[:, :-1], plain[:, :-1])  # causal: the earlier positions never see it


@torch.no_grad()
def test_zeroing_ten_ffn_neurons_matches_transformer_lens(models, inputs):
    ours, tl = models
    tokens, _ = inputs

    def zero_neurons(post, hook):  # TransformerLens: the MLP's hidden activations (B, T, d_mlp)
        post[:, :, NEURONS] = 0
        return post

    theirs = tl.run_with_hooks(tokens, fwd_hooks=[("blocks.2.mlp.hook_post", zero_neurons)])
    mine = run_with_hooks(ours, tokens, hooks=ablate_neurons("layers.2.ffn", NEURONS)).logits
    _check(mine, theirs, ours(tokens).logits)


@torch.no_grad()
def test_recorded_activations_equal_transformer_lens_run_with_cache(models, inputs):
    ours, tl = models
    tokens, _ = inputs
    _, cache = run_with_cache(ours, tokens)
    _, tl_cache = tl.run_with_cache(tokens)
    same = {
        "layers.6.resid_pre": "blocks.6.hook_resid_pre",
        "layers.5.self_attn.pattern": "blocks.5.attn.hook_pattern",  # (B, H, Tq, Tk) in both
        "layers.5.self_attn.z": "blocks.5.attn.hook_z",  # (B, T, H, d_head) in both
        "layers.5.self_attn.out": "blocks.5.hook_attn_out",
        "layers.2.ffn.pre": "blocks.2.mlp.hook_pre",
        "layers.2.ffn.hidden": "blocks.2.mlp.hook_post",
        "layers.11.resid_post": "blocks.11.hook_resid_post",
    }
    for name, tl_name in same.items():
        assert cache[name].shape == tl_cache[tl_name].shape, name
        assert (cache[name] - tl_cache[tl_name]).abs().max().item() <= TOL, name
    # queries: qkv keeps heads before positions (B, H, T, d_k), TransformerLens after (B, T, H, d_head)
    q = cache["layers.5.self_attn.q"].transpose(1, 2)
    assert (q - tl_cache["blocks.5.attn.hook_q"]).abs().max().item() <= TOL


HEAD_ABLATION = """\
from qkv.explain import ablate_heads, run_with_hooks
logits = run_with_hooks(lm, tokens, hooks=ablate_heads("layers.5.self_attn", 3)).logits
"""


@torch.no_grad()
def test_head_ablation_is_at_most_four_lines_of_user_code(models, inputs):
    """What a user writes to zero head 3 of layer 5, import included, runs as written and gives
    TransformerLens's logits (TransformerLens's own is four lines: a hook function of three
    and the ``run_with_hooks`` call)."""
    ours, tl = models
    tokens, _ = inputs
    assert len(HEAD_ABLATION.strip().splitlines()) <= 4
    scope = {"lm": ours, "tokens": tokens}
    exec(HEAD_ABLATION, scope)

    def zero_head(z, hook):
        z[:, :, 3] = 0
        return z

    theirs = tl.run_with_hooks(tokens, fwd_hooks=[("blocks.5.attn.hook_z", zero_head)])
    assert (scope["logits"] - theirs).abs().max().item() <= TOL
