"""The settings tree: dotted and flat keys, typed values (every field kind), every problem at
once, nothing written on error, --print-config round trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import main
from qkv.errors import QkvError
from qkv.models.config import EncoderConfig, LMConfig, TransformerConfig
from qkv.recipes.lm import LMRecipe
from qkv.recipes.protein_tasks import ProteinTaskRecipe
from qkv.recipes.translation import TranslationRecipe
from qkv.settings import dotted_key, resolve, to_dict
from qkv.train.settings import TrainSettings


@pytest.mark.parametrize("override, key, expected", [
    ("model.n_layers=2.0", "model.n_layers", "int"),                  # int
    ("model.d_model=abc", "model.d_model", "int"),
    ("train.lr=fast", "train.lr", "float or null"),                   # optional float
    ("model.dropout=none", "model.dropout", "float"),                 # float: null refused
    ("model.bias=yes", "model.bias", "bool (true or false)"),         # bool
    ("model.norm_first=1", "model.norm_first", "bool (true or false)"),
    ("train.max_steps=1.5", "train.max_steps", "int or null"),        # optional int
    ("model.norm=batchnorm", "model.norm", "one of 'layernorm', 'rmsnorm', 'dyt'"),  # literal
    ("tokenizer=word", "tokenizer", "one of 'char', 'bpe'"),
])
def test_a_value_of_the_wrong_type_names_key_type_and_value(override, key, expected):
    with pytest.raises(QkvError) as info:
        resolve(LMRecipe, None, [override])
    msg = str(info.value)
    assert f"{key} must be {expected}, got {override.split('=', 1)[1]!r}" in msg, msg
    assert "\n" not in msg


def test_values_are_converted_to_the_field_types():
    s = resolve(LMRecipe, None, ["model.d_model=64", "train.lr=3e-4", "model.bias=true",
                                 "train.max_steps=null", "train.lr_decay_steps=50", "model.dropout=0",
                                 "top_k=null", "corpus=my.txt", "model.positional=rotary"])
    assert s.model.d_model == 64 and s.train.lr == 3e-4 and s.model.bias is True
    assert s.train.max_steps is None and s.train.lr_decay_steps == 50
    assert s.model.dropout == 0.0 and isinstance(s.model.dropout, float)
    assert s.top_k is None and s.corpus == "my.txt" and s.model.positional == "rotary"


def test_flat_keys_of_one_section_are_accepted_and_ambiguous_ones_refused():
    s = resolve(TranslationRecipe, None, ["d_model=64", "n_heads=2", "max_minutes=1.5", "seed=7",
                                          "src_lang=fr"])
    assert (s.model.d_model, s.model.n_heads, s.train.max_minutes, s.train.seed) == (64, 2, 1.5, 7)
    assert s.src_lang == "fr"
    # the LM has vocab_size at the top (the BPE size) and in model: the top-level field wins
    assert dotted_key(LMRecipe, "vocab_size") == "vocab_size"
    with pytest.raises(KeyError, match="unknown key d_modle .*did you mean.*d_model"):
        dotted_key(LMRecipe, "d_modle")
    with pytest.raises(KeyError, match="ambiguous: use model.dropout or train.dropout"):
        dotted_key(_TwoSections, "dropout")


from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class _TrainWithDropout:
    dropout: float = 0.0


@dataclass(frozen=True)
class _TwoSections:
    model: LMConfig = LMConfig()
    train: _TrainWithDropout = _TrainWithDropout()


def test_every_problem_is_listed_at_once():
    with pytest.raises(QkvError) as info:
        resolve(LMRecipe, None, ["n_layers=2.0", "d_model=abc", "bogus=1", "train.seed=x", "nokeyvalue"])
    msg = str(info.value)
    for part in ("model.n_layers must be int", "model.d_model must be int", "unknown key bogus",
                 "train.seed must be int", "'nokeyvalue' is not of the form key=value"):
        assert part in msg, msg


def test_range_errors_of_sections_and_recipes_are_reported():
    with pytest.raises(QkvError, match=r"max_steps \(-3\) must be >= 1"):
        resolve(LMRecipe, None, ["train.max_steps=-3"])
    with pytest.raises(QkvError, match="divisible by n_heads"):
        resolve(LMRecipe, None, ["model.d_model=10", "model.n_heads=4"])
    with pytest.raises(QkvError, match="needs init=RUN_DIR"):
        resolve(ProteinTaskRecipe, None, ["freeze=true"])
    with pytest.raises(QkvError, match="needs an end"):
        resolve(LMRecipe, None, ["train.max_steps=null"])


def test_config_file_nested_or_flat_then_overrides(tmp_path):
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"model": {"d_model": 96, "n_heads": 3}, "train": {"lr": 5e-4}}))
    s = resolve(LMRecipe, nested, ["train.lr=1e-4"])
    assert s.model.d_model == 96 and s.model.n_heads == 3 and s.train.lr == 1e-4
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"d_model": 96, "n_heads": 3, "max_steps": 7}))
    assert resolve(LMRecipe, flat).train.max_steps == 7
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"n_layers": 2.0}}))
    with pytest.raises(QkvError, match=r"model.n_layers must be int, got 2.0"):
        resolve(LMRecipe, bad)


@pytest.mark.parametrize("recipe", ["translation", "lm", "protein-mlm", "protein-cls", "protein-residue"])
def test_print_config_round_trips_through_config(recipe, tmp_path, capsys):
    assert main(["train", recipe, "--print-config", "model.d_model=64", "train.lr=0.002"]) == 0
    printed = capsys.readouterr().out
    tree = json.loads(printed)
    assert tree["model"]["d_model"] == 64 and tree["train"]["lr"] == 0.002
    path = tmp_path / "settings.json"
    path.write_text(printed)
    assert main(["train", recipe, "--print-config", "--config", str(path)]) == 0
    assert json.loads(capsys.readouterr().out) == tree


@pytest.mark.parametrize("override", ["n_layers=2.0", "d_model=abc", "train.max_steps=-3"])
def test_bad_settings_exit_2_with_one_line_and_no_run_directory(override, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "lm", "--out", str(out), override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: invalid settings:") and "\n" not in err, err
    assert not out.exists()


def test_every_model_option_is_settable_from_every_recipe_whose_model_has_it():
    """norm, activation, bias, attention_backend, norm_first reach each family's model section."""
    for recipe in (TranslationRecipe, LMRecipe, ProteinTaskRecipe):
        s = resolve(recipe, None, ["model.norm=dyt", "model.activation=gelu", "model.bias=false",
                                   "model.attention_backend=eager", "model.norm_first=true"])
        assert (s.model.norm, s.model.activation, s.model.bias, s.model.attention_backend,
                s.model.norm_first) == ("dyt", "gelu", False, "eager", True)
    assert resolve(TranslationRecipe, None, ["model.tie_output=false"]).model.tie_output is False


