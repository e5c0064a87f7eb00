"""What a resume must keep: each recipe's ``FIXED_ON_RESUME`` (the settings that define its data,
its vocabulary and which weights train), checked before anything is written.

Every recipe's list is walked at the function level (:func:`qkv.runs.record.refuse_changed_settings`
against a ``train_config.json`` written here); one tiny language model is trained and resumed as a
user would (``python -m qkv``) to show the refusal leaves the run byte-identical and the budget
still changes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_runs import DATA, TINY_LM, digest, qkv, refused

from qkv.errors import QkvError
from qkv.recipes.lm import changed_text, corpus_record
from qkv.recipes.registry import RECIPES
from qkv.runs.record import refuse_changed_settings
from qkv.settings import to_dict

TRAINED = {name: r.settings for name, r in RECIPES.items() if r.settings is not None}


def _saved_run(run: Path, recipe: str, tree: dict) -> Path:
    """A run directory holding only ``train_config.json``: ``tree`` as a run of ``recipe`` saved it."""
    run.mkdir()
    (run / "train_config.json").write_text(json.dumps({"recipe": recipe, **tree}))
    return run


def _set(tree: dict, key: str, value: Any) -> dict:
    """A copy of ``tree`` with dotted ``key`` set to ``value``."""
    head, _, rest = key.partition(".")
    return {**tree, head: _set(tree[head], rest, value) if rest else value}


def _get(tree: dict, key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def _other(value: Any) -> Any:
    """A value of the same kind as ``value`` that differs from it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2 if value else 0.5
    return f"{value}-other" if isinstance(value, str) else "other"


@pytest.mark.parametrize("recipe", sorted(TRAINED))
def test_every_key_of_a_recipe_s_list_is_a_field_of_its_settings(recipe):
    cls = TRAINED[recipe]
    keys, by_content = cls.FIXED_ON_RESUME, getattr(cls, "BY_CONTENT", ())
    assert keys and len(set(keys)) == len(keys)
    assert set(by_content) <= set(keys)  # compared elsewhere, but still the run's own
    for key in keys:
        section: Any = cls()
        for part in key.split("."):
            assert part in {f.name for f in dataclasses.fields(section)}, f"{recipe}: {key} is not a setting"
            section = getattr(section, part)
    assert not {"train.max_steps", "train.lr", "train.max_minutes", "train.eval_every"} & set(keys)


@pytest.mark.parametrize("recipe", sorted(TRAINED))
def test_each_listed_setting_changed_on_resume_is_refused_with_the_run_unchanged(recipe, tmp_path):
    """The run saved its defaults but for one listed key: resuming with the defaults is refused,
    the key named with its saved and its given value; the same settings resume."""
    cls = TRAINED[recipe]
    now = cls()
    tree = to_dict(now)
    refuse_changed_settings(_saved_run(tmp_path / "same", recipe, tree), now)  # its own settings: resumed
    by_content = getattr(cls, "BY_CONTENT", ())
    for key in cls.FIXED_ON_RESUME:
        run = _saved_run(tmp_path / key, recipe, _set(tree, key, _other(_get(tree, key))))
        before = digest(run)
        if key in by_content:  # the data record compares it by content (moved data resumes)
            refuse_changed_settings(run, now)
            continue
        with pytest.raises(QkvError) as refusal:
            refuse_changed_settings(run, now)
        line = str(refusal.value)
        saved, given = _other(_get(tree, key)), _get(tree, key)
        assert "\n" not in line and line.startswith(f"cannot resume {run}")
        assert f"{key}: {saved!r} saved, {given!r} now" in line
        assert digest(run) == before


def test_every_changed_key_is_named_in_one_line(tmp_path):
    now = TRAINED["lm"]()
    tree = _set(_set(to_dict(now), "tokenizer", "bpe"), "vocab_size", 100)
    with pytest.raises(QkvError) as refusal:
        refuse_changed_settings(_saved_run(tmp_path / "run", "lm", tree), now)
    assert "tokenizer: 'bpe' saved, 'char' now, vocab_size: 100 saved, 8000 now" in str(refusal.value)


