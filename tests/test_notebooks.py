"""Every notebook in notebooks/ runs top to bottom in quick mode (QKV_QUICK=1) without an error,
and its headline figures (the cell tagged ``key-result``) are numbers in their expected range.

Each notebook is executed by ``notebooks/execute.py`` (the same function ``make notebooks``
uses), in a fresh kernel; the committed notebooks are not modified. The figures that a
committed notebook's prose quotes are numbers that its committed outputs print (read from the
JSON, nothing executed: the rules are at ``QUOTED_ELSEWHERE`` below).
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

import nbformat
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
    "12_what_if": {
        # the characters before the name are the same in both lines, and causal attention keeps
        # their streams the same: patching them changes nothing, whatever the weights
        "LM patching before the name": (0.0, 0.0),
        # the class token's input (a learnt vector and its position) is the same in both runs
        "ViT patching, class token at layer 0": (0.0, 0.0),
        "LM p(newline) after a speaker's name": (0.0, 1.0),
        "translator agreement on 'are', test2016": (0.0, 1.0),
        # pretrained weights, no training: the answer is real even in quick mode
        "Sapiens test recovery, rest of the chain": (0.6, 1.0),
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


# ---------------------------------------------------------------------------------------------
# The prose quotes what the cells print.
#
# A notebook is committed with its outputs and the docs site shows both, so a figure that its
# text quotes must be one that its committed outputs print (stream and text/plain outputs). A
# *quoted figure* is a number in a markdown cell that states a result or a model's size:
#
# - a percentage ("47 %") or a decimal ("0.799"), which may also be a setting written in a code
#   cell (a "10 %" split that the code writes as 0.1);
# - a model's size ("6 layers", "3 + 3 layers", "4 heads", "d_model = 384" in its LaTeX
#   spellings, "26 M parameters") and a number right after a metric's name ("BLEU 40"): these
#   must be printed;
# - every number in a conclusion, a cell that begins with **What it says**: it must quote at
#   least one, and each must be printed by a cell above it.
#
# Not figures: code spans, links, headings, list markers, years, references (§3.2, Eq. 1,
# Figure 1, notebook 3, issue 47), durations (a notebook's time is the machine's, not the
# computation's), numbers inside names (test2016, H100, CDR-H3) and, outside conclusions, other
# whole numbers. A figure agrees with a printed number that is equal to it, or that rounds to
# it (for a decimal or percentage of two significant digits or more: "21.3" for 21.27); a
# percentage also agrees with a printed fraction ("79.9 %" with 0.799), a count in k/M/B with
# the count ("0.8 M" with 805,130 or "0.80 M"). A figure that comes from elsewhere (a longer
# run, a paper) is listed in QUOTED_ELSEWHERE with its source.
# ---------------------------------------------------------------------------------------------

# notebook stem -> {figures as the test names them, space-separated: their source}. A source
# "printed by <stem>" is checked: that notebook prints the figure. An entry that the prose no
# longer quotes, or that the notebook now prints, fails the test, so the list stays true.
QUOTED_ELSEWHERE: dict[str, dict[str, str]] = {
    "03_translator_live": {
        "2.5": "issue 47's sweep of rotary against sinusoidal positions",
        "15.9 23.6 39.4 43.3 41.9 40": "the budgets table: longer runs, benchmarks/RESULTS.md",
        "d_model=384 0.3": "the paper's recipe, configs/paper_base.json",
        "34.1 28.4 32.5 40.5 41.0": "the guide Why attention (benchmarks/why_attention.py)",
        "41.2 38.3": "40 minutes of each, the guide Why attention (benchmarks/race_curve.py)",
    },
    "04_language_model": {
        "d_model=128 4": "printed by 09_masked_diffusion_lm",  # the same lm recipe defaults
        "1.1": "tiny-shakespeare's size (the data README)",
        "1.88": "nanoGPT's README",
    },
    "05_pretrained_encoder": {
        "0.812 0.891 0.904 0.814 0.861 0.903 0.830": "SST-2 at full budgets and a TF-IDF baseline, "
        "benchmarks/RESULTS.md",
        "0.747 0.964 0.645 0.585": "paratope at the full recipe budget, benchmarks/RESULTS.md",
    },
    "06_images_vit": {
        "6 4": "the vit recipe's defaults (ViTConfig)",
        "0.907": "the vit recipe's own 30-minute budget, benchmarks/RESULTS.md",
    },
    "08_protein_research": {
        "d_model=128 4": "Sapiens's published size (Prihoda et al. 2022)",
        "54% 15B": "ESM-2's published contact precision and sizes (Lin et al. 2023)",
    },
    "09_masked_diffusion_lm": {
        "8B": "LLaDA's size (Nie et al. 2025)",
    },
    "10_inside_the_block": {
        "d_model=192": "printed by 03_translator_live",  # the translation recipe's defaults
    },
    "11_inside_other_models": {
        "8 d_model=512": "AntiBERTy's published size (Ruffolo et al. 2021)",
        "26M": "printed by 05_pretrained_encoder",  # AntiBERTy fine-tuned: 26.0 M parameters
    },
}

_GROUPED = r"\d{1,3}(?:(?:,|[ \u00a0\u202f])\d{3})+(?![\d.])"  # 1,000 and 1 000
_PLAIN = r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+"
PROSE_NUMBER = re.compile(rf"(?<![\w.\-/])({_GROUPED}|{_PLAIN})(?!\w)")
PRINTED_NUMBER = re.compile(rf"(?<![\w.])({_GROUPED}|{_PLAIN})(?!\w)")
DURATION = re.compile(r"\s*(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b")
LAYERS = re.compile(
    r"(?:\s*\+\s*\d+)?\s*(?:-layer\b|\s(?:(?:pre|post)-LN\s+|encoder\s+|decoder\s+)?layers\b)"
)
HEADS = re.compile(r"\s+(?:attention\s+)?heads\b")
PARAMETERS = re.compile(r"\s*([kMB])[\s-]+(?:parameters?|weights)\b")
METRIC = re.compile(
    r"\b(?:BLEU|chrF|accuracy|AUROC|AUPRC|MCC|F1|loss|perplexity|precision|recall|exact match|bound)"
    r"\s*(?:of|=|:|is|was)?\s*$"
)
WIDTH = re.compile(r"(?:d_\{?\\?(?:text|mathrm)?\{?model\}?\}?|\bd_model|\bD)\s*=?\s*(\d+)(?![\d.])")
REFERENCE = re.compile(
    r"§\s*\d+(?:\.\d+)*|\b(?:Eqs?\.|Figures?|Fig\.|Tables?|notebooks?|[Ss]ections?|issues?|Act|Scene)"
    r"\s+\d+(?:\s*(?:[–,-]|and)\s*\d+)*"
)
YEAR = re.compile(r"(?<![\d.,])(?<!\d[ ,\u00a0\u202f])(?:19|20)\d\d(?![\d.,%])")
CONCLUSION = re.compile(r"\s*\*\*What it says\*\*")
SCALE = {"k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "B": Decimal(10) ** 9}
ROUNDINGS = (ROUND_HALF_UP, ROUND_HALF_EVEN)


@dataclass(frozen=True)
class Figure:
    """A number quoted in a markdown cell: ``text`` names it ("47%", "d_model=384", "26M")."""

    text: str
    value: Decimal
    percent: bool = False
    scale: Decimal = Decimal(1)
    setting: bool = False  # may also be a literal in a code cell


def _number(token: str) -> Decimal:
    return Decimal(re.sub(r"[,\s]", "", token))


def numbers_in(text: str) -> set[Decimal]:
    """Every number in ``text`` (``4x3`` holds two; ``4.65 M`` is also 4650000), as printed;
    none inside a word (test2016)."""
    text = re.sub(r"(?<=\d)x(?=\d)", " x ", text)
    numbers = set()
    for match in PRINTED_NUMBER.finditer(text):
        numbers.add(_number(match.group(1)))
        unit = re.match(r"\s*([kMB])\b", text[match.end() :])
        if unit:
            numbers.add(_number(match.group(1)) * SCALE[unit.group(1)])
    return numbers


def printed_text(cell: nbformat.NotebookNode) -> str:
    """What a code cell printed: its streams and the text/plain of its results (figures left out)."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "text/plain" in out.get("data", {}) and not out.data["text/plain"].startswith("<Figure"):
            parts.append(out.data["text/plain"])
    return "\n".join(parts)


