"""Every notebook in notebooks/ runs top to bottom in quick mode (QKV_QUICK=1) without an error,
and its headline figures (the cell tagged ``key-result``) are numbers in their expected range.

Each notebook is executed by ``notebooks/execute.py`` (the same function ``make notebooks``
uses), in a fresh kernel; the committed notebooks are not modified.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"


def _load_execute():
    spec = importlib.util.spec_from_file_location("qkv_notebooks_execute", NOTEBOOK_DIR / "execute.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


execute = _load_execute()
NOTEBOOKS = execute.all_notebooks()

# Headline figures that hold in quick mode too: notebook stem -> {figure name: (low, high)}.
# Masked weights are exactly 0 and unmasked rows sum to 1 whatever the random inputs; the
# translator's BLEU after a quick budget (seconds of a tiny model) is only known to be a score.
RANGES: dict[str, dict[str, tuple[float, float]]] = {
    "01_attention_by_hand": {
        "orange -> lemon weight": (0.75, 0.85),  # the lecture's [0.1 0.1 0.8]
        "largest |qkv.nn - by hand|": (0.0, 1e-5),
        "largest |row sum - 1|": (0.0, 1e-5),
        "largest weight on a padding key": (0.0, 0.0),
        "largest weight on a future key": (0.0, 0.0),
        "output change from padding": (0.0, 0.0),
        "output change from the future": (0.0, 0.0),
    },
    "02_multi_head_and_positions": {
        "largest |qkv block - by hand|": (0.0, 1e-5),
        "largest |permuted output - permuted input's output|, no positions": (0.0, 1e-5),
        "largest |permuted output - permuted input's output|, sinusoids": (1e-2, math.inf),
        # "dog bites man" and "man bites dog" get one answer without positions: at most half right
        "subject accuracy, no positions": (0.0, 0.5),
        "subject accuracy, sinusoids": (0.9, 1.0),  # seeded; 1.0 after 100 steps
    },
    "03_translator_live": {
        "training steps": (1, math.inf),
        "validation BLEU": (0.0, 100.0),
        "test2016 BLEU": (0.0, 100.0),
    },
    "04_language_model": {
        "validation loss (nats/char)": (0.5, 4.2),  # ln 65 = 4.17: no worse than uniform
        # the KV cache changes the work, never the tokens (its speed is a benchmark, not a test)
        "tokens that differ with and without the KV cache, trained model": (0, 0),
        "tokens that differ with and without the KV cache, long context": (0, 0),
    },
    "05_pretrained_encoder": {
        "probe validation accuracy": (0.0, 1.0),
        "fine-tuned validation accuracy": (0.0, 1.0),
        "paratope validation AUPRC": (0.0, 1.0),
        "paratope test AUPRC": (0.0, 1.0),
    },
    "06_images_vit": {
        "validation accuracy": (0.0, 1.0),
        "test accuracy": (0.0, 1.0),
        "largest |patch matrix - convolution|": (0.0, 1e-5),
        "largest |rollout row sum - 1|": (0.0, 1e-5),
    },
    "07_multi_modality": {
        "test exact match": (0.0, 1.0),
        "test_novel exact match": (0.0, 1.0),
        "test garment accuracy": (0.0, 1.0),
        "nearest-neighbour test exact match": (0.0, 1.0),
        # a training caption never states a held-out pair, every novel scene holds one
        "nearest-neighbour test_novel exact match": (0.0, 0.0),
        "emoji test exact match (openmoji)": (0.0, 1.0),
        "largest |cross-attention row sum - 1|": (0.0, 1e-5),
    },
    "08_protein_research": {
        "Sapiens probe test AUROC": (0.0, 1.0),
        "composition probe test AUROC": (0.0, 1.0),
        "1NCB_H top-L/5 long-range precision": (0.0, 1.0),
        "1NCB_L top-L/5 long-range precision": (0.0, 1.0),
        # the wild type's own column is exactly 0, so the largest score is never below it
        "largest masked-marginal score": (0.0, math.inf),
    },
    "09_masked_diffusion_lm": {
        # log2 65 = 6.02: no worse than uniform (the bound too: [MASK] is never predicted, SUBS)
        "AR validation loss (bits/char)": (0.5, 6.1),
        "diffusion validation bound (bits/char)": (0.5, 6.1),
        # given tokens are carried over and every [MASK] is filled, whatever the weights
        "given characters changed by infilling": (0, 0),
        "masks left after generation": (0, 0),
    },
    "10_inside_the_block": {
        # the cache holds the model's own numbers: the stream is the sum of its parts
        "largest |rebuilt stream - cached stream|": (0.0, 1e-5),
        "largest |last layer's lens - logits|": (0.0, 1e-5),
        "newline neuron recall": (0.0, 1.0),
        "newline neuron precision": (0.0, 1.0),
        "lens top-1 after decoder layer 1": (0.0, 1.0),
    },
    "11_inside_other_models": {
        "largest |ViT's last lens - logits|": (0.0, 1e-5),
        "ViT lens last layer": (0.0, 1.0),
        "diffusion lens last layer t = 0.5": (0.0, 1.0),
        # pretrained weights, no training: the answer is real even in quick mode
        "AntiBERTy lens last layer, rest of the chain": (0.6, 1.0),
        "AntiBERTy lens last layer, CDR-H3": (0.0, 1.0),
        "captioner lens last layer, other words": (0.0, 1.0),
    },
}

NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")


def test_notebooks_exist():
    names = {p.stem for p in NOTEBOOKS}
    assert set(RANGES) <= names, f"missing notebooks: {set(RANGES) - names}"


def test_parse_figures_reads_name_value_lines():
    text = "validation BLEU: 12.5\nnot a figure\nratio: a: b\n"
    assert execute.parse_figures(text) == {"validation BLEU": "12.5", "ratio": "a: b"}


def test_resolve_by_prefix_and_refuses_unknown():
    first = NOTEBOOKS[0]
    assert execute.resolve([first.name[:2]]) == [first]
    with pytest.raises(SystemExit, match="matches 0 notebooks"):
        execute.resolve(["no_such_notebook"])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode(path: Path, tmp_path: Path):
    before = path.read_bytes()
    files_before = sorted(NOTEBOOK_DIR.rglob("*"))
    # The notebooks write their runs under tempfile's directory: keep them in pytest's.
    result = execute.execute(path, quick=True, env={"TMPDIR": str(tmp_path)})
    assert result.error is None, result.error
    assert path.read_bytes() == before, "a quick run must not rewrite the committed notebook"
    assert sorted(NOTEBOOK_DIR.rglob("*")) == files_before, "a notebook wrote inside notebooks/"

    code = [c for c in result.notebook.cells if c.cell_type == "code"]
    assert code and all(c.execution_count is not None for c in code), "every code cell ran"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors

    # The convention every notebook follows (notebooks/README.md): reads QKV_QUICK in its first
    # code cell, says its full-budget time in its first markdown cell.
    assert 'os.environ.get("QKV_QUICK") == "1"' in code[0].source
    first_md = next(c for c in result.notebook.cells if c.cell_type == "markdown")
    assert re.search(r"\d+\s*(min|minutes|s|seconds)\b", first_md.source), first_md.source[:200]

    figures = execute.parse_figures(execute.key_results(result.notebook))
    assert figures, "the cell tagged key-result prints `name: value` lines"
    for name, (low, high) in RANGES.get(path.stem, {}).items():
        assert name in figures, f"{name!r} not printed; printed: {sorted(figures)}"
        match = NUMBER.search(figures[name])
        assert match, f"{name}: {figures[name]!r} is not a number"
        assert low <= float(match.group(0)) <= high, f"{name} = {figures[name]} outside [{low}, {high}]"
