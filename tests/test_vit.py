"""Vision Transformer: patches, positions, the model, image data, the recipe and the CLI."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import huge_png_header
from conftest import train_digits_vit

from qkv.cli import main
from qkv.data.images import (
    augment,
    load_digits,
    load_image_folder,
    read_image,
    stratified_split,
    to_model_input,
)
from qkv.errors import QkvError
from qkv.evaluate.baselines import pixel_baseline_metrics
from qkv.models.config import ViTConfig
from qkv.models.vit import VisionTransformer
from qkv.nn.patches import PatchEmbedding, patchify, sinusoidal_2d_positions, unpatchify
from qkv.nn.positional import sinusoidal_positional_encoding

TINY = dict(d_model=32, n_heads=2, d_ff=64, n_layers=2, image_size=8, patch_size=2)


def test_patches_reassemble_the_image_and_follow_reading_order():
    images = torch.randn(2, 3, 12, 8)
    patches = patchify(images, 4)  # (2, 6, 48): 3 rows x 2 columns of patches
    assert patches.shape == (2, 6, 3 * 4 * 4)
    assert torch.equal(unpatchify(patches, 4, 3, 12, 8), images)
    # patch 3 is row 1, column 1; its first value is channel 0, pixel (4, 4)
    assert patches[1, 3, 0] == images[1, 0, 4, 4]
    assert torch.equal(patches[0, 3].view(3, 4, 4), images[0, :, 4:8, 4:8])


def test_linear_and_strided_convolution_paths_are_equal():
    embed = PatchEmbedding(patch_size=4, channels=3, d_model=16)
    images = torch.randn(5, 3, 16, 16)
    torch.testing.assert_close(embed(images, fast=True), embed(images, fast=False), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="channels"):
        embed(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match="multiple of the patch size"):
        embed(torch.randn(1, 3, 15, 16))


def test_2d_positions_encode_row_then_column():
    pos = sinusoidal_2d_positions(3, 5, 16)
    one_d = sinusoidal_positional_encoding(5, 8)
    assert pos.shape == (15, 16)
    row, col = divmod(7, 5)  # patch 7 in reading order
    torch.testing.assert_close(pos[7, :8], one_d[row])
    torch.testing.assert_close(pos[7, 8:], one_d[col])
    with pytest.raises(ValueError, match="divisible by 4"):
        sinusoidal_2d_positions(2, 2, 18)


@pytest.mark.parametrize("positional,pooling", [("learned", "cls"), ("sinusoidal", "mean")])
def test_token_count_is_patches_plus_class_token(positional, pooling):
    cfg = ViTConfig(**TINY, positional=positional, pooling=pooling, num_labels=3)
    model = VisionTransformer(cfg).eval()
    out = model(torch.randn(4, 1, 8, 8), need_weights=True)
    assert cfg.n_patches == 16
    assert out.hidden.shape == (4, 17, 32)
    assert out.logits.shape == (4, 3)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (4, 2, 17, 17)
    torch.testing.assert_close(out.attentions[1].sum(-1), torch.ones(4, 2, 17))


def test_wrong_images_and_configs_are_refused():
    model = VisionTransformer(ViTConfig(**TINY))
    with pytest.raises(ValueError, match="expects 8x8"):
        model(torch.randn(1, 1, 16, 16))
    with pytest.raises(ValueError, match="shape"):
        model(torch.randn(1, 8, 8))
    with pytest.raises(ValueError, match="image_size .28. must be a multiple of patch_size .5."):
        ViTConfig(patch_size=5)
    with pytest.raises(ValueError, match="divisible by 4"):
        ViTConfig(d_model=130, n_heads=2, positional="sinusoidal")
    with pytest.raises(ValueError, match="exceed max_len"):
        ViTConfig(patch_size=1, max_len=100)


def test_a_tiny_vit_overfits_a_handful_of_digits():
    digits = load_digits()
    x, y = to_model_input(digits.images[:32]), torch.from_numpy(digits.labels[:32])
    model = VisionTransformer(ViTConfig(**TINY))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(400):
        loss = torch.nn.functional.cross_entropy(model(x).logits, y)
        if loss.item() < 0.02:
            break
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert loss.item() < 0.02
    assert (model(x).logits.argmax(-1) == y).all()


def test_augment_crops_and_flips_without_changing_shape():
    images = torch.arange(2 * 16, dtype=torch.float32).view(2, 1, 4, 4)
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(augment(images, 0, False, gen), images)
    flipped = augment(images, 0, True, torch.Generator().manual_seed(1))
    for a, b in zip(flipped, images, strict=True):
        assert torch.equal(a, b) or torch.equal(a, b.flip(-1))
    cropped = augment(images, 1, False, gen)
    assert cropped.shape == images.shape
    # every crop is a shifted window: its pixels are the image's or the padding (-1)
    assert set(cropped.unique().tolist()) <= set(images.unique().tolist()) | {-1.0}


def test_stratified_split_keeps_class_balance():
    labels = np.repeat(np.arange(3), [50, 30, 20])
    rest, held = stratified_split(labels, 0.1, seed=0)
    assert np.bincount(labels[held]).tolist() == [5, 3, 2]
    assert len(np.intersect1d(rest, held)) == 0 and len(rest) + len(held) == 100


# --- reading images safely ---------------------------------------------------------------


def _png(path, size=(10, 6), mode="RGB", color=(200, 100, 50)):
    from PIL import Image

    Image.new(mode, size, color).save(path)
    return path


def _noise_png(path):
    from PIL import Image

    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)).save(path)
    return path


def test_read_image_converts_channels_and_size(tmp_path):
    grey = read_image(_png(tmp_path / "a.png"), 8, 1)
    assert grey.shape == (8, 8, 1) and grey.dtype == np.uint8
    assert abs(int(grey[0, 0, 0]) - round(0.299 * 200 + 0.587 * 100 + 0.114 * 50)) <= 1
    rgb = read_image(_png(tmp_path / "b.png", mode="L", color=77), 4, 3)
    assert rgb.shape == (4, 4, 3) and (rgb == 77).all()
    transparent = read_image(_png(tmp_path / "c.png", mode="RGBA", color=(255, 255, 255, 0)), 4, 1)
    assert (transparent == 0).all()  # transparency over black, the Fashion-MNIST background


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p.write_text("not an image"), "not an image file"),
        (lambda p: p.write_bytes(_noise_png(p).read_bytes()[:2000]), "truncated or corrupt"),
        (lambda p: huge_png_header(p), "decompression-bomb guard"),
    ],
)
def test_bad_image_files_get_one_line_errors(tmp_path, make, message):
    path = tmp_path / "x.png"
    make(path)
    with pytest.raises(QkvError, match=message) as info:
        read_image(path, 28, 1)
    assert "\n" not in str(info.value)


def test_image_folder_layout_and_its_errors(tmp_path):
    with pytest.raises(QkvError, match="does not exist"):
        load_image_folder(tmp_path / "nope", 8, 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(QkvError, match="no class sub-folders"):
        load_image_folder(tmp_path / "empty", 8, 1)
    one = tmp_path / "one" / "cats"
    one.mkdir(parents=True)
    _png(one / "a.png")
    with pytest.raises(QkvError, match="one class"):
        load_image_folder(tmp_path / "one", 8, 1)
    (tmp_path / "one" / "dogs").mkdir()
    with pytest.raises(QkvError, match="holds no images"):
        load_image_folder(tmp_path / "one", 8, 1)
    _png(tmp_path / "one" / "dogs" / "b.jpg", color=(0, 0, 0))
    data = load_image_folder(tmp_path / "one", 8, 1)
    assert data.classes == ("cats", "dogs") and data.labels.tolist() == [0, 1]
    assert data.images.shape == (2, 8, 8, 1)


# --- the recipe and the CLI --------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    return train_digits_vit(
        tmp_path_factory.mktemp("vit") / "run",
        "model.d_model=32",
        "model.d_ff=64",
        "train.max_steps=300",
        "train.eval_every=100",
        "train.warmup_steps=10",
        "crop_padding=0",
        "hflip=false",
        "batch_size=64",
    )


def test_recipe_trains_reports_and_beats_chance(digits_run, capsys):
    summary = json.loads((digits_run / "summary.json").read_text())
    assert summary["test"]["accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert summary["baseline_test"]["accuracy"] > 0.9  # logistic regression on 8x8 digits
    assert set(summary["test"]) >= {"accuracy", "macro_f1", "per_class_accuracy", "confusion"}
    assert (digits_run / "confusion.png").stat().st_size > 1000
    cfg = json.loads((digits_run / "config.json").read_text())
    assert (cfg["image_size"], cfg["channels"], cfg["num_labels"]) == (8, 1, 10)


def test_saved_run_reloads_to_identical_outputs_and_evaluates(digits_run, capsys):
    from qkv.inference.vision import ImageClassifier

    digits = load_digits()
    reloaded = ImageClassifier.from_run(digits_run)
    again = ImageClassifier.from_run(digits_run)
    np.testing.assert_array_equal(reloaded.predict(digits.images[:20]), again.predict(digits.images[:20]))
    assert main(["evaluate", str(digits_run), "--device", "cpu"]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = json.loads((digits_run / "summary.json").read_text())
    assert result["split"] == "test" and result["accuracy"] == summary["test"]["accuracy"]
    assert (digits_run / "confusion_test.png").is_file()


def test_hflip_tta_averages_each_image_with_its_mirror(digits_run):
    from qkv.inference.vision import ImageClassifier

    one = ImageClassifier.from_run(digits_run)
    assert not one.hflip_tta  # the fixture trained with hflip=false: no mirror averaging
    both = ImageClassifier(one.model, one.classes, hflip_tta=True)
    images = load_digits().images[:16]
    mirrored = np.ascontiguousarray(images[:, :, ::-1])
    expected = (one.predict(images) + one.predict(mirrored)) / 2
    np.testing.assert_allclose(both.predict(images), expected, atol=1e-6)
    assert np.abs(both.predict(images) - one.predict(images)).max() > 1e-3  # digits are not symmetric
    np.testing.assert_allclose(both.predict(mirrored), both.predict(images), atol=1e-6)


def test_classify_writes_a_tsv_and_refuses_a_bad_file_before_writing(digits_run, tmp_path, capsys):
    from PIL import Image

    digits = load_digits()
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"d{i}.png"))
        Image.fromarray(digits.images[i, :, :, 0]).resize((32, 32)).save(paths[-1])
    assert main(["classify", str(digits_run), *paths]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split("\t")[:3] == ["id", "label", "p_0"]
    assert [r.split("\t")[0] for r in rows[1:]] == paths
    assert all(abs(sum(map(float, r.split("\t")[2:])) - 1) < 1e-3 for r in rows[1:])
    (tmp_path / "bad.png").write_text("no")
    assert main(["classify", str(digits_run), paths[0], str(tmp_path / "bad.png")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "bad.png: not an image file" in captured.err


def test_train_refuses_bad_folders_with_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "vit", "--task", str(tmp_path / "empty"), "--out", str(tmp_path / "r")]) == 2
    assert "no class sub-folders" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


# --- a short smoke run on the real Fashion-MNIST -----------------------------------------

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.mark.skipif(
    not (DATA / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").is_file()
    and not os.environ.get("CI"),  # in CI missing data must fail, not skip
    reason=f"Fashion-MNIST not found under {DATA} (set QKV_DATA_DIR)",
)
def test_fashion_mnist_smoke_run_learns(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", os.environ.get("QKV_DATA_DIR", str(DATA)))
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "vit",
                "--out",
                str(run),
                "--quiet",
                "train.max_steps=150",
                "train.warmup_steps=20",
                "train.eval_every=80",
                "baseline=false",
                "train.threads=1",
            ]
        )
        == 0
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["test"]["n"] == 10_000 and summary["validation"]["n"] == 6_000
    assert summary["tta"] and 0.1 < summary["test_single_view"]["accuracy"] < 1  # the default: flip averaging
    from qkv.inference.vision import ImageClassifier

    assert ImageClassifier.from_run(run).hflip_tta  # qkv classify and evaluate average too
    assert summary["test"]["accuracy"] > 0.55  # 10 balanced classes: chance is 0.1


def test_pixel_baseline_reports_non_convergence_in_one_log_line_not_a_warning(qkv_logs):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (60, 8, 8, 1), dtype=np.uint8), np.arange(60) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sklearn's ConvergenceWarning would raise here
        metrics = pixel_baseline_metrics(images, labels, images, labels, ["a", "b", "c"], max_iter=2)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert "L-BFGS stopped at max_iter=2 before converging" in qkv_logs.text
