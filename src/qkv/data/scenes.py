"""Captioned scenes of garments: a deterministic image → caption task built from Fashion-MNIST.

Inspiration: the captioned MNIST of Mansimov, Parisotto, Ba & Salakhutdinov, "Generating Images
from Captions with Attention" (ICLR 2016, arXiv:1511.02793): MNIST digits on a 60 × 60 canvas,
captioned with what they are and where they are relative to each other ("the digit 3 is at the
top of the digit 5"). This module differs in that the task runs the other way (image → caption,
for a captioning Transformer); the objects are Fashion-MNIST garments (Xiao et al. 2017); they
sit in the cells of a fixed 2 × 2 grid of 28 × 28 cells on a 56 × 56 canvas (no overlap, so each
garment has an exact box and the pixels are exactly its source image); a scene holds 1 to 4
garments and captions say counts ("two coats"); each scene keeps all its phrasings as
references; and a fixed set of compositions (:data:`HELD_OUT`) never appears in training, so the
``*_novel`` splits measure generalisation to unseen combinations of known words.

Grammar (a caption describes the rows; the column of a lone garment in a row is not said):

- row: ``a X`` (one garment), ``two Xs`` (two of one class), ``a X to the left of a Y`` or
  ``a Y to the right of a X`` (left X, right Y, X ≠ Y);
- scene: the row's description if one row holds garments, else ``T above B`` or ``B below T``.

A caption's meaning (:data:`Meaning`) is the non-empty rows top to bottom, each a tuple of
Fashion-MNIST labels left to right; every phrasing of a scene parses back to it.
"""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..errors import QkvError
from .images import FASHION_MNIST_CITATION, ImageSet, load_fashion_mnist, stratified_split

logger = logging.getLogger(__name__)

CELL = 28  # a Fashion-MNIST image fills one cell
GRID = 2  # cells per side; the "above"/"below" grammar assumes two rows
CANVAS = GRID * CELL
NOUNS = ("t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot")
SCENE_SPLITS = ("train", "val", "val_novel", "test", "test_novel")
SHIFTED_SPLITS = ("val_shifted", "test_shifted")  # val's and test's scenes, garments moved 1-3 px
REPEAT_PROBABILITY = 0.3  # a row's second garment copies the first's class: captions need counts
SCENE_CITATION = (
    f"Scenes of garments from {FASHION_MNIST_CITATION}, after the captioned MNIST of Mansimov, "
    "Parisotto, Ba & Salakhutdinov 2016, Generating Images from Captions with Attention (ICLR, "
    "arXiv:1511.02793)"
)

Meaning = tuple[tuple[int, ...], ...]
Box = tuple[int, int, int, int]


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith("s") else "s")


_SINGULAR = {noun: label for label, noun in enumerate(NOUNS)}
_PLURAL = {_plural(noun): label for label, noun in enumerate(NOUNS)}


def _held_out() -> frozenset[tuple[int, str, int]]:
    # A fixed rule, so the split never depends on the run's seed: for each class a, one partner
    # "left" and a different one "above", never a itself (counts, "two Xs", stay trainable).
    rng = np.random.default_rng(2016)
    triples = set()
    for a in range(len(NOUNS)):
        left, above = rng.choice([b for b in range(len(NOUNS)) if b != a], size=2, replace=False)
        triples |= {(a, "left", int(left)), (a, "above", int(above))}
    return frozenset(triples)


HELD_OUT: frozenset[tuple[int, str, int]] = _held_out()
_HELD = np.zeros((2, len(NOUNS), len(NOUNS)), dtype=bool)  # [0 left / 1 above, a, b]: vectorised check
for _a, _rel, _b in HELD_OUT:
    _HELD[int(_rel == "above"), _a, _b] = True


@dataclass(frozen=True)
class Garment:
    """One garment of a scene: Fashion-MNIST ``label`` (index into :data:`NOUNS`), its cell
    (``row``, ``col`` in 0..GRID-1), ``box`` = (top, left, bottom, right) pixels of that cell
    (bottom/right exclusive), and ``source``, the index of its image in the Fashion-MNIST split
    used (for :func:`make_scenes`: the index into the ``source`` image set)."""

    label: int
    row: int
    col: int
    box: Box
    source: int


