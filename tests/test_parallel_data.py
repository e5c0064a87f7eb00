"""``qkv train translation data=PAIRS.tsv``: a user's own parallel data (qkv.data.parallel), its
checks (one line each, naming the line, nothing written), the split drawn by seed, and tiny
runs on text and on protein pairs."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
from cli_runs import qkv, refused, run_main

from qkv.data.parallel import read_pairs, split_pairs
from qkv.errors import QkvError

# A made-up language pair the tiny model can learn in seconds: each word has one translation.
WORDS = {
    "one": "eins",
    "two": "zwei",
    "three": "drei",
    "four": "vier",
    "five": "fünf",
    "red": "rot",
    "green": "grün",
    "blue": "blau",
    "dog": "Hund",
    "cat": "Katze",
    "runs": "läuft",
    "sleeps": "schläft",
}
TINY = [
    "model.d_model=64",
    "model.n_heads=2",
    "model.d_ff=128",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "model.max_len=32",
    "train.warmup_steps=20",
    "train.max_minutes=null",
    "train.eval_every=100",
    "train.threads=1",
    "vocab_size=100",
    "beam_size=2",
]


def word_pairs(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    words = list(WORDS)
    pairs = []
    for _ in range(n):
        sentence = rng.choices(words, k=rng.randint(2, 5))
        pairs.append((" ".join(sentence), " ".join(WORDS[w] for w in sentence)))
    return pairs


def write_tsv(path: Path, pairs, header: str | None = None) -> Path:
    lines = ([header] if header else []) + ["\t".join(p) for p in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------- reading and its refusals


def test_reads_two_fields_or_two_named_columns(tmp_path):
    plain = read_pairs(write_tsv(tmp_path / "p.tsv", [("a b", "x y"), ("c", "z")]))
    assert (plain.src, plain.tgt, plain.lines) == (["a b", "c"], ["x y", "z"], [1, 2])
    headed = tmp_path / "h.tsv"
    headed.write_text(
        "id\theavy\tlight\n1\tEVQ\tDIQ\r\n2\tQVQ\tEIV", encoding="utf-8"
    )  # CRLF, no final newline
    data = read_pairs(headed, "heavy,light")
    assert (data.src, data.tgt, data.lines) == (["EVQ", "QVQ"], ["DIQ", "EIV"], [2, 3])
    assert read_pairs(headed, "light,heavy").src == ["DIQ", "EIV"]  # the order named, not the file's
    assert data.are_residues() and not plain.are_residues()
    # a byte-order mark (Excel's "CSV UTF-8") is not the first source's first character
    (tmp_path / "bom.tsv").write_bytes(b"\xef\xbb\xbfa b\tx y\nc\tz\n")
    assert read_pairs(tmp_path / "bom.tsv").src == ["a b", "c"]
    (tmp_path / "bom_h.tsv").write_bytes("\ufeffheavy\tlight\nEVQ\tDIQ\n".encode())
    assert read_pairs(tmp_path / "bom_h.tsv", "heavy,light").src == ["EVQ"]


@pytest.mark.parametrize(
    ("content", "columns", "needles"),
    [
        (b"only one column\nstill one\n", None, ["line 1 has 1 tab-separated field", "source<TAB>target"]),
        (b"a\tb\nc\td\te\n", None, ["line 2 has 3 tab-separated field"]),
        (b"a\tb\n\nc\td\n", None, ["line 2 is empty"]),
        (b"a\tb\nc\t\n", None, ["line 2: the target is empty"]),
        (b"a\tb\n\xff\xfeoops\tx\n", None, ["line 2: not UTF-8", "0xff"]),
        (b"id\theavy\tlight\n1\tEVQ\n", "heavy,light", ["line 2 has 2 tab-separated field", "header's 3"]),
        (b"id\theavy\tlight\n1\tEVQ\tDIQ\n", "heavy,kappa", ["line 1: no column 'kappa'"]),
        (b"", None, ["holds no pairs"]),
    ],
    ids=[
        "one-column",
        "extra-field",
        "empty-line",
        "empty-target",
        "not-utf8",
        "short-row",
        "no-column",
        "empty",
    ],
)
def test_bad_files_are_refused_naming_the_line(tmp_path, content, columns, needles):
    path = tmp_path / "bad.tsv"
    path.write_bytes(content)
    with pytest.raises(QkvError) as err:
        read_pairs(path, columns)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for needle in needles:
        assert needle in message, message


def test_two_files_of_different_lengths_fail_at_the_first_unpaired_line(tmp_path):
    """Two aligned files (Moses' convention) join into one with paste; a shorter file leaves
    an empty field on the first line past its end, and that line is the one named."""
    (tmp_path / "train.de").write_text("ein Hund\neine Katze\nrot\n", encoding="utf-8")
    (tmp_path / "train.en").write_text("a dog\na cat\n", encoding="utf-8")
    joined = subprocess.run(
        ["paste", str(tmp_path / "train.de"), str(tmp_path / "train.en")], capture_output=True, check=True
    ).stdout
    (tmp_path / "pairs.tsv").write_bytes(joined)
    with pytest.raises(QkvError, match=r"line 3: the target is empty"):
        read_pairs(tmp_path / "pairs.tsv")


def test_split_is_drawn_by_seed_and_keeps_a_source_in_one_split(tmp_path):
    pairs = word_pairs(200)
    pairs += [(pairs[0][0], "another translation")] * 3  # one source, four targets
    data = read_pairs(write_tsv(tmp_path / "p.tsv", pairs))
    train, val, test = split_pairs(data, 0.1, 0.1, seed=3)
    assert len(train) + len(val) + len(test) == len(data)
    assert 20 <= len(val) <= 24 and 20 <= len(test) <= 24  # whole groups: a little over a tenth
    sources = [set(part.src) for part in (train, val, test)]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
    assert [p.lines for p in split_pairs(data, 0.1, 0.1, seed=3)] == [train.lines, val.lines, test.lines]
    assert split_pairs(data, 0.1, 0.1, seed=4)[1].lines != val.lines
    with pytest.raises(QkvError, match="leave none for training"):
        split_pairs(data.subset([0, 1]), 0.4, 0.4, seed=0)


@pytest.mark.parametrize(
    ("settings", "needles"),
    [
        (["columns=a,b"], ["go with data=PAIRS.tsv"]),
        (["tokenizer=amino-acid"], ["give them as data=PAIRS.tsv"]),
        (["data=PAIRS", "tokenizer=chars"], ["tokenizer='chars'"]),
        (["data=PAIRS", "val_fraction=0.6"], ["val_fraction (0.6)"]),
        (["data=PAIRS", "tokenizer=amino-acid"], ["pairs.tsv line 1: the source has", "tokenizer=bpe"]),
        (["data=BAD"], ["line 2 has 1 tab-separated field"]),
        (["data=PAIRS", "val_data=BAD"], ["bad.tsv line 2"]),
    ],
)
def test_train_refuses_bad_data_before_writing(tmp_path, capsys, settings, needles):
    pairs = write_tsv(tmp_path / "pairs.tsv", word_pairs(30))
    (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\n", encoding="utf-8")
    given = [s.replace("PAIRS", str(pairs)).replace("BAD", str(tmp_path / "bad.tsv")) for s in settings]
    out = tmp_path / "run"
    refused(run_main(capsys, "train", "translation", "--out", str(out), *given, *TINY), *needles)
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"one column\n", "line 1 has 1 tab-separated field"),
        (b"a\tb\n\nc\td\n", "line 2 is empty"),
        (b"a\tb\nc\td\te\n", "line 2 has 3 tab-separated field"),
        (b"a\tb\nc\xe9\td\n", "line 2: not UTF-8"),
        (b"a\tb\nc\t\n", "line 2: the target is empty"),  # what paste makes of a shorter second file
    ],
    ids=["one-column", "empty-line", "fields", "latin-1", "unpaired"],
)
def test_the_command_names_the_bad_line_and_writes_nothing(tmp_path, capsys, content, needle):
    bad = tmp_path / "pairs.tsv"
    bad.write_bytes(content)
    out = tmp_path / "run"
    refused(run_main(capsys, "train", "translation", "--out", str(out), f"data={bad}", *TINY), needle)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["pairs.tsv"]


# ---------------------------------------------------------------- runs


def test_a_run_on_own_text_pairs_learns_them_and_scores_its_held_out_pairs(tmp_path):
    pairs = write_tsv(tmp_path / "pairs.tsv", word_pairs(400))
    run = tmp_path / "run"
    done = qkv(
        "train", "translation", "--out", str(run), "--json", f"data={pairs}", *TINY, "train.max_steps=600",
        "max_tokens=256", "train.lr=3e-3", "model.n_encoder_layers=2", "model.n_decoder_layers=2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    record = json.loads((run / "pairs.json").read_text())
    assert record["tokenizer"] == "bpe" and record["train_pairs"] == 400 - 40
    assert len(record["val"]) == len(record["test"]) == 20
    test = summary["test"]
    assert test["split"] == "test" and test["n"] == 20 and "recovery" not in test
    # a word-for-word code of 12 words, learnt in 600 steps (seconds): held-out BLEU 72 here,
    # where an untrained model scores 0
    assert test["bleu"] > 50, test
    # evaluate reads the held-out pairs from the run, whatever happens to the file later
    pairs.unlink()
    again = qkv("evaluate", str(run), "--beam", "2")
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["bleu"] == pytest.approx(test["bleu"])
    refused(qkv("evaluate", str(run), "--split", "test2016"), "its splits are val and test")


def test_protein_pairs_read_one_residue_per_piece(tmp_path, capsys):
    rng = random.Random(0)
    residues = "ACDEFGHIKLMNPQRSTVWY"
    chains = ["".join(rng.choices(residues, k=rng.randint(8, 12))) for _ in range(60)]
    pairs = write_tsv(tmp_path / "pairs.tsv", [(c, c[::-1]) for c in chains], header="heavy\tlight")
    run = tmp_path / "run"
    code, out, err = run_main(
        capsys, "train", "translation", "--out", str(run), "--quiet", "--json", f"data={pairs}",
        "columns=heavy,light", "train.max_steps=3", *TINY,
    )  # fmt: skip
    assert code == 0, err
    test = json.loads(out)["test"]
    assert 0.0 <= test["recovery"] <= 1.0 and test["n"] == 3
    tok = json.loads((run / "tokenizer.json").read_text())
    assert len(tok["model"]["vocab"]) == 4 + 25 and tok["model"]["merges"] == []
    from qkv.inference.translator import load_run

    _, tokenizer = load_run(run)
    assert tokenizer.encode("ACW") == [4 + residues.index(c) for c in "ACW"]
    assert tokenizer.decode(tokenizer.encode("EVQLV")) == "EVQLV"
    from qkv.explain.explainers import TranslationExplainer

    explainer = TranslationExplainer(run)
    assert not explainer.subword, "residues are shown one by one, not merged into a 'word'"
    assert explainer.example in chains and "pairs.tsv" in explainer.input_label


def test_resume_needs_the_pairs_the_run_started_on(tmp_path, capsys):
    pairs = write_tsv(tmp_path / "pairs.tsv", word_pairs(60))
    run = tmp_path / "run"
    args = ["train", "translation", "--out", str(run), "--quiet", f"data={pairs}", *TINY]
    assert run_main(capsys, *args, "train.max_steps=2")[0] == 0
    moved = tmp_path / "moved.tsv"
    pairs.rename(moved)  # the same pairs elsewhere: resumed (paths are not compared)
    again = [a.replace(str(pairs), str(moved)) for a in args]
    assert run_main(capsys, *again, "train.max_steps=3", "--resume")[0] == 0
    # only the test pairs changed: the message names test_data, not the training file
    test = write_tsv(tmp_path / "test.tsv", word_pairs(10, seed=2))
    refused(run_main(capsys, *again, f"test_data={test}", "--resume"), f"test_data={test} is not the data")
    write_tsv(moved, word_pairs(60, seed=1))  # other pairs under the same name: refused
    refused(run_main(capsys, *again, "train.max_steps=4", "--resume"), f"data={moved} is not the data")


def number_words(n: int) -> str:
    """``n`` (0-999) in English words: 312 → "three hundred twelve"."""
    ones = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ]  # noqa: E501
    tens = ["_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
    words = [f"{ones[n // 100]} hundred"] if n >= 100 else []
    rest = n % 100
    if rest or not words:
        words.append(
            ones[rest] if rest < 20 else tens[rest // 10] + (f" {ones[rest % 10]}" if rest % 10 else "")
        )
    return " ".join(words)


def test_one_word_targets_select_weights_by_chrf_not_a_tie_of_bleu(tmp_path, capsys):
    """Number words → digits: every target is one word, so corpus BLEU finds no 2- to 4-grams
    and scores every candidate 0. The weights kept are the candidate with the best validation
    chrF (ties to the lower validation loss), recomputed here from each candidate's file; the
    summary prints exact match."""
    from qkv.recipes.translation import evaluate_run

    rng = random.Random(0)
    pairs = write_tsv(
        tmp_path / "numbers.tsv", [(number_words(n), str(n)) for n in rng.sample(range(1000), 600)]
    )
    run = tmp_path / "run"
    code, out, err = run_main(
        capsys, "train", "translation", "--out", str(run), f"data={pairs}", *TINY, "train.max_steps=240",
        "train.eval_every=80", "train.snapshot_minutes=0.002", "max_tokens=256", "train.lr=3e-3",
    )  # fmt: skip
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert "exact match" in err and "exact" in summary["test"] and "val_exact" in summary["validation"]
    candidates = {}
    for name in ("last", "best", "averaged"):
        if (run / f"{name}.safetensors").is_file():
            (run / "model.safetensors").write_bytes((run / f"{name}.safetensors").read_bytes())
            candidates[name] = evaluate_run(run, "val", beam_size=1)
    assert len(candidates) == 3, candidates.keys()
    assert all(c["bleu"] == 0.0 for c in candidates.values())  # the tie the old choice fell into
    best = min(candidates, key=lambda n: (-candidates[n]["chrf"], candidates[n]["loss"]))
    assert summary["selected_weights"] == best, {k: (v["chrf"], v["loss"]) for k, v in candidates.items()}
    assert summary["validation"]["val_chrf"] == pytest.approx(candidates[best]["chrf"])
