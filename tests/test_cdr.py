"""CDR-H3 spans, the held-out heavy-chain splits, and the IgLM infilling pieces of
benchmarks/cdr_h3_infill.py."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

from qkv.data.cdr import cdr_h3, cdr_h3_span, heavy_chain_splits
from qkv.data.tokenizers import AMINO_ACIDS, HFTokenizer
from qkv.errors import QkvError
from qkv.models import DecoderLM, LMConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("QKV_DATA_DIR", ROOT.parent / "shared" / "data"))
TRASTUZUMAB_VH = (
    "EVQLVESGGGLVQPGGSLRLSCAASGFNIKDTYIHWVRQAPGKGLEWVARIYPTNGYTRYADSVKGRFTISADTSKNTAYLQMNSLRAEDTAVYYC"
    "SRWGGDGFYAMDYWGQGTLVTVSS"
)
# IgLM's vocab.txt (iglm 0.1.0), id = index
IGLM_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"ACDEFGHIKLMNPQRSTVWY"] + [
    f"[{t}]" for t in ("CAMEL", "HUMAN", "MOUSE", "RABBIT", "RAT", "RHESUS", "HEAVY", "LIGHT")
]


def _benchmark():
    spec = importlib.util.spec_from_file_location("cdr_h3_infill", ROOT / "benchmarks" / "cdr_h3_infill.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def test_cdr_h3_of_trastuzumab_is_its_imgt_cdr3():
    start, end = cdr_h3_span(TRASTUZUMAB_VH)
    assert TRASTUZUMAB_VH[start:end] == "SRWGGDGFYAMDY"  # IMGT 105-117
    assert TRASTUZUMAB_VH[start - 1] == "C" and TRASTUZUMAB_VH[end : end + 4] == "WGQG"


def test_cdr_h3_with_its_own_cysteines_starts_after_the_framework_cys():
    h3 = "ARRVCYNRLGVCAGGMDY"
    assert cdr_h3(TRASTUZUMAB_VH.replace("SRWGGDGFYAMDY", h3)) == h3


def test_chains_without_a_cdr_h3_are_refused_in_one_line():
    with pytest.raises(QkvError, match="W-G-x-G") as err:
        cdr_h3_span(TRASTUZUMAB_VH[:-15])  # cut before the J region
    assert "\n" not in str(err.value)
    with pytest.raises(QkvError, match="longer than 35"):
        cdr_h3_span(TRASTUZUMAB_VH.replace("SRWGGDGFYAMDY", "ARDGSTYYY" * 5))
    assert cdr_h3("EVQLVESGGGLVQPGGSLRLSCAAS") is None


@pytest.mark.skipif(not (DATA / "antibody" / "paratope_test.tsv").is_file(), reason="antibody data not found")
def test_heavy_chain_splits_share_no_chain_and_no_cdr_h3():
    chains = heavy_chain_splits(DATA)
    assert (len(chains.train), len(chains.val), len(chains.test)) == (1588, 42, 46)
    held = chains.val + chains.test
    assert len(set(held)) == len(held) and len(set(chains.train)) == len(chains.train)
    h3 = {cdr_h3(s) for s in held}
    assert None not in h3
    assert not set(chains.train) & set(held) and not {cdr_h3(s) for s in chains.train} & h3
    assert not {cdr_h3(s) for s in chains.val} & {cdr_h3(s) for s in chains.test}


def test_iglm_prompt_is_its_infilling_format():
    bench = _benchmark()
    tok = HFTokenizer.from_tokens(IGLM_VOCAB)
    ids = bench.iglm_prompt(tok, "EVQ", "WGQG")
    assert [IGLM_VOCAB[i] for i in ids] == [
        "[HEAVY]",
        "[HUMAN]",
        "E",
        "V",
        "Q",
        "[MASK]",
        "W",
        "G",
        "Q",
        "G",
        "[SEP]",
    ]


def test_greedy_infill_writes_exactly_length_residues_or_stops_at_the_end_token():
    bench = _benchmark()
    lm = DecoderLM(
        LMConfig(vocab_size=len(IGLM_VOCAB), d_model=16, n_heads=2, d_ff=32, n_layers=1, max_len=64)
    )
    lm.eval()
    end, residues = IGLM_VOCAB.index("[CLS]"), [IGLM_VOCAB.index(a) for a in AMINO_ACIDS]

    class EndFirst(torch.nn.Module):  # a model whose first choice is always the end token
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, x):
            out = self.lm(x)
            out.logits[..., end] += 100.0
            return out

    prompt = [31, 26, 8, 22, 4, 19, 3]
    fixed = bench.greedy_infill(EndFirst(), prompt, residues, end, length=7)
    assert len(fixed) == 7 and set(fixed) <= set(residues)
    assert bench.greedy_infill(EndFirst(), prompt, residues, end) == []
    free = bench.greedy_infill(lm, prompt, residues, end, max_new=5)
    assert len(free) <= 5 and set(free) <= set(residues)
    assert bench.recovery("ARDY", "AR") == 0.5 and bench.recovery("ARDY", "ARDYWG") == 1.0