def test_a_key_an_older_run_did_not_save_counts_as_the_default(tmp_path):
    cls = TRAINED["text-cls"]
    tree = to_dict(cls())
    del tree["scratch"], tree["train"]["lora_modules"]
    run = _saved_run(tmp_path / "old", "text-cls", tree)
    refuse_changed_settings(run, cls())
    with pytest.raises(QkvError, match="scratch: False saved, True now"):
        refuse_changed_settings(run, cls(scratch=True))


def test_an_input_path_is_compared_where_it_points(tmp_path, monkeypatch):
    """A relative path given from the run's folder is the absolute one the run saved."""
    (tmp_path / "images").mkdir()
    cls = TRAINED["vit"]
    run = _saved_run(tmp_path / "run", "vit", to_dict(cls(task=str(tmp_path / "images"))))
    monkeypatch.chdir(tmp_path)
    refuse_changed_settings(run, cls(task="images"))
    with pytest.raises(QkvError, match="task: .* saved, 'fashion-mnist' now"):
        refuse_changed_settings(run, cls())


@pytest.mark.parametrize(
    ("saved", "now", "named"),
    [
        (("a" * 100, None, 0.1), ("b" * 100, None, 0.1), ["corpus"]),
        (("a" * 100, None, 0.1), ("a" * 100, None, 0.2), ["val_fraction"]),
        (("a" * 100, None, 0.1), ("a" * 100, "v", 0.1), ["val_corpus"]),
        (("a" * 100, "v", 0.1), ("a" * 100, None, 0.1), ["val_corpus"]),
        (("a" * 100, "v", 0.1), ("a" * 100, "w", 0.1), ["val_corpus"]),
        (("a" * 100, "v", 0.1), ("b" * 100, "v", 0.1), ["corpus"]),
    ],
)
def test_a_resume_on_other_text_names_the_setting_it_is_due_to(saved, now, named):
    """The review's finding: a resume refused for ``val_corpus=`` named ``val_fraction=``."""

    def record(text: str, val: str | None, fraction: float) -> dict:
        settings = TRAINED["lm"](val_corpus=val, val_fraction=fraction)
        cut = int(len(text) * (1 - fraction))
        train, held = (text, val) if val else (text[:cut], text[cut:])
        return {k: v for k, v in corpus_record(train, held, settings).items() if k != "path"}

    assert changed_text(record(*saved), record(*now)) == named


# --------------------------------------------------------------------------- as a user resumes

needs_shakespeare = pytest.mark.skipif(
    not (DATA / "tinyshakespeare" / "input.txt").is_file() and not os.environ.get("CI"),
    reason=f"tiny-shakespeare not found under {DATA} (set QKV_DATA_DIR)",
)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory) -> Path:
    """A finished 6-step character LM run."""
    run = tmp_path_factory.mktemp("resume_settings") / "lm"
    done = qkv("train", "lm", "--out", str(run), "--quiet", "train.max_steps=6", *TINY_LM)
    assert done.returncode == 0, done.stderr[-2000:]
    return run


@needs_shakespeare
def test_a_resume_that_would_make_the_record_lie_is_refused_and_changes_nothing(lm_run, tmp_path):
    """The review's case: ``--resume tokenizer=bpe`` on a character-level run was accepted and
    rewrote train_config.json to say bpe and 8000 while tokenizer.json held the characters."""
    run = tmp_path / "lm"
    shutil.copytree(lm_run, run)
    (tmp_path / "val.txt").write_text("To be, or not to be, that is the question:\n" * 20)
    before = digest(run)
    resume = ("train", "lm", "--out", str(run), "--resume", "--quiet", "train.max_steps=8")
    for change, named in (
        ("tokenizer=bpe", "tokenizer: 'char' saved, 'bpe' now"),
        ("vocab_size=100", "vocab_size: 8000 saved, 100 now"),
        (f"val_corpus={tmp_path / 'val.txt'}", f"val_corpus={tmp_path / 'val.txt'} is not the data"),
    ):
        refused(qkv(*resume, change), "cannot resume", named)
        assert digest(run) == before, change
    done = qkv(*resume)  # the budget may change
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((run / "train_config.json").read_text())
    assert (saved["tokenizer"], saved["vocab_size"], saved["train"]["max_steps"]) == ("char", 8000, 8)
    assert json.loads((run / "summary.json").read_text())["steps"] == 8
