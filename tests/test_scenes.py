"""Captioned scenes of garments (qkv.data.scenes): grammar round trips, pixels against boxes,
determinism, held-out compositions, split sources and the scores."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from qkv.data.images import ImageSet, load_fashion_mnist, stratified_split
from qkv.data.scenes import (
    CANVAS,
    CELL,
    HELD_OUT,
    NOUNS,
    SCENE_CITATION,
    SCENE_SPLITS,
    Garment,
    boxes_for,
    compositions,
    describe,
    garment_words,
    load_scene_task,
    make_scenes,
    meaning_of,
    parse_caption,
    scene_scores,
)
from qkv.errors import QkvError


def synthetic_source(per_class: int = 3, seed: int = 0) -> ImageSet:
    """10 classes × ``per_class`` images of random non-zero pixels (so a missing or misplaced
    pixel shows), uint8 (N, 28, 28, 1)."""
    rng = np.random.default_rng(seed)
    n = 10 * per_class
    images = rng.integers(1, 256, (n, 28, 28, 1), dtype=np.uint8)
    labels = np.repeat(np.arange(10), per_class)
    return ImageSet(images, labels, NOUNS, [f"syn/{i}" for i in range(n)])


def garments_for(meaning, lone_cols=(0, 0), single_row=0) -> tuple[Garment, ...]:
    """Garments laid out as ``meaning`` says: a one-row meaning in row ``single_row``, the lone
    garment of row i in column ``lone_cols[i]``."""
    rows = range(2) if len(meaning) == 2 else [single_row]
    out = []
    for r, row, lone in zip(rows, meaning, lone_cols, strict=False):
        for c, label in enumerate(row) if len(row) == 2 else [(lone, row[0])]:
            out.append(Garment(label, r, c, (r * CELL, c * CELL, (r + 1) * CELL, (c + 1) * CELL), 0))
    return tuple(out)


ROWS = [(a,) for a in range(10)] + [(a, b) for a in range(10) for b in range(10)]
MEANINGS = [(row,) for row in ROWS] + [(top, bottom) for top in ROWS for bottom in ROWS]


def test_every_phrasing_of_every_meaning_parses_back_and_phrasings_never_collide():
    owner: dict[str, tuple] = {}
    rng = np.random.default_rng(0)
    for meaning in MEANINGS:
        garments = garments_for(meaning, rng.integers(0, 2, 2).tolist(), single_row=int(rng.integers(0, 2)))
        assert meaning_of(garments) == meaning
        phrasings = describe(garments)
        per_row = [1 if len(row) == 1 or row[0] == row[1] else 2 for row in meaning]
        expected = per_row[0] if len(meaning) == 1 else 2 * per_row[0] * per_row[1]
        assert len(phrasings) == expected and phrasings == sorted(set(phrasings))
        for text in phrasings:
            assert parse_caption(text) == meaning, text
            assert owner.setdefault(text, meaning) == meaning  # one caption, one meaning
    assert len(owner) == sum(len(describe(garments_for(m))) for m in MEANINGS)


def test_describe_examples_and_the_lone_garment_column_is_not_said():
    corners = [garments_for(((3,),), (col, 0), single_row=row) for row in (0, 1) for col in (0, 1)]
    assert [describe(g) for g in corners] == [["a dress"]] * 4
    scene = garments_for(((4, 8), (3, 3)))
    assert describe(scene) == [
        "a bag to the right of a coat above two dresses",
        "a coat to the left of a bag above two dresses",
        "two dresses below a bag to the right of a coat",
        "two dresses below a coat to the left of a bag",
    ]
    assert parse_caption("  Two   DRESSES below\ta coat TO the left of a bag ") == ((4, 8), (3, 3))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a",
        "a coat.",
        "a coats",
        "two coat",
        "three coats",
        "an coat",
        "a hat",
        "a dresss",
        "a coat and a bag",
        "a coat to the left a bag",
        "a coat to the top of a bag",
        "a coat above",
        "above a coat",
        "a coat above a bag above a dress",
        "a coat above a bag below a dress",
        "a coat above a bag to the left of",
    ],
)
def test_parse_rejects_text_outside_the_grammar(text):
    assert parse_caption(text) is None


def test_two_of_a_class_side_by_side_parse_as_two_of_them():
    """The grammar writes "two dresses"; a model's "a dress to the left of a dress" says the same
    scene and parses to the same meaning (scored right on meaning, not on BLEU)."""
    dress, boot = NOUNS.index("dress"), NOUNS.index("boot")
    said = parse_caption("a dress to the left of a dress above a boot")
    assert said == parse_caption("two dresses above a boot") == ((dress, dress), (boot,))


def test_meaning_of_refuses_empty_and_shared_cells():
    with pytest.raises(QkvError):
        meaning_of(())
    g = Garment(0, 0, 0, (0, 0, 28, 28), 0)
    with pytest.raises(QkvError):
        meaning_of((g, Garment(1, 0, 0, (0, 0, 28, 28), 1)))


def test_pixels_match_boxes_and_scenes_are_consistent():
    source = synthetic_source()
    scenes = make_scenes(source, 300, seed=1)
    assert scenes.images.shape == (300, CANVAS, CANVAS, 1) and scenes.images.dtype == np.uint8
    assert scenes.ids[17] == "scenes/17" and len(scenes) == 300
    sizes = set()
    for image, garments, caption, refs, meaning in zip(
        scenes.images[..., 0],
        scenes.garments,
        scenes.captions,
        scenes.references,
        scenes.meanings,
        strict=True,
    ):
        covered = np.zeros((CANVAS, CANVAS), dtype=bool)
        for g in garments:
            top, left, bottom, right = g.box
            assert (top, left, bottom, right) == (g.row * 28, g.col * 28, g.row * 28 + 28, g.col * 28 + 28)
            np.testing.assert_array_equal(image[top:bottom, left:right], source.images[g.source, :, :, 0])
            assert g.label == source.labels[g.source]
            covered[top:bottom, left:right] = True
        assert not image[~covered].any()
        assert len({(g.row, g.col) for g in garments}) == len(garments)
        assert meaning == meaning_of(garments) and refs == describe(garments) and caption in refs
        sizes.add(len(garments))
    assert sizes == {1, 2, 3, 4}
    assert boxes_for(scenes.garments[0], scenes.garments[0][0].label)[0] == scenes.garments[0][0].box


def test_same_seed_same_scenes_other_seed_other_scenes_and_subset():
    source = synthetic_source()
    a, b, c = (make_scenes(source, 200, seed=s) for s in (5, 5, 6))
    np.testing.assert_array_equal(a.images, b.images)
    assert a.captions == b.captions and a.garments == b.garments
    assert not np.array_equal(a.images, c.images) and a.captions != c.captions
    part = a.subset(np.array([3, 1]))
    assert part.captions == [a.captions[3], a.captions[1]] and part.ids == ["scenes/3", "scenes/1"]
    np.testing.assert_array_equal(part.images[1], a.images[1])


def test_rows_repeat_a_class_often_enough_to_teach_counts():
    scenes = make_scenes(synthetic_source(), 20_000, seed=2)
    pairs = [row for meaning in scenes.meanings for row in meaning if len(row) == 2]
    same = np.mean([row[0] == row[1] for row in pairs])
    assert (
        0.3 < same < 0.45
    )  # 0.3 repeats + 0.7 × 1/10 by chance ≈ 0.37 (rejection of held-out pairs shifts it a little)
    assert any("two " in caption for caption in scenes.captions)


def test_a_repeated_class_uses_another_image_of_it_when_there_is_one():
    def identical_share(per_class: int) -> float:
        scenes = make_scenes(synthetic_source(per_class), 5_000, seed=4)
        same = [
            (g[0].source, g[1].source)
            for garments in scenes.garments
            for g in [[x for x in garments if x.row == r] for r in (0, 1)]
            if len(g) == 2 and g[0].label == g[1].label
        ]
        return float(np.mean([a == b for a, b in same]))

    # Two images per class: only chance draws (≈ 0.07 × 1/2 of ≈ 0.4) repeat the very image.
    assert identical_share(2) < 0.2
    assert identical_share(1) == 1.0  # a class of one image can only repeat it


def test_held_out_rule_and_novel_scenes():
    assert len(HELD_OUT) == 20
    for relation in ("left", "above"):
        firsts = sorted(a for a, rel, _ in HELD_OUT if rel == relation)
        assert firsts == list(range(10))
    partner = {(a, rel): b for a, rel, b in HELD_OUT}
    assert all(partner[a, "left"] != partner[a, "above"] != a != partner[a, "left"] for a in range(10))
    source = synthetic_source()
    plain = make_scenes(source, 2_000, seed=3)
    assert all(not compositions(g) & HELD_OUT for g in plain.garments)
    novel = make_scenes(source, 2_000, seed=3, novel=True)
    assert all(compositions(g) & HELD_OUT and len(g) >= 2 for g in novel.garments)


def test_compositions_of_a_hand_scene():
    scene = garments_for(((4, 8), (3,)), lone_cols=(0, 1))
    assert compositions(scene) == {(4, "left", 8), (4, "above", 3), (8, "above", 3)}


def test_make_scenes_refuses_bad_input():
    source = synthetic_source()
    with pytest.raises(QkvError):
        make_scenes(source, 0, seed=0)
    with pytest.raises(QkvError):
        make_scenes(ImageSet(source.images[:, :8, :8], source.labels, NOUNS, source.ids), 5, seed=0)
    with pytest.raises(QkvError):
        make_scenes(ImageSet(source.images, source.labels + 5, NOUNS, source.ids), 5, seed=0)
    only_coats = source.subset(np.flatnonzero(source.labels == 4))  # no held-out pair can form
    with pytest.raises(QkvError, match="novel"):
        make_scenes(only_coats, 5, seed=0, novel=True)
    for bad in ({"n_train": 0}, {"n_eval": -1}, {"val_fraction": 1.0}):
        with pytest.raises(QkvError):
            load_scene_task(**bad)


def test_garment_words_name_every_noun_in_every_caption():
    words = garment_words()
    assert len(words) == 20 and words["dresses"] == words["dress"] == 3 and words["t-shirts"] == 0
    function_words = {"a", "two", "to", "the", "left", "right", "of", "above", "below"}
    for meaning in MEANINGS[:110]:  # the one-row meanings hold every noun form
        labels = {label for row in meaning for label in row}
        for text in describe(garments_for(meaning)):
            named = {words[w] for w in text.split() if w not in function_words}
            assert named == labels, text


def test_scene_scores_on_a_hand_example():
    meanings = [((3,),), ((4, 8), (1,)), ((0, 0),), ((4, 8), (1,)), ((9,),)]
    predicted = [
        "a dress",  # exact
        "a coat to the left of a sandal above a trouser",  # one wrong class
        "a t-shirt",  # wrong count (one of two t-shirts)
        "a coat above two trousers",  # right count, wrong row structure
        "a hat",  # not in the grammar
    ]
    scores = scene_scores(predicted, meanings)
    assert scores == pytest.approx(
        {
            "exact_match": 1 / 5,
            "parsed": 4 / 5,
            "garment_accuracy": (1 + 2 + 1 + 2 + 0) / (1 + 3 + 2 + 3 + 1),
            "count_accuracy": 3 / 5,
            "relation_accuracy": 2 / 5,
            "n": 5,
        }
    )
    with pytest.raises(QkvError):
        scene_scores(predicted[:2], meanings)


DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.mark.skipif(
    not (DATA / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").is_file() and not os.environ.get("CI"),
    reason=f"Fashion-MNIST not found under {DATA} (set QKV_DATA_DIR)",
)
def test_scene_task_splits_draw_from_the_right_fashion_mnist_images(monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", os.environ.get("QKV_DATA_DIR", str(DATA)))
    task = load_scene_task(n_train=300, n_eval=200, seed=0)
    assert tuple(task) == SCENE_SPLITS and "Mansimov" in SCENE_CITATION and "Xiao" in SCENE_CITATION
    assert [len(s) for s in task.values()] == [300, 200, 200, 200, 200]
    assert task["test_novel"].ids[17] == "scenes/test_novel/17"
    train, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    rest, held = stratified_split(train.labels, 0.1, 0)
    allowed = {"train": set(rest.tolist()), "val": set(held.tolist()), "val_novel": set(held.tolist())}
    for split, scenes in task.items():
        origin = test if split.startswith("test") else train
        for image, garments in zip(scenes.images, scenes.garments, strict=True):
            for g in garments:
                top, left, bottom, right = g.box
                np.testing.assert_array_equal(image[top:bottom, left:right], origin.images[g.source])
                assert g.label == origin.labels[g.source]
                assert split.startswith("test") or g.source in allowed[split]
        novel = [bool(compositions(g) & HELD_OUT) for g in scenes.garments]
        assert all(novel) if split.endswith("novel") else not any(novel)
    assert task["val"].captions != task["test"].captions  # each split its own seed


def test_a_shift_moves_each_garment_inside_its_own_cell():
    """A bright square in each cell moves by the drawn offset, 1 to 3 pixels each way; nothing
    crosses into another cell; a garment at the cell's edge loses the pixels pushed past it."""
    from qkv.data.scenes import shift_garments

    images = np.zeros((5, CANVAS, CANVAS, 1), dtype=np.uint8)
    for cell in range(4):
        top, left = (cell // 2) * CELL, (cell % 2) * CELL
        images[:, top + 10 : top + 18, left + 10 : left + 18] = 200 + cell
    moved = shift_garments(images, np.random.default_rng(0), 1, 3)
    for i in range(5):
        for cell in range(4):
            top, left = (cell // 2) * CELL, (cell % 2) * CELL
            block = moved[i, top : top + CELL, left : left + CELL, 0]
            ys, xs = np.nonzero(block)
            assert set(block[ys, xs]) == {200 + cell} and len(ys) == 64  # whole, and only its own
            dy, dx = ys.min() - 10, xs.min() - 10
            assert 1 <= abs(dy) <= 3 and 1 <= abs(dx) <= 3
    edge = np.zeros((1, CANVAS, CANVAS, 1), dtype=np.uint8)
    edge[0, :CELL, :CELL] = 255  # fills its cell: a shift loses a border, the other cells stay black
    out = shift_garments(edge, np.random.default_rng(1), 2, 2)
    assert out[0, :CELL, :CELL].sum() == 255 * 26 * 26 and out[0, CELL:].sum() == out[0, :, CELL:].sum() == 0
    with pytest.raises(QkvError, match="0 <= low <= high"):
        shift_garments(images, np.random.default_rng(0), 3, 1)


@pytest.mark.skipif(
    not (DATA / "fashion-mnist" / "t10k-images-idx3-ubyte.gz").is_file() and not os.environ.get("CI"),
    reason=f"Fashion-MNIST not found under {DATA} (set QKV_DATA_DIR)",
)
def test_the_shifted_splits_are_the_same_scenes_with_their_garments_moved(monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", os.environ.get("QKV_DATA_DIR", str(DATA)))
    task = load_scene_task(200, 50, only=("test", "test_shifted"))
    test, shifted = task["test"], task["test_shifted"]
    assert shifted.meanings == test.meanings and shifted.references == test.references
    assert shifted.ids[0] == "scenes/test_shifted/0" and not np.array_equal(shifted.images, test.images)
    again = load_scene_task(200, 50, only=("test_shifted",))["test_shifted"]
    assert np.array_equal(again.images, shifted.images)  # drawn from the task's seed alone
