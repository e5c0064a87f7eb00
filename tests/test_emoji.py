"""Emoji across artists: the shared set, captions, images, the cross-artist splits, scores."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

from qkv.data.emoji import ARTISTS, EMOJI_SPLITS, emoji_scores, load_emoji, load_emoji_task, tone_group
from qkv.data.images import read_image
from qkv.errors import QkvError

DATA = Path(os.environ.get("QKV_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))
pytestmark = pytest.mark.skipif(
    not (DATA / "emoji" / "openmoji_72.tar.gz").is_file(),
    reason=f"emoji data not found under {DATA} (set QKV_DATA_DIR)",
)


@pytest.fixture(autouse=True)
def _data_dir(monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", str(DATA))


def _keys(ids: list[str]) -> list[str]:
    return [i.split("/", 1)[1] for i in ids]


def test_every_artist_has_the_same_3786_emoji_in_the_same_order():
    sets = {a: load_emoji(a) for a in ARTISTS}
    google = sets["google"]
    assert len(google) == 3786 and _keys(google.ids) == sorted(_keys(google.ids))
    for artist, s in sets.items():
        assert len(s) == 3786 and s.images.shape == (3786, 32, 32, 3) and s.images.dtype == np.uint8
        assert _keys(s.ids) == _keys(google.ids) and s.captions == google.captions
        assert all(i.startswith(f"{artist}/") for i in s.ids) and set(s.artists) == {artist}
    captions = google.captions
    assert all(c.strip() for c in captions) and len(set(captions)) == 3786  # skin tones differ
    row = dict(zip(_keys(google.ids), captions, strict=True))
    assert row["1F600"] == "grinning face" and row["1F44B-1F3FB"] == "waving hand: light skin tone"
    assert row["2764"] == "red heart"  # FE0F dropped from the join key


def test_images_are_rgb_on_white_at_the_asked_size():
    for artist in ARTISTS:
        images = load_emoji(artist).images
        corners = images[:, [0, 0, -1, -1], [0, -1, 0, -1]]  # (N, 4, 3)
        white = (corners >= 250).all(axis=(1, 2))
        assert white.mean() > 0.7, artist  # transparent corners composite to white, not black
        assert images.std() > 40  # real drawings, not blank
    small = load_emoji("twitter", size=8)
    assert small.images.shape == (3786, 8, 8, 3) and small.images.dtype == np.uint8
    small.images[0] = 0  # a writable copy: the cached decode is untouched
    assert load_emoji("twitter", size=8).images[0].max() > 0


def test_training_pixels_equal_what_inference_reads_from_the_same_png():
    for artist, archive in (("google", "google_64.tar.gz"), ("openmoji", "openmoji_72.tar.gz")):
        emoji = load_emoji(artist)
        row = {k: i for i, k in enumerate(_keys(emoji.ids))}
        with tarfile.open(DATA / "emoji" / archive) as tar:
            members = [m for m in tar.getmembers() if m.name.endswith(("/1F600.png", "/1f600.png"))]
            members += [m for m in tar.getmembers() if m.name.upper().endswith("/1F44B-1F3FB.PNG")]
            assert len(members) == 2
            for m in members:
                png = tar.extractfile(m).read()
                key = m.name.rsplit("/", 1)[1].removesuffix(".png").upper()
                seen = read_image(io.BytesIO(png), 32, 3, background="white")
                assert np.array_equal(seen, emoji.images[row[key]]), (artist, key)


def test_task_splits_hold_out_an_artist_and_unseen_drawings():
    task = load_emoji_task("twitter", val_fraction=0.1, split_seed=3)
    assert tuple(task) == EMOJI_SPLITS
    train, val, test = (task[s] for s in EMOJI_SPLITS)
    assert test.ids == load_emoji("twitter").ids and set(test.artists) == {"twitter"}
    assert set(train.artists) == {"google", "openmoji"} and set(val.artists) == {"google"}
    assert "twitter" not in {i.split("/")[0] for i in train.ids + val.ids}
    assert not set(val.ids) & set(train.ids)
    groups = {tone_group(i) for i in load_emoji("google").ids}
    assert len({tone_group(i) for i in val.ids}) == round(0.1 * len(groups))  # emoji, tones together
    # no skin tone of a validation emoji by the validation artist is trained on
    assert not {tone_group(i) for i in val.ids} & {
        tone_group(i) for i in train.ids if i.startswith("google/")
    }
    assert len(train) + len(val) == 2 * 3786
    train_ids = set(train.ids)
    assert all(f"openmoji/{k}" in train_ids for k in _keys(val.ids))  # seen from the other artist
    google = load_emoji("google")
    assert np.array_equal(val.images, google.subset([google.ids.index(i) for i in val.ids]).images)
    assert val.captions == [google.captions[google.ids.index(i)] for i in val.ids]
    again, other = (
        load_emoji_task("twitter", val_fraction=0.1, split_seed=3),
        load_emoji_task("twitter", split_seed=4),
    )
    assert again["val"].ids == val.ids and again["train"].ids == train.ids
    assert np.array_equal(again["train"].images, train.images)
    assert other["val"].ids != val.ids
    default = load_emoji_task()
    assert set(default["test"].artists) == {"openmoji"} and set(default["val"].artists) == {"google"}


def test_bad_arguments_raise_one_line_errors():
    with pytest.raises(QkvError, match="google, twitter, openmoji") as err:
        load_emoji("apple")
    assert "\n" not in str(err.value)
    with pytest.raises(QkvError, match="google, twitter, openmoji"):
        load_emoji_task("noto")
    for frac in (0.0, 0.5, -1.0):
        with pytest.raises(QkvError, match="val_fraction"):
            load_emoji_task(val_fraction=frac)


def test_missing_or_corrupt_archive_is_a_qkv_error(tmp_path, monkeypatch):
    monkeypatch.setenv("QKV_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "emoji").mkdir()
    (tmp_path / "emoji" / "openmoji.json").symlink_to(DATA / "emoji" / "openmoji.json")
    with pytest.raises(QkvError, match="google_64.tar.gz"):
        load_emoji("google")
    for name in ("twitter_64.tar.gz", "openmoji_72.tar.gz"):
        (tmp_path / "emoji" / name).symlink_to(DATA / "emoji" / name)
    good = (DATA / "emoji" / "google_64.tar.gz").read_bytes()
    (tmp_path / "emoji" / "google_64.tar.gz").write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(QkvError, match="cannot read .*google_64.tar.gz") as err:
        load_emoji("openmoji")
    assert "\n" not in str(err.value)


def test_emoji_scores_exact_match():
    scores = emoji_scores([" grinning FACE", "red heart", "cat"], ["Grinning Face ", "red heart", "dog face"])
    assert scores == {"exact_match": pytest.approx(2 / 3), "n": 3}
    with pytest.raises(QkvError):
        emoji_scores(["a"], ["a", "b"])
