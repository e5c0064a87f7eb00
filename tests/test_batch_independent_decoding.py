"""A sentence decodes the same alone or in any batch (issue 69): each sentence stops at its own
length limit, its source length + 50 (Vaswani et al. 2017, §6.1: "maximum output length ...
input length + 50"), or ``max_new_tokens`` if smaller, never past the model's ``max_len``;
not at the batch's longest source + 50.

The tiny translation run of ``tiny_runs`` has random weights: its translations never end, so
every sentence runs to its limit, which is what these tests need to tell the two rules apart.
"""

from __future__ import annotations

import io
import sys

import pytest
import torch
from cli_runs import refused, run_main
from test_model import tiny_config

from qkv.explain.explainer import DecodingOptions
from qkv.explain.explainers import TranslationExplainer
from qkv.inference.search import beam_search, greedy_decode
from qkv.inference.translator import Translator
from qkv.models import Transformer

EXTRA = 50  # §6.1's "+ 50"
RUN_MAX_LEN = 64  # the tiny translation run's max_len (tests/conftest.py)

TEXT = "Ein Mann fährt mit dem Fahrrad durch den Park , und eine Frau liest ein Buch im Park ."
WORDS = TEXT.split()
# Sources of 1 to 19 words: the short ones' limits (pieces + eos + 50) are under the run's
# max_len, the long ones' reach it, so a batch's longest limit exceeds the short ones' own.
SENTENCES = [" ".join(WORDS[: 1 + (7 * i) % len(WORDS)]) for i in range(22)]


@pytest.fixture(scope="module")
def sentence_file(tmp_path_factory):
    """A file of sentences, one per line, a blank one among them."""
    path = tmp_path_factory.mktemp("batch_independent") / "sentences.de"
    path.write_text("\n".join([*SENTENCES[:10], "", *SENTENCES[10:]]) + "\n", encoding="utf-8")
    return path


def _cli_translate(capsys, monkeypatch, run, path, *options: str) -> list[str]:
    """``qkv translate RUN OPTIONS < path`` in this process: its output lines."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes()), encoding="utf-8"))
    code, out, err = run_main(capsys, "translate", str(run), "--device", "cpu", *options)
    assert code == 0, err
    return out.splitlines()


@pytest.mark.parametrize("beam", [1, 4])
def test_a_file_translates_to_the_same_lines_in_batches_of_1_7_and_64(
    tiny_runs, sentence_file, capsys, monkeypatch, beam
):
    """``qkv translate --batch-size 1 / 7 / 64`` print the same lines, greedy and beam; and
    sentences of the batch of 64 stop at their own limit, under the batch's longest one (where
    the batch's longest source + 50 would have made them longer than alone)."""
    run = tiny_runs["translation"]
    lines = {
        size: _cli_translate(
            capsys, monkeypatch, run, sentence_file, "--beam", str(beam), "--batch-size", str(size)
        )
        for size in (1, 7, 64)
    }
    assert len(lines[1]) == len(SENTENCES) + 1 and lines[1][10] == ""
    assert lines[1] == lines[7] == lines[64]

    translator = Translator.from_run(run, beam_size=beam, batch_size=64)
    sources = translator.encode_sources(SENTENCES)
    hyps = translator.translate_ids(sources)
    assert translator.tokenizer.decode_batch(hyps) == lines[64][:10] + lines[64][11:]
    limits = [min(len(s) + 1 + EXTRA, RUN_MAX_LEN) for s in sources]  # + 1: the eos
    assert all(len(h) <= lim for h, lim in zip(hyps, limits, strict=True))
    at_own_limit = [len(h) == lim < max(limits) for h, lim in zip(hyps, limits, strict=True)]
    assert sum(at_own_limit) >= 3, "too few sentences stopped at a limit under the batch's longest"


@pytest.mark.parametrize("beam", [1, 4])
def test_the_live_page_translates_as_qkv_translate_in_a_batch(tiny_runs, beam):
    """The page's explainer decodes one sentence; it gets the translation ``qkv translate``
    gives the same sentence among longer ones."""
    run = tiny_runs["translation"]
    translated = Translator.from_run(run, beam_size=beam, batch_size=64).translate(SENTENCES)
    explainer = TranslationExplainer(run)
    for i in (0, 1, 3):  # 1, 8 and 3 words: limits under the batch's longest
        shown = explainer.explain(SENTENCES[i], DecodingOptions(beam_size=beam, alpha=0.6)).output["text"]
        assert shown == translated[i], SENTENCES[i]