def test_configs_check_types_when_built_in_python_too():
    with pytest.raises(ValueError, match="n_layers must be int, got 2.0"):
        LMConfig(vocab_size=10, n_layers=2.0)
    with pytest.raises(ValueError, match="max_steps must be int or null"):
        TrainSettings(max_steps="5")
    assert LMConfig(vocab_size=10, dropout=0).dropout == 0  # an int is a fine float


def test_family_configs_add_only_their_own_fields():
    from dataclasses import fields

    from qkv.models.config import ModelConfig, StackConfig

    base = {f.name for f in fields(ModelConfig)}
    assert {f.name for f in fields(TransformerConfig)} - base == {
        "src_vocab_size", "tgt_vocab_size", "n_encoder_layers", "n_decoder_layers", "tie_output",
        "share_embeddings", "pad_id", "bos_id", "eos_id", "scale_embeddings", "output_bias"}
    stack = {f.name for f in fields(StackConfig)}
    assert {f.name for f in fields(LMConfig)} - stack == {"tie_embeddings", "bos_id", "eos_id"}
    assert {f.name for f in fields(EncoderConfig)} - stack == {"pad_id", "num_labels", "pooling", "pooler",
                                                               "token_dropout", "mask_id"}


def test_old_encoder_config_with_fields_it_never_used_still_loads():
    old = {**to_dict(EncoderConfig(vocab_size=30)), "tie_embeddings": True, "bos_id": None, "eos_id": None}
    assert EncoderConfig.from_dict(old) == EncoderConfig(vocab_size=30)
    with pytest.raises(ValueError, match="unknown EncoderConfig keys: tie_embeddings"):
        EncoderConfig.from_dict({**old, "tie_embeddings": False})  # a value the model cannot honour


def _documented_train_commands():
    """Every ``qkv train RECIPE ...`` line of the README, the docs and the benchmark scripts."""
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [root / "README.md", *root.glob("docs/*.md"), *root.glob("benchmarks/*.sh")]
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            match = re.search(r"(?:qkv|\$Q) train ([a-z-]+) (.*)", line)
            if match and match.group(1) != "RECIPE":
                text = match.group(2).split("#")[0].split(">")[0].split("`")[0].replace("\\", "")
                words = [w for w in shlex.split(text) if not w.startswith("[")]  # [optional] usage
                yield path.name, match.group(1), words


@pytest.mark.parametrize("where, recipe, words", list(_documented_train_commands()))
def test_documented_train_commands_resolve(where, recipe, words, capsys):
    """The settings of every documented command are accepted (keys exist, types fit)."""
    from pathlib import Path

    args, skip = [], False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word in ("--config", "--task", "--init", "--labels", "--max-minutes", "--max-steps"):
            value = words[i + 1]
            skip = True
            if "$" in value or value in ("FILE", "N", "M"):
                value = {"--config": None, "--max-minutes": "1", "--max-steps": "1"}.get(word, "x")
            elif word == "--config":
                value = str(Path(__file__).resolve().parent.parent / value)
            if value is not None:
                args += [word, value]
        elif word == "--freeze" or ("=" in word and "$" not in word):
            args.append(word)
    assert main(["train", recipe, "--print-config", *args]) == 0, (where, args, capsys.readouterr().err)


def test_full_translation_config_keeps_the_paper_recipe_while_the_defaults_are_the_demo():
    """The demo defaults changed (pre-LN, linear decay over the time budget); the full recipe
    file must still say post-LN + Eq. 3 itself, and never ask for bf16 outright."""
    full = resolve(TranslationRecipe, Path(__file__).resolve().parents[1] / "configs" / "multi30k_de_en.json", [])
    assert (full.model.norm_first, full.train.schedule, full.model.d_model, full.max_tokens) == (False, "noam", 384, 4096)
    assert full.train.lr_factor == 0.55 and full.train.warmup_steps == 800 and full.train.precision == "auto"
    demo = resolve(TranslationRecipe, None, [])
    assert (demo.model.norm_first, demo.train.schedule, demo.train.max_minutes, demo.train.max_steps) == (True, "linear", 10.0, None)
    demo.train.lr_schedule(demo.model.d_model)  # decays over the time budget: no step count needed