def _box(row: int, col: int) -> Box:
    return (row * CELL, col * CELL, (row + 1) * CELL, (col + 1) * CELL)


@dataclass
class SceneSet:
    """Scenes with captions: ``images`` uint8 ``(N, 56, 56, 1)`` (light garments on black);
    ``garments`` per scene in cell order (row-major); ``captions`` one phrasing per scene (drawn
    by the seed; what training uses); ``references`` all phrasings (sorted); ``meanings``;
    ``ids`` ``"<name>/<i>"``."""

    images: np.ndarray
    garments: list[tuple[Garment, ...]]
    captions: list[str]
    references: list[list[str]]
    meanings: list[Meaning]
    ids: list[str]

    def __len__(self) -> int:
        return len(self.captions)

    def subset(self, index: np.ndarray | Sequence[int]) -> SceneSet:
        """The scenes at ``index`` (integer indices or a boolean mask), in that order."""
        rows = np.arange(len(self))[np.asarray(index)]
        pick = rows.tolist()
        return SceneSet(
            self.images[rows],
            [self.garments[i] for i in pick],
            [self.captions[i] for i in pick],
            [self.references[i] for i in pick],
            [self.meanings[i] for i in pick],
            [self.ids[i] for i in pick],
        )


def meaning_of(garments: Sequence[Garment]) -> Meaning:
    """The non-empty rows top to bottom, each a tuple of labels left to right.

    Raises:
        QkvError: no garments, or two garments in one cell.
    """
    cells = sorted((g.row, g.col, g.label) for g in garments)
    if (
        not cells
        or len({cell[:2] for cell in cells}) != len(cells)
        or not all(0 <= r < GRID and 0 <= c < GRID for r, c, _ in cells)
    ):
        raise QkvError(f"a scene needs 1 to {GRID * GRID} garments in distinct grid cells (got {cells})")
    rows: dict[int, list[int]] = {}
    for r, _, label in cells:
        rows.setdefault(r, []).append(label)
    return tuple(tuple(row) for row in rows.values())


def _row_phrasings(row: tuple[int, ...]) -> list[str]:
    x = NOUNS[row[0]]
    if len(row) == 1:
        return [f"a {x}"]
    if row[0] == row[1]:
        return [f"two {_plural(x)}"]
    y = NOUNS[row[1]]
    return [f"a {x} to the left of a {y}", f"a {y} to the right of a {x}"]


@functools.cache  # at most 110 + 110² meanings; generation asks once per scene
def _phrasings(meaning: Meaning) -> tuple[str, ...]:
    rows = [_row_phrasings(row) for row in meaning]
    if len(rows) == 1:
        return tuple(sorted(set(rows[0])))
    top, bottom = rows
    both = [f"{t} above {b}" for t in top for b in bottom] + [f"{b} below {t}" for t in top for b in bottom]
    return tuple(sorted(set(both)))


def describe(garments: Sequence[Garment]) -> list[str]:
    """Every phrasing of the scene in the grammar (1 to 8), sorted and unique.

    Raises:
        QkvError: as :func:`meaning_of`.
    """
    return list(_phrasings(meaning_of(garments)))


def _parse_row(words: list[str]) -> tuple[int, ...] | None:
    match words:
        case ["a", x] if x in _SINGULAR:
            return (_SINGULAR[x],)
        case ["two", xs] if xs in _PLURAL:
            return (_PLURAL[xs],) * 2
        case ["a", x, "to", "the", ("left" | "right") as side, "of", "a", y]:
            # The grammar says "two Xs" for two of one class, but "a X to the left of a X" says
            # the same scene truly (a model writes it): it parses, and BLEU alone marks it down.
            if x not in _SINGULAR or y not in _SINGULAR:
                return None
            pair = (_SINGULAR[x], _SINGULAR[y])
            return pair if side == "left" else pair[::-1]
    return None