def test_the_page_decodes_a_run_as_qkv_translate_by_default(
    tiny_runs, tmp_path, capsys, monkeypatch, sentence_file
):
    """With no beam or alpha asked, the explainer decodes with the run's own (its settings'
    ``beam_size`` and ``alpha``, as ``qkv translate`` does), not the paper's 4 and 0.6."""
    import json
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_runs["translation"], run)
    settings = json.loads((run / "train_config.json").read_text())
    (run / "train_config.json").write_text(json.dumps({**settings, "beam_size": 2, "alpha": 1.5}))
    lines = _cli_translate(capsys, monkeypatch, run, sentence_file)
    assert lines == Translator.from_run(run, beam_size=2, alpha=1.5).translate(
        [*SENTENCES[:10], "", *SENTENCES[10:]]
    )
    explainer = TranslationExplainer(run)
    shown = {i: explainer.explain(SENTENCES[i]).output for i in (0, 1, 3)}
    assert all(o["decoding"] == "beam search, beam size 2" for o in shown.values())
    assert [o["text"] for o in shown.values()] == [lines[i] for i in (0, 1, 3)]


def test_batch_size_must_be_a_positive_integer(tiny_runs, capsys):
    """``--batch-size 0`` is refused in one line naming the option; a non-integer by the parser."""
    run = str(tiny_runs["translation"])
    refused(run_main(capsys, "translate", run, "--batch-size", "0", "Hallo"), "--batch-size", "got 0")
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal, in this process
        run_main(capsys, "translate", run, "--batch-size", "x", "Hallo")
    refused((exit_.value.code, *capsys.readouterr()), "--batch-size", "'x'")
    with pytest.raises(ValueError, match="batch size"):
        Translator.from_run(tiny_runs["translation"], batch_size=0)


# --------------------------------------------------------------------------- the search functions

PAD, BOS, EOS = 0, 1, 2
LENGTHS = [7, 5, 3, 6, 1, 4]  # real tokens of each source row (eos included), padded to 7


class NeverEnds:
    """A Transformer whose decoder never chooses ``eos`` (its logit is -inf): every row runs to
    its length limit."""

    def __init__(self, model: Transformer) -> None:
        self.model, self.config = model, model.config
        self.encode, self.new_caches, self.parameters = model.encode, model.new_caches, model.parameters

    def decode(self, tgt, memory, src_mask, caches=None, start_pos=0, need_weights=False):
        logits, self_w, cross_w = self.model.decode(tgt, memory, src_mask, caches, start_pos, need_weights)
        logits[..., EOS] = float("-inf")
        return logits, self_w, cross_w


def _model(max_len: int = 128, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(tiny_config(max_len=max_len)).eval()


def _sources() -> torch.Tensor:
    src = torch.randint(3, 13, (len(LENGTHS), max(LENGTHS)), generator=torch.Generator().manual_seed(1))
    for i, n in enumerate(LENGTHS):
        src[i, n:] = PAD
    return src


def _search(kind: str, model, src, **kwargs) -> list[list[int]]:
    return greedy_decode(model, src, **kwargs) if kind == "greedy" else beam_search(model, src, 3, **kwargs)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
@pytest.mark.parametrize(
    ("max_len", "max_new_tokens", "expected"),
    [
        (128, None, [n + EXTRA for n in LENGTHS]),  # each row its own source + 50, padding not counted
        (55, None, [min(n + EXTRA, 55) for n in LENGTHS]),  # never past max_len
        (128, 53, [min(n + EXTRA, 53) for n in LENGTHS]),  # max_new_tokens when smaller
        (128, 0, [0] * len(LENGTHS)),
    ],
)
def test_each_row_stops_at_its_own_limit(kind, max_len, max_new_tokens, expected):
    """With a model that never emits eos, row i's output has exactly its own limit's length."""
    model = NeverEnds(_model(max_len))
    out = _search(kind, model, _sources(), max_new_tokens=max_new_tokens)
    assert [len(row) for row in out] == expected
    assert all(EOS not in row and PAD not in row for row in out)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_row_decodes_as_alone_when_some_end_early_and_some_at_their_limit(kind):
    """On a model whose eos is likely enough that some rows end early and others run to their
    limit, the batch's rows equal each source decoded alone."""
    model = _model(seed=6)
    with torch.no_grad():  # seed and factor chosen so that both happen, greedy and beam
        model.generator.weight[EOS] *= 2.0
    src = _sources()
    batched = _search(kind, model, src, extra_len=6)
    limits = [n + 6 for n in LENGTHS]
    assert any(len(row) < lim for row, lim in zip(batched, limits, strict=True))
    assert any(len(row) == lim < max(limits) for row, lim in zip(batched, limits, strict=True))
    for i, n in enumerate(LENGTHS):
        assert _search(kind, model, src[i : i + 1, :n], extra_len=6) == [batched[i]]


def test_a_negative_max_new_tokens_is_refused():
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_decode(_model(), _sources(), max_new_tokens=-1)
