"""The captioner (image → text): its masks, decoding, a tiny model that learns 16 scenes word
for word, a ViT's weights as its encoder, the scenes' words and boxes as the pointing game reads
them, and a trained run: reloaded, ``qkv caption`` (its refusals) and ``qkv evaluate``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cli_runs import DATA, huge_png_header, qkv

from qkv.cli import main
from qkv.data.batching import pad_sequences
from qkv.data.images import ImageSet, load_fashion_mnist, to_model_input
from qkv.data.scenes import NOUNS, boxes_for, garment_words, make_scenes, meaning_of, parse_caption
from qkv.data.tokenizers import SubwordTokenizer
from qkv.evaluate.captioning import pointing_hit
from qkv.inference.caption import Captioner, caption_words
from qkv.inference.search import beam_search, greedy_decode
from qkv.models.caption import CaptionModel, encoder_weights_from_vit
from qkv.models.config import CaptionConfig, ViTConfig
from qkv.models.vit import VisionTransformer

HAVE_FASHION = (DATA / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").is_file()
# 28 × 28 images in 7 × 7 patches: a 4 × 4 grid, 16 patches
TINY = dict(
    d_model=32,
    n_heads=2,
    d_ff=64,
    n_encoder_layers=1,
    n_decoder_layers=1,
    image_size=28,
    patch_size=7,
    max_len=12,
    vocab_size=24,
)


def _model(**overrides) -> CaptionModel:
    return CaptionModel(CaptionConfig(**{**TINY, **overrides})).eval()


def _images(n: int, size: int = 28, seed: int = 0) -> torch.Tensor:
    """``n`` random grey images in [-1, 1], as the model reads them."""
    return torch.rand(n, 1, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _tokens(n: int, length: int, seed: int = 0) -> torch.Tensor:
    """Decoder inputs: bos, then ids that are not special (3 ..)."""
    ids = torch.randint(3, TINY["vocab_size"], (n, length), generator=torch.Generator().manual_seed(seed))
    ids[:, 0] = 1
    return ids


@pytest.fixture
def data_dir(monkeypatch) -> Path:
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))
    return DATA


def _garment_images() -> ImageSet:
    """Fashion-MNIST's test images when the data is here, else 3 made-up images per class (a
    fixed random pattern each, with noise): scenes need 28 × 28 images labelled 0..9."""
    if HAVE_FASHION:
        return load_fashion_mnist("test")
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(len(NOUNS)), 3)
    patterns = rng.random((len(NOUNS), 28, 28, 1)) < 0.3
    noise = rng.random((len(labels), 28, 28, 1)) < 0.05
    images = ((patterns[labels] ^ noise) * 255).astype(np.uint8)
    return ImageSet(images, labels, NOUNS, [f"made-up/{i}" for i in range(len(labels))])


# --- masks: what each caption position and each patch can see -----------------------------


def test_a_caption_token_never_attends_to_later_tokens():
    model = _model()
    images, tgt = _images(3), _tokens(3, 10)
    out = model(images, tgt, need_weights=True)
    assert len(out.self_attentions) == 1
    for w in out.self_attentions:
        assert w.shape == (3, 2, 10, 10)
        assert torch.triu(w, diagonal=1).abs().max().item() == 0.0  # exactly: masked, not small
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 10))
    changed = tgt.clone()
    changed[:, 6] = torch.where(tgt[:, 6] == 3, 4, 3)  # another word at position 6
    before, after = out.logits, model(images, changed).logits
    assert (before[:, :6] - after[:, :6]).abs().max().item() < 1e-6
    assert (before[:, 6:] - after[:, 6:]).abs().max().item() > 1e-3  # it does see it from 6 on


def test_the_memory_is_every_patch_and_the_decoder_reads_each_one():
    model = _model()
    images, tgt = _images(2), _tokens(2, 5)
    memory, mask, _ = model.encode(images)
    assert memory.shape == (2, 16, 32) and mask is None  # no padding: every patch is real
    out = model(images, tgt, need_weights=True)
    for w in out.cross_attentions:
        assert w.shape == (2, 2, 5, 16)
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 5), atol=1e-6, rtol=0)
        assert w.min().item() > 0  # no patch is masked out
    for patch in range(16):  # the logits change with the pixels of any one patch
        r, c = divmod(patch, 4)
        changed = images.clone()
        changed[:, :, 7 * r : 7 * r + 7, 7 * c : 7 * c + 7] *= -1
        assert (model(changed, tgt).logits - out.logits).abs().max().item() > 1e-4, patch


def test_the_pooled_baseline_reads_one_vector_the_mean_of_the_patch_states():
    patches, pooled = _model(), _model(memory="pooled")
    pooled.load_state_dict(patches.state_dict())  # the same weights: only the memory differs
    images, tgt = _images(2), _tokens(2, 5)
    memory, mask, _ = pooled.encode(images)
    assert memory.shape == (2, 1, 32) and mask is None
    torch.testing.assert_close(memory, patches.encode(images)[0].mean(1, keepdim=True))
    out = pooled(images, tgt, need_weights=True)
    for w in out.cross_attentions:
        assert w.shape == (2, 2, 5, 1)
        torch.testing.assert_close(w, torch.ones_like(w), atol=1e-7, rtol=0)


# --- decoding -----------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_beam_of_one_is_greedy_decoding(alpha):
    model = _model()
    images = _images(8, seed=1)
    greedy = greedy_decode(model, images)
    assert len(greedy) == 8 and all(0 < len(ids) <= TINY["max_len"] - 1 for ids in greedy)
    assert beam_search(model, images, beam_size=1, alpha=alpha) == greedy


@pytest.mark.parametrize("memory", ["patches", "pooled"])
def test_cached_decoding_equals_the_full_forward_at_every_step(memory):
    model = _model(memory=memory)
    images, tgt = _images(3), _tokens(3, TINY["max_len"])
    full = model(images, tgt).logits
    mem, mask, _ = model.encode(images)
    caches = model.new_caches()
    steps = [
        model.decode(tgt[:, t : t + 1], mem, mask, caches=caches, start_pos=t)[0] for t in range(tgt.size(1))
    ]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=0)


def test_a_tiny_captioner_learns_sixteen_scenes_word_for_word(data_dir):
    torch.manual_seed(0)
    scenes = make_scenes(_garment_images(), 16, seed=3)
    tokenizer = SubwordTokenizer.train(scenes.captions, vocab_size=200, min_frequency=1)
    ids = tokenizer.encode_batch(scenes.captions)
    cfg = CaptionConfig(
        **{**TINY, "image_size": 56, "patch_size": 14, "max_len": 32, "vocab_size": tokenizer.vocab_size}
    )
    model = CaptionModel(cfg)
    captioner = Captioner(model, tokenizer)
    x = to_model_input(scenes.images)
    tgt_in = pad_sequences([[cfg.bos_id, *row] for row in ids], cfg.pad_id)
    tgt_out = pad_sequences([[*row, cfg.eos_id] for row in ids], cfg.pad_id)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    learned = False
    for step in range(1, 1001):
        model.train()
        logits = model(x, tgt_in).logits
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=cfg.pad_id)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            model.eval()
            if captioner.caption(scenes.images) == scenes.captions:
                learned = True
                break
    model.eval()
    assert learned, (step, loss.item(), captioner.caption(scenes.images))
    assert [parse_caption(c) for c in captioner.caption(scenes.images)] == scenes.meanings
    # beam search finds the same captions; greedy's ids, teacher-forced, are its own argmax
    assert Captioner(model, tokenizer, beam_size=3).caption(scenes.images) == scenes.captions
    greedy = captioner.caption_ids(scenes.images)
    assert greedy == ids
    with torch.no_grad():
        again = model(x, tgt_in).logits.argmax(-1)
    for row, expected in zip(again.tolist(), tgt_out.tolist(), strict=True):
        assert [t for t, e in zip(row, expected, strict=True) if e != cfg.pad_id] == [
            e for e in expected if e != cfg.pad_id
        ]
    # each word's attention map: one per layer and head over the 4 × 4 grid, summing to 1
    words, maps = captioner.word_maps(scenes.images[0], greedy[0])
    assert [w.text for w in words] == scenes.captions[0].split()
    assert maps.shape == (len(words), 1, 2, 4, 4)
    np.testing.assert_allclose(maps.sum((-1, -2)), 1.0, atol=1e-5)


# --- the scenes' words and boxes, as the pointing game reads them ---------------------------


def test_every_garment_word_of_every_phrasing_has_a_box_of_its_class_under_its_patches():
    scenes = make_scenes(_garment_images(), 100, seed=5)
    phrasings = [ref for refs in scenes.references for ref in refs]
    tokenizer = SubwordTokenizer.train(phrasings, vocab_size=200, min_frequency=1)
    nouns = garment_words()
    grid, size = 8, 56  # the recipe's captioner: 56 × 56 scenes in 7 × 7 patches
    for garments, refs, meaning in zip(scenes.garments, scenes.references, scenes.meanings, strict=True):
        assert meaning_of(garments) == meaning
        for ref in refs:
            assert parse_caption(ref) == meaning
            words = caption_words(tokenizer, tokenizer.encode(ref))  # t-shirt: several pieces, one word
            assert [w.text for w in words] == ref.split()
            named = {nouns[w.text] for w in words if w.text in nouns}
            assert named == {g.label for g in garments}
        for g in garments:  # a peak on a patch of the garment's cell hits; elsewhere only on its class
            boxes = boxes_for(garments, g.label)
            assert g.box in boxes
            for patch in range(grid * grid):
                peak = np.eye(grid * grid)[patch]
                cell = (patch // grid // 4, patch % grid // 4)
                same = any((h.row, h.col) == cell for h in garments if h.label == g.label)
                assert pointing_hit(peak, boxes, grid, size) == same


# --- a ViT's weights as the image encoder ---------------------------------------------------


def _vit(**overrides) -> VisionTransformer:
    cfg = dict(d_model=32, n_heads=2, d_ff=64, n_layers=1, image_size=28, patch_size=7, num_labels=10)
    vit = VisionTransformer(ViTConfig(**{**cfg, **overrides}))
    with torch.no_grad():
        vit.pos_embed.normal_()  # positions to recognise after tiling
    return vit


def test_a_vits_weights_load_into_the_captioner_with_positions_tiled():
    vit = _vit()
    cfg = CaptionConfig(**{**TINY, "image_size": 56})  # an 8 × 8 grid: the ViT's 4 × 4, twice
    model = CaptionModel(cfg)
    state = encoder_weights_from_vit(vit.state_dict(), cfg)
    assert not {k for k in state if k.startswith(("cls_token", "head."))}
    result = model.load_state_dict(state, strict=False)
    assert not result.unexpected_keys
    mine = model.state_dict()
    for name, value in vit.state_dict().items():
        if name.startswith(("layers.", "final_norm.")):
            assert torch.equal(mine["encoder." + name], value), name
        elif name.startswith("patch_embed."):
            assert torch.equal(mine[name], value), name
    assert sum(k.startswith("encoder.layers.") for k in state) == sum(
        k.startswith("layers.") for k in vit.state_dict()
    )
    grid = model.pos_embed[0].view(8, 8, 32)
    vit_grid = vit.pos_embed[0, 1:].view(4, 4, 32)  # the class token's position dropped
    for r in range(8):
        for c in range(8):
            assert torch.equal(grid[r, c], vit_grid[r % 4, c % 4])
    # a grid that is not a multiple keeps the captioner's own positions
    other = CaptionConfig(**{**TINY, "image_size": 42})  # 6 × 6
    assert "pos_embed" not in encoder_weights_from_vit(vit.state_dict(), other)


@pytest.mark.parametrize(
    "vit, caption, message",
    [
        ({"d_model": 16, "d_ff": 32}, {}, "patch embedding"),
        ({"patch_size": 4}, {}, "patch embedding"),
        ({"n_layers": 2}, {}, "encoder layers"),
    ],
)
def test_a_vit_of_other_widths_depth_or_patches_is_refused(vit, caption, message):
    cfg = CaptionConfig(**{**TINY, **caption})
    with pytest.raises(ValueError, match=message):
        encoder_weights_from_vit(_vit(**vit).state_dict(), cfg)


# --- a trained run: reloaded, `qkv caption`, `qkv evaluate` ---------------------------------

TINY_RUN = [
    "train_scenes=300",
    "eval_scenes=20",
    "model.d_model=32",
    "model.n_heads=2",
    "model.d_ff=64",
    "model.n_encoder_layers=1",
    "model.n_decoder_layers=1",
    "batch_size=32",
    "train.lr=3e-3",
    "train.warmup_steps=5",
    "train.eval_every=1000",
    "train.threads=1",
    "train.precision=fp32",
    "baseline=false",
]


@pytest.fixture(scope="module")
def caption_run(tmp_path_factory) -> Path:
    """A ``qkv train caption`` run on scenes: 150 steps of a 1 + 1 layer model (seconds)."""
    if not HAVE_FASHION and not os.environ.get("CI"):  # in CI missing data must fail, not skip
        pytest.skip(f"Fashion-MNIST not found under {DATA} (set QKV_DATA_DIR)")
    run = tmp_path_factory.mktemp("caption") / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKV_DATA_DIR", str(DATA))
        assert main(["train", "caption", "--out", str(run), "--quiet", "--max-steps", "150", *TINY_RUN]) == 0
    return run


@pytest.fixture(scope="module")
def scene_files(caption_run, tmp_path_factory) -> tuple[list[str], np.ndarray]:
    """Four test-image scenes as grey PNG files, and their pixels."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("scenes")
    scenes = make_scenes(load_fashion_mnist("test"), 4, seed=11)
    paths = []
    for i, image in enumerate(scenes.images):
        paths.append(str(folder / f"scene{i}.png"))
        Image.fromarray(image[:, :, 0]).save(paths[-1])
    return paths, scenes.images


