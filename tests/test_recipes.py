"""The recipe interface: every registered recipe carries what the rest of the program asks of
it, in the shapes the CLI, ``runs`` and the explainer loader call."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from qkv.cli import build_parser, main
from qkv.models.model_types import MODEL_TYPES
from qkv.recipes.registry import RECIPES, get, kind_of, trainable
from qkv.runs import model_type_of
from qkv.train.run import TrainingRun

TRAINED = [r for r in RECIPES.values() if r.train is not None]


def test_the_registry_is_keyed_by_each_recipes_own_name():
    assert all(name == recipe.name for name, recipe in RECIPES.items())
    assert trainable() == [r.name for r in TRAINED]
    assert {r.model_type for r in RECIPES.values()} <= set(MODEL_TYPES.values())


@pytest.mark.parametrize("recipe", TRAINED, ids=lambda r: r.name)
def test_a_trained_recipe_has_settings_train_evaluate_and_a_summary(recipe):
    settings = recipe.settings()  # its defaults build
    assert dataclasses.is_dataclass(settings) and recipe.settings.__dataclass_params__.frozen
    if hasattr(settings, "model"):  # text-cls takes its architecture from the pretrained encoder
        assert isinstance(settings.model, recipe.model_type.config), "its runs hold the model it names"
    # every recipe's run is the one skeleton's flow, with its own parts
    assert issubclass(recipe.train.__self__, TrainingRun) and recipe.train.__name__ == "train"
    assert list(inspect.signature(recipe.train).parameters) == [
        "settings",
        "run_dir",
        "resume",
        "progress",
        "cpu",
    ]
    # one name and signature: evaluate_run(run_dir, split, device, *, options)
    assert recipe.evaluate.__name__ == "evaluate_run"
    params = inspect.signature(recipe.evaluate).parameters
    assert list(params)[:3] == ["run_dir", "split", "device"]
    options = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert options == list(recipe.evaluate_options) == list(params)[3:]
    assert recipe.splits and recipe.summary is not None and callable(recipe.explainer)


def test_the_cli_trains_exactly_the_registered_recipes():
    help_text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    assert all(name in help_text for name in trainable())
    assert "encoder" not in trainable()  # converted, not trained


def test_an_unknown_recipe_is_refused_naming_the_known_ones(capsys):
    assert main(["train", "transformer", "--out", "x"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown recipe 'transformer'") and "translation" in err


def test_kind_of_and_model_type_of_read_the_run_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.json").write_text(json.dumps({"recipe": "protein-cls", "model_type": "encoder"}))
    assert kind_of(run) is get("protein-cls")
    assert model_type_of(run) is MODEL_TYPES["encoder"]
    (run / "train_config.json").write_text(json.dumps({"recipe": "vit"}))  # before model_type was recorded
    assert model_type_of(run) is MODEL_TYPES["vit"]
    (run / "train_config.json").write_text(json.dumps({"recipe": "nope"}))
    with pytest.raises(Exception, match="does not know"):
        kind_of(run)


def test_evaluate_refuses_options_and_splits_a_recipe_does_not_take(tiny_vit_run, capsys):
    assert main(["evaluate", str(tiny_vit_run), "--beam", "2"]) == 2
    assert "--beam: not an option of a vit run's evaluation" in capsys.readouterr().err
    assert main(["evaluate", str(tiny_vit_run), "--split", "test2016"]) == 2
    assert "a vit run has the splits test, val, train" in capsys.readouterr().err