def parse_caption(text: str) -> Meaning | None:
    """The meaning of a caption, or None when it is not in the grammar. Case and runs of
    whitespace are ignored; "above"/"below" (at most one) splits the caption into two rows
    first. One tolerance: "a X to the left of a X" means the row "two Xs" says. No other: "a
    coat." or "two coat" are not in the grammar."""
    words = text.lower().split()
    splits = [i for i, w in enumerate(words) if w in ("above", "below")]
    if not splits:
        row = _parse_row(words)
        return None if row is None else (row,)
    if len(splits) > 1:
        return None
    i = splits[0]
    first, second = _parse_row(words[:i]), _parse_row(words[i + 1 :])
    if first is None or second is None:
        return None
    return (first, second) if words[i] == "above" else (second, first)


def compositions(garments: Sequence[Garment]) -> set[tuple[int, str, int]]:
    """The scene's ``(label_a, relation, label_b)`` triples: ``"left"`` for a and b in one row,
    a in the left cell; ``"above"`` for a in the top row and b in the bottom row (any columns)."""
    out = set()
    for a in garments:
        for b in garments:
            if a.row == b.row and a.col < b.col:
                out.add((a.label, "left", b.label))
            elif a.row < b.row:
                out.add((a.label, "above", b.label))
    return out


def garment_words() -> dict[str, int]:
    """Every noun form, singular and plural (``"dress"``, ``"dresses"``, ...), → its label."""
    return {**_SINGULAR, **_PLURAL}


def boxes_for(garments: Sequence[Garment], label: int) -> list[Box]:
    """The (top, left, bottom, right) boxes of the garments of class ``label``, in cell order."""
    return [g.box for g in garments if g.label == label]