def printed_numbers(nb: nbformat.NotebookNode) -> set[Decimal]:
    """Every number the notebook's committed outputs print."""
    return set().union(*(numbers_in(printed_text(c)) for c in nb.cells if c.cell_type == "code"))


def code_literals(nb: nbformat.NotebookNode) -> set[Decimal]:
    """The numbers written in the notebook's code cells (comments left out; 10_000 is 10000)."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return numbers_in(re.sub(r"#.*", "", code).replace("_", ""))


def quoted_figures(markdown: str) -> list[Figure]:
    """The figures a markdown cell quotes (the rules above), in the order they appear."""

    def blank(match: re.Match[str]) -> str:
        return " " * len(match.group(0))

    text = re.sub(r"```.*?```", blank, markdown, flags=re.S)
    text = re.sub(r"`[^`\n]*`", blank, text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"https?://\S+|<[^>]+>", blank, text)
    text = re.sub(r"(?m)^#.*$", "", text)  # headings and their section numbers
    text = re.sub(r"(?m)^(\s*)\d+\.(?=\s)", r"\1", text)  # ordered-list markers
    figures = []

    def widths(part: str) -> str:
        for match in WIDTH.finditer(part):
            figures.append(Figure(f"d_model={match.group(1)}", Decimal(match.group(1))))
        return " " + WIDTH.sub(" ", part) if not part.startswith("$") else " "

    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", lambda m: widths(m.group(0)), text, flags=re.S)  # math
    text = widths(text)
    text = YEAR.sub(" ", REFERENCE.sub(" ", text))
    conclusion = bool(CONCLUSION.match(markdown))
    for match in PROSE_NUMBER.finditer(text):
        token, before, after = match.group(1), text[: match.start()], text[match.end() :]
        if DURATION.match(after):
            continue
        value = _number(token)
        percent = bool(re.match(r"\s*%", after))
        parameters = PARAMETERS.match(after)
        if parameters:
            unit = parameters.group(1)
            figures.append(Figure(f"{token}{unit}", value, scale=SCALE[unit]))
        elif conclusion or LAYERS.match(after) or HEADS.match(after) or METRIC.search(before[-40:]):
            figures.append(Figure(token + "%" * percent, value, percent))
        elif percent or re.search(r"[.eE]", token):
            figures.append(Figure(token + "%" * percent, value, percent, setting=True))
    return figures


def agrees(figure: Figure, numbers: set[Decimal], rounding: bool = True) -> bool:
    """Whether ``figure`` is one of ``numbers``, or one rounded to its digits (see above)."""
    quoted = figure.value
    exponent = quoted.as_tuple().exponent
    places = -exponent if isinstance(exponent, int) and exponent < 0 else 0
    step = Decimal(1).scaleb(-places)
    significant = len(str(quoted).replace(".", "").lstrip("0"))
    rounded = figure.scale > 1 or (significant >= 2 and (figure.percent or places > 0))
    may_round = rounding and rounded
    for number in numbers:
        if figure.scale > 1:
            candidates = {number / figure.scale}
        elif figure.percent:
            candidates = {number, number * 100}
        else:
            candidates = {number, number / 100} if quoted < 1 else {number}
        for candidate in candidates:
            if candidate == quoted:
                return True
            try:
                if may_round and any(candidate.quantize(step, mode) == quoted for mode in ROUNDINGS):
                    return True
            except InvalidOperation:  # more digits than the context holds: not this one
                continue
    return False


def unprinted_figures(nb: nbformat.NotebookNode) -> tuple[list[tuple[int, Figure]], list[str]]:
    """The figures a notebook's prose quotes that its committed outputs do not print, with their
    cell index, and the conclusions that quote no figure."""
    everything = printed_numbers(nb)
    literals = code_literals(nb)
    above: set[Decimal] = set()
    missing, bare = [], []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            above |= numbers_in(printed_text(cell))
            continue
        if cell.cell_type != "markdown":
            continue
        figures = quoted_figures(cell.source)
        conclusion = bool(CONCLUSION.match(cell.source))
        if conclusion and not figures:
            bare.append(f"cell {index} draws a conclusion and quotes no printed figure: {cell.source[:80]!r}")
        for figure in figures:
            printed = agrees(figure, above if conclusion else everything)
            if not printed and not (figure.setting and agrees(figure, literals, rounding=False)):
                missing.append((index, figure))
    return missing, bare


def test_quoted_figures_reads_figures_not_references():
    text = (
        "## 3 · AntiBERTy (Ruffolo et al. 2021, §3.2.1, Eq. 1, notebook 7)\n"
        "The model (6 layers, 6 heads, $d_{model}=384$, 3 + 3 layers, 0.8 M parameters) in 4.3 min "
        "scores BLEU 40 and 47 %; `train.lr=1e-4`, [a link](../a/b2.md), test2016, H100, 1 000 steps."
    )
    names = [f.text for f in quoted_figures(text)]
    assert names == ["d_model=384", "6", "6", "3", "3", "0.8M", "40", "47%"], names


def test_quoted_figures_agree_when_printed_or_rounded():
    printed = {Decimal("0.468"), Decimal("21.27"), Decimal("805130"), Decimal("31.7")}
    assert agrees(Figure("46.8%", Decimal("46.8"), percent=True), printed)
    assert agrees(Figure("47%", Decimal("47"), percent=True), printed)  # 46.8 % rounded
    assert agrees(Figure("21.3", Decimal("21.3")), printed)
    assert agrees(Figure("0.8M", Decimal("0.8"), scale=SCALE["M"]), printed)
    assert agrees(Figure("0.317", Decimal("0.317")), printed)  # printed as 31.7 %
    assert not agrees(Figure("21.2", Decimal("21.2")), printed)
    assert not agrees(Figure("5", Decimal("5")), printed)  # an integer agrees only when equal


def _notebook(markdown: str, printed: str) -> nbformat.NotebookNode:
    code = nbformat.v4.new_code_cell("print(...)")
    code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
    return nbformat.v4.new_notebook(cells=[code, nbformat.v4.new_markdown_cell(markdown)])


def test_unprinted_figures_catch_issue_68():
    # notebook 10 described a 6-layer, 6-head, d_model 384 model above a 4-layer, 4-head, 128 one
    shapes = "embed (1, 57, 128)\nlayers.0.self_attn.q (1, 4, 57, 32)\nlayer 3, neuron 507\n"
    missing, _ = unprinted_figures(_notebook("The model (6 layers, 6 heads, $d_{model}=384$).", shapes))
    assert [f.text for _, f in missing] == ["d_model=384", "6", "6"]
    assert unprinted_figures(_notebook("The model (4 layers, 4 heads, $d_{model}=128$).", shapes)) == ([], [])
    # notebook 11 drew a conclusion (CDR-H3 "later") that quoted none of the numbers above it
    rows = "CDR-H3: 23%, 28%, 36%, 47%\nrest of the chain: 34%, 50%, 63%, 88%\n"
    _, bare = unprinted_figures(_notebook("**What it says**: yes, CDR-H3 is recovered later.", rows))
    assert len(bare) == 1
    quoting = "**What it says**: less, not later: 23 % of its final 47 % after layer 1, 34 % of 88 %."
    assert unprinted_figures(_notebook(quoting, rows + "after layer 1\n")) == ([], [])
    missing, _ = unprinted_figures(_notebook("**What it says**: 49 % of its final accuracy.", rows))
    assert [f.text for _, f in missing] == ["49%"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_quoted_figures_are_printed(path: Path):
    """Every figure the committed notebook's prose quotes is one its committed outputs print."""
    nb = nbformat.read(path, as_version=4)
    missing, bare = unprinted_figures(nb)
    elsewhere = {
        figure: source
        for figures, source in QUOTED_ELSEWHERE.get(path.stem, {}).items()
        for figure in figures.split()
    }
    wrong = [f"cell {i}: {f.text!r} is not printed" for i, f in missing if f.text not in elsewhere]
    assert not bare + wrong, "\n".join(bare + wrong)
    # the list of figures from elsewhere stays true: each is still quoted, and still not printed here
    quoted = {f.text: f for _, f in missing}
    stale = [figure for figure in elsewhere if figure not in quoted]
    assert not stale, f"QUOTED_ELSEWHERE[{path.stem!r}] lists figures the prose no longer quotes: {stale}"
    for figure, source in elsewhere.items():
        if source.startswith("printed by "):
            other = nbformat.read(NOTEBOOK_DIR / f"{source.split()[-1]}.ipynb", as_version=4)
            assert agrees(quoted[figure], printed_numbers(other)), f"{path.stem}: {figure!r} is not {source}"