def test_a_run_reloads_to_identical_captions_and_maps(caption_run, scene_files):
    paths, images = scene_files
    first, second = Captioner.from_run(caption_run), Captioner.from_run(caption_run)
    assert np.array_equal(first.read(paths), images)  # PNG keeps the scene's pixels
    ids = first.caption_ids(images)
    assert ids == second.caption_ids(images) and all(ids)
    assert first.caption(images) == second.caption(images)
    for image, row in zip(images, ids, strict=True):
        assert np.array_equal(first.cross_attention(image, row), second.cross_attention(image, row))
    saved = json.loads((caption_run / "train_config.json").read_text())
    assert first.beam_size == saved["beam_size"] == 1 and first.background == "black"


def test_caption_prints_one_tsv_line_per_image_in_order(caption_run, scene_files, capsys):
    paths, images = scene_files
    captions = Captioner.from_run(caption_run).caption(images)
    order = [3, 0, 2]
    assert main(["caption", str(caption_run), *(paths[i] for i in order)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{paths[i]}\t{captions[i]}" for i in order]
    assert err == ""
    done = qkv("caption", str(caption_run), paths[1], paths[0])  # as a user runs it
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{paths[1]}\t{captions[1]}\n{paths[0]}\t{captions[0]}\n"


def test_caption_notes_a_resized_image_and_composites_transparency(
    caption_run, scene_files, tmp_path, capsys
):
    from PIL import Image

    paths, images = scene_files
    big = tmp_path / "big.png"
    Image.fromarray(images[0, :, :, 0]).resize((100, 80)).save(big)
    # the scene as RGBA: its garments opaque, its black background transparent white
    pixels = images[1, :, :, 0]
    rgba = np.where((pixels > 0)[..., None], np.stack([pixels] * 3 + [np.full_like(pixels, 255)], -1), 255)
    rgba[..., 3] = np.where(pixels > 0, 255, 0)
    Image.fromarray(rgba.astype(np.uint8), "RGBA").save(tmp_path / "rgba.png")
    captioner = Captioner.from_run(caption_run)
    assert np.array_equal(captioner.read([str(tmp_path / "rgba.png")]), images[1:2])
    assert main(["caption", str(caption_run), str(big), str(tmp_path / "rgba.png")]) == 0
    out, err = capsys.readouterr()
    assert [row.split("\t")[0] for row in out.splitlines()] == [str(big), str(tmp_path / "rgba.png")]
    assert out.splitlines()[1] == f"{tmp_path / 'rgba.png'}\t{captioner.caption(images[1:2])[0]}"
    assert err.splitlines() == [f"warning: {big}: 100x80 pixels, resized to 56x56"]


@pytest.mark.parametrize(
    "case", ["not an image", "bomb", "one pixel", "beam 0", "vit run", "translation run"]
)
def test_caption_refuses_bad_input_in_one_line_before_writing_anything(
    case, caption_run, scene_files, tiny_vit_run, tiny_runs, tmp_path, capsys
):
    from PIL import Image

    paths, _ = scene_files
    bad = tmp_path / "bad.png"
    run, options = str(caption_run), []
    if case == "not an image":
        bad.write_text("not an image")
        needle = f"{bad}: not an image file"
    elif case == "bomb":
        huge_png_header(bad, 5000, 4000)  # under Pillow's own guard, over qkv's
        needle = f"{bad}: 5000 x 4000 pixels is more than the 16,000,000 accepted"
    elif case == "one pixel":
        Image.new("L", (1, 1), 200).save(bad)
        needle = f"{bad}: 1x1 pixels is too small (at least 4x4)"  # the 4 x 4 patch grid
    else:
        Image.new("L", (56, 56), 0).save(bad)
        if case == "beam 0":
            options, needle = ["--beam", "0"], "beam size must be between 1 (greedy) and the vocabulary size"
        elif case == "vit run":
            run, needle = str(tiny_vit_run), "is a 'vit' run; this needs a caption run"
        else:
            run, needle = str(tiny_runs["translation"]), "is a 'translation' run; this needs a caption run"
    big = tmp_path / "big.png"  # a good file first, one that would be noted as resized
    Image.new("L", (100, 80), 0).save(big)
    assert main(["caption", run, paths[0], str(big), str(bad), *options]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert needle in err, err


@pytest.mark.parametrize(
    "split, options", [("test", []), ("test_novel", ["--beam", "2"]), ("val", []), ("val_novel", [])]
)
def test_evaluate_scores_each_split_of_a_caption_run(caption_run, split, options, data_dir, capsys):
    assert main(["evaluate", str(caption_run), "--split", split, "--device", "cpu", *options]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["task"] == "scenes" and result["split"] == split and result["n"] == 20
    for key in ("exact_match", "bleu", "garment_accuracy", "count_accuracy", "relation_accuracy", "parsed"):
        assert 0 <= result[key] <= (100 if key == "bleu" else 1), key
    if not options:  # greedy, the run's own setting: what its summary scored, with the same weights
        summary = json.loads((caption_run / "summary.json").read_text())
        assert {k: v for k, v in result.items() if k not in ("task", "split")} == summary[split]


def test_evaluate_refuses_a_beam_of_zero(caption_run, data_dir, capsys):
    assert main(["evaluate", str(caption_run), "--split", "val", "--beam", "0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "beam size must be between 1 (greedy)" in err


# --- exact resume, torchrun -------------------------------------------------------------------


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]


def test_a_stopped_run_resumes_to_the_same_weights(tmp_path, data_dir):
    """20 steps straight, and 10 steps then --resume to 20: the same weights, bit for bit."""
    from safetensors.torch import load_file

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # the schedule's length fixed (not max_steps), so both runs step along one learning-rate curve
    common = ["--quiet", *TINY_RUN, "train.eval_every=10", "train.lr_decay_steps=20"]
    assert main(["train", "caption", "--out", str(straight), "--max-steps", "20", *common]) == 0
    assert main(["train", "caption", "--out", str(resumed), "--max-steps", "10", *common]) == 0
    assert main(["train", "caption", "--out", str(resumed), "--max-steps", "20", "--resume", *common]) == 0
    a, b = load_file(straight / "last.safetensors"), load_file(resumed / "last.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_processes_train_as_one(tmp_path, data_dir):
    """torchrun with 2 processes (each half of every batch's rows) follows the losses of one."""
    import subprocess
    import sys

    runs = {n: tmp_path / f"p{n}" for n in (1, 2)}
    env = {**os.environ, "QKV_DATA_DIR": str(DATA), "OMP_NUM_THREADS": "1"}
    for n, run in runs.items():
        launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"] if n > 1 else []
        args = [
            "train",
            "caption",
            "--out",
            str(run),
            "--quiet",
            "--max-steps",
            "40",
            *TINY_RUN,
        ]  # rows every 20 steps
        done = subprocess.run(
            [sys.executable, *launcher, "-m", "qkv", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    one, two = _losses(runs[1]), _losses(runs[2])
    assert [s for s, _ in one] == [s for s, _ in two] and one
    for (_, x), (_, y) in zip(one, two, strict=True):
        assert abs(x - y) < 1e-4 * abs(x), (x, y)