def _has_held_out(occupied: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """bool ``(M,)``: which layouts (``(M, 4)`` cells, row-major) contain a :data:`HELD_OUT`
    triple; the vectorised twin of :func:`compositions`."""
    lab = np.where(occupied, labels, 0)
    hit = np.zeros(len(lab), dtype=bool)
    for left in (0, 2):  # the two rows' left cells
        hit |= occupied[:, left] & occupied[:, left + 1] & _HELD[0, lab[:, left], lab[:, left + 1]]
    for top in (0, 1):
        for bottom in (2, 3):
            hit |= occupied[:, top] & occupied[:, bottom] & _HELD[1, lab[:, top], lab[:, bottom]]
    return hit


def make_scenes(source: ImageSet, n: int, seed: int, novel: bool = False, name: str = "scenes") -> SceneSet:
    """``n`` scenes drawn from ``source`` (28 × 28 × 1 images labelled 0..9, e.g. Fashion-MNIST),
    a function of ``seed`` alone (``numpy.random.default_rng(seed)``).

    Per scene: 1 to 4 garments (uniform), in a random subset of the cells; each garment a source
    image drawn uniformly, except that with probability 0.3 a row's right garment repeats the
    class of its left one (another image of that class, if it has one). ``novel=False`` redraws a
    scene until it holds no :data:`HELD_OUT` composition; ``novel=True`` until it holds at least
    one (so novel scenes have 2 to 4 garments). The training caption is drawn uniformly among
    :func:`describe`'s phrasings. ``Garment.source`` indexes ``source``.

    Raises:
        QkvError: ``n`` < 1, a negative seed, images not ``(N, 28, 28, 1)``, labels outside 0..9,
            or a source that cannot make the scenes asked for (e.g. novel scenes from too few
            classes).
    """
    return _make_scenes(source, n, seed, novel, name, np.arange(len(source.labels)))


def _make_scenes(
    source: ImageSet, n: int, seed: int, novel: bool, name: str, source_index: np.ndarray
) -> SceneSet:
    labels = np.asarray(source.labels, dtype=np.int64)
    _check_scene_source(source, labels, n, seed)
    rng = np.random.default_rng(seed)
    occupied, src, drawn = _draw_layouts(rng, labels, n, novel)
    images = _paint(source, occupied, src)
    scenes = _scene_set(
        images, occupied, labels[src].tolist(), source_index[src].tolist(), rng.random(n), name
    )
    kind = "novel" if novel else "non-novel"
    logger.info("%d %s scenes (%s) from %d images, seed %d", n, kind, name, len(labels), seed)
    logger.debug("%s: %d layouts drawn for %d kept", name, drawn, n)
    return scenes


def _check_scene_source(source: ImageSet, labels: np.ndarray, n: int, seed: int) -> None:
    """Raise :class:`QkvError` unless ``n >= 1``, ``seed >= 0`` and ``source`` holds
    Fashion-MNIST-sized images with labels ``0..9``."""
    if n < 1 or seed < 0:
        raise QkvError(f"make_scenes needs n >= 1 and seed >= 0 (got n={n}, seed={seed})")
    if source.images.shape[1:] != (CELL, CELL, 1) or not len(labels):
        raise QkvError(f"scenes need (N, {CELL}, {CELL}, 1) source images (got {source.images.shape})")
    if labels.min() < 0 or labels.max() >= len(NOUNS):
        raise QkvError(f"scene source labels must be 0..{len(NOUNS) - 1} (Fashion-MNIST classes)")


def _draw_layouts(
    rng: np.random.Generator, labels: np.ndarray, n: int, novel: bool
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(occupied (n, 4) bool, src (n, 4) source image per cell, layouts drawn)``: ``n``
    layouts whose compositions are (``novel``) or are not held out, drawn from ``rng``."""
    # Per-class index arrays, flat: class c's images are order[starts[c] : starts[c] + counts[c]].
    order = np.argsort(labels, kind="stable")
    counts = np.bincount(labels, minlength=len(NOUNS))
    starts = np.cumsum(counts) - counts
    rank = np.empty_like(order)  # an image's position within its class
    rank[order] = np.arange(len(order)) - starts[labels[order]]

    kept_occupied, kept_sources, need, drawn = [], [], n, 0
    while need:  # rejection in vectorised batches: a held-out triple is in roughly 1 scene in 5
        m = max(4096, need * (8 if novel else 2))
        k = rng.integers(1, GRID * GRID + 1, m)
        occupied = rng.random((m, GRID * GRID)).argsort(axis=1).argsort(axis=1) < k[:, None]
        src = rng.integers(0, len(labels), (m, GRID * GRID))
        left = src[:, 0::2]  # cells 0, 2: each row's left cell; 1, 3: its right cell
        repeat = occupied[:, 0::2] & occupied[:, 1::2] & (rng.random((m, GRID)) < REPEAT_PROBABILITY)
        c = labels[left]
        j = (rng.random((m, GRID)) * np.maximum(counts[c] - 1, 1)).astype(np.int64)
        j = np.minimum(j + (j >= rank[left]), counts[c] - 1)  # skip the left image unless it is alone
        src[:, 1::2] = np.where(repeat, order[starts[c] + j], src[:, 1::2])
        keep = _has_held_out(occupied, labels[src]) == novel
        if not keep.any():
            raise QkvError(f"cannot draw {'novel' if novel else 'non-novel'} scenes from these images")
        kept_occupied.append(occupied[keep][:need])
        kept_sources.append(src[keep][:need])
        need -= len(kept_sources[-1])
        drawn += m
    return np.concatenate(kept_occupied), np.concatenate(kept_sources), drawn


def _paint(source: ImageSet, occupied: np.ndarray, src: np.ndarray) -> np.ndarray:
    """The scenes' pixels: uint8 ``(n, 56, 56, 1)``, each occupied cell its source image."""
    n = len(occupied)
    # Cells never overlap, so copying each image into its cell equals np.maximum onto black.
    canvas = np.zeros((n, GRID, CELL, GRID, CELL), dtype=np.uint8)  # (scene, row, y, col, x)
    for cell in range(GRID * GRID):
        rows = np.flatnonzero(occupied[:, cell])
        canvas[rows, cell // GRID, :, cell % GRID, :] = source.images[src[rows, cell], :, :, 0]
    return canvas.reshape(n, CANVAS, CANVAS, 1)


def _scene_set(
    images: np.ndarray,
    occupied: np.ndarray,
    cell_labels: list[list[int]],
    cell_sources: list[list[int]],
    pick: np.ndarray,
    name: str,
) -> SceneSet:
    """The :class:`SceneSet` of ``images``: each scene's garments, meaning, reference phrasings
    and caption (the phrasing ``pick`` (n,) uniform in [0, 1) selects)."""
    n = len(images)
    boxes = [_box(*divmod(cell, GRID)) for cell in range(GRID * GRID)]
    scenes = SceneSet(images, [], [], [], [], [f"{name}/{i}" for i in range(n)])
    # ~10 small acyclic objects per scene: the cyclic collector would rescan them all, again and
    # again, and triple the time of this loop; it is paused for the loop only.
    collecting = gc.isenabled()
    gc.disable()
    try:
        for i, cells in enumerate(occupied.tolist()):
            garments = tuple(
                Garment(cell_labels[i][cell], cell // GRID, cell % GRID, boxes[cell], cell_sources[i][cell])
                for cell in range(GRID * GRID)
                if cells[cell]
            )
            meaning = meaning_of(garments)
            phrasings = _phrasings(meaning)
            scenes.garments.append(garments)
            scenes.meanings.append(meaning)
            scenes.references.append(list(phrasings))
            scenes.captions.append(phrasings[int(pick[i] * len(phrasings))])
    finally:
        if collecting:
            gc.enable()
    return scenes


def shift_garments(images: np.ndarray, rng: np.random.Generator, low: int, high: int) -> np.ndarray:
    """``images`` (uint8 ``(N, 56, 56, C)`` scenes) with each cell's garment moved inside its cell
    by a whole number of pixels, rows and columns each ``low`` to ``high`` pixels (uniform) in a
    random direction; the cell's edges fill with black and what is pushed past them is lost.
    A captioner that names garments only where the generator puts them is not looking at them:
    ``low=1, high=3`` makes the shifted test split, ``low=0`` the training augmentation.

    Raises:
        QkvError: ``0 <= low <= high < 28`` does not hold.
    """
    if not 0 <= low <= high < CELL:
        raise QkvError(f"a shift needs 0 <= low <= high < {CELL} pixels (got {low}, {high})")
    n = len(images)
    offsets = rng.integers(low, high + 1, size=(n, GRID * GRID, 2)) * rng.choice(
        (-1, 1), size=(n, GRID * GRID, 2)
    )
    out = np.zeros_like(images)
    for i in range(n):
        for cell in range(GRID * GRID):
            top, left = (cell // GRID) * CELL, (cell % GRID) * CELL
            dy, dx = (int(v) for v in offsets[i, cell])
            src = images[i, top : top + CELL, left : left + CELL]
            dst = out[i, top : top + CELL, left : left + CELL]
            dst[max(dy, 0) : CELL + min(dy, 0), max(dx, 0) : CELL + min(dx, 0)] = src[
                max(-dy, 0) : CELL + min(-dy, 0), max(-dx, 0) : CELL + min(-dx, 0)
            ]
    return out


def load_scene_task(
    n_train: int = 100_000,
    n_eval: int = 2_000,
    seed: int = 0,
    val_fraction: float = 0.1,
    only: Sequence[str] | None = None,
) -> dict[str, SceneSet]:
    """The splits :data:`SCENE_SPLITS` of the scene captioning task, ids ``scenes/<split>/<i>``.

    Fashion-MNIST's training images lose ``val_fraction`` of each class to validation
    (:func:`stratified_split` with ``seed``): ``train`` (``n_train`` scenes, no held-out
    composition) is drawn from the rest, ``val`` and ``val_novel`` (``n_eval`` each; novel: at
    least one :data:`HELD_OUT` composition) from the validation images; ``test`` and
    ``test_novel`` (``n_eval`` each) only from Fashion-MNIST's test images. Split k (its place in
    :data:`SCENE_SPLITS`) uses seed ``5 * seed + k``. ``Garment.source`` indexes the
    Fashion-MNIST split used: ``"train"`` (60,000) for train/val/val_novel, ``"test"`` (10,000)
    for test/test_novel. ``val_shifted`` and ``test_shifted`` (:data:`SHIFTED_SPLITS`) are
    ``val``'s and ``test``'s scenes with each garment moved 1 to 3 pixels in each direction
    inside its cell (:func:`shift_garments`; the captions and boxes stay true), built when
    ``only`` names them. ``only``: build just these splits (the same scenes as in the whole
    task); ``None``: :data:`SCENE_SPLITS`.

    Raises:
        QkvError: ``n_train`` or ``n_eval`` < 1, ``seed`` < 0, ``val_fraction`` outside (0, 1),
            or Fashion-MNIST files that cannot be read.
    """
    if n_train < 1 or n_eval < 1 or seed < 0 or not 0 < val_fraction < 1:
        raise QkvError(
            "load_scene_task needs n_train, n_eval >= 1, seed >= 0 and 0 < val_fraction < 1 "
            f"(got {n_train}, {n_eval}, {seed}, {val_fraction})"
        )
    full, test = load_fashion_mnist("train"), load_fashion_mnist("test")
    rest, held = stratified_split(full.labels, val_fraction, seed)
    everything = np.arange(len(test.labels))
    plan = {
        "train": (full, rest, n_train, False),
        "val": (full, held, n_eval, False),
        "val_novel": (full, held, n_eval, True),
        "test": (test, everything, n_eval, False),
        "test_novel": (test, everything, n_eval, True),
    }
    # the shifted splits are val's and test's scenes, each garment moved 1-3 pixels in its cell
    shifted = {f"{s}_shifted": s for s in ("val", "test") if only is not None and f"{s}_shifted" in only}
    wanted = None if only is None else {*only, *shifted.values()}
    out = {
        split: _make_scenes(
            images.subset(index), n, len(SCENE_SPLITS) * seed + k, novel, f"scenes/{split}", index
        )
        for k, (split, (images, index, n, novel)) in enumerate(plan.items())
        if wanted is None or split in wanted
    }
    for k, (name, base) in enumerate(shifted.items()):
        rng = np.random.default_rng(len(SCENE_SPLITS) * seed + len(plan) + k)
        scenes = out[base]
        out[name] = replace(
            scenes,
            images=shift_garments(scenes.images, rng, 1, 3),
            ids=[i.replace(f"scenes/{base}/", f"scenes/{name}/") for i in scenes.ids],
        )
    return {k: v for k, v in out.items() if only is None or k in only}


def scene_scores(predicted: Sequence[str], meanings: Sequence[Meaning]) -> dict[str, float]:
    """How well predicted captions describe scenes of known meaning, each share in [0, 1]:

    - ``exact_match``: ``parse_caption(prediction) == meaning``;
    - ``parsed``: the prediction is in the grammar (``parse_caption`` is not None);
    - ``garment_accuracy``: over every true garment slot (row i, position j in the row) of
      every scene, the share where the prediction's meaning has the same label at slot (i, j);
      a slot the prediction lacks, or an unparsed prediction, is wrong (extra predicted
      garments cost nothing here: see ``count_accuracy``);
    - ``count_accuracy``: the prediction names as many garments as the scene holds;
    - ``relation_accuracy``: same row structure, the tuple of row lengths (how many rows, and
      how many garments in each); left/right order within a row is judged by
      ``garment_accuracy``;

    an unparsed prediction is wrong on every measure. ``n``: the number of scenes.

    Raises:
        QkvError: no predictions, or not one per meaning.
    """
    if len(predicted) != len(meanings) or not meanings:
        raise QkvError(f"scene_scores needs one prediction per scene ({len(predicted)} for {len(meanings)})")
    exact = parsed = counts = relations = slots_right = slots = 0
    for text, truth in zip(predicted, meanings, strict=True):
        guess = parse_caption(text)
        slots += sum(map(len, truth))
        if guess is None:
            continue
        parsed += 1
        exact += guess == truth
        counts += sum(map(len, guess)) == sum(map(len, truth))
        relations += tuple(map(len, guess)) == tuple(map(len, truth))
        slots_right += sum(
            i < len(guess) and j < len(guess[i]) and guess[i][j] == label
            for i, row in enumerate(truth)
            for j, label in enumerate(row)
        )
    n = len(meanings)
    return {
        "exact_match": exact / n,
        "parsed": parsed / n,
        "garment_accuracy": slots_right / max(slots, 1),
        "count_accuracy": counts / n,
        "relation_accuracy": relations / n,
        "n": n,
    }
