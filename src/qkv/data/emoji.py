"""Emoji across artists: the same emoji drawn by Google (Noto Emoji), Twitter (Twemoji) and
OpenMoji, each captioned with its human-written name, for captioning across drawing styles
(train on two artists, test on the third).

Data (``$QKV_DATA_DIR/emoji/``, see its README): ``google_64.tar.gz`` and ``twitter_64.tar.gz``
(64 × 64 PNGs from npm ``emoji-datasource-google@16.0.0`` / ``emoji-datasource-twitter@16.0.0``,
github.com/iamcal/emoji-data), ``openmoji_72.tar.gz`` (72 × 72 PNGs rendered from npm
``openmoji@17.0.0`` with OpenMoji's own export recipe) and ``openmoji.json`` (the captions).
The sets are joined on the code-point sequence of the file name, upper-cased, ``FE0F`` removed:
3,786 emoji (1,911 base + 1,875 skin-tone variants) have a drawing by all three artists.

Images are ``uint8 (N, size, size, 3)``: each PNG (RGBA, grey + alpha or palette) is converted
to RGBA, composited on white (the artists draw for light backgrounds), converted to RGB and
resized with Pillow's BILINEAR filter (antialiased when shrinking): the steps and filter of
:func:`qkv.data.images.read_image` with ``background="white"``, so an emoji PNG given to a
trained captioner is the same array as in training (LANCZOS would be a little sharper, but
would differ from what inference feeds the model).
"""

from __future__ import annotations

import functools
import io
import json
import logging
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import QkvError
from .images import MAX_PIXELS
from .sources import READ_ERRORS, find_data_file, unreadable_because

logger = logging.getLogger(__name__)

ARTISTS = ("google", "twitter", "openmoji")
EMOJI_SPLITS = ("train", "val", "test")
EMOJI_CITATION = (
    "Noto Emoji (Google), Apache-2.0; Twemoji (Twitter, Inc. and contributors), CC BY 4.0; "
    "OpenMoji (HfG Schwäbisch Gmünd), CC BY-SA 4.0 (images and captions: openmoji.json, CLDR "
    "short names); PNGs via emoji-datasource (github.com/iamcal/emoji-data, MIT)"
)
# archive → (canonical source, sha256 of the file in ../shared/data/emoji/SHA256SUMS). The
# archives are not served as such anywhere (the Google/Twitter ones hold `img/<artist>/64/` of
# the npm tarballs; the OpenMoji PNGs are rendered), so they are not downloaded.
_ARCHIVES = {
    "google": (
        "google_64.tar.gz",
        "https://registry.npmjs.org/emoji-datasource-google/-/emoji-datasource-google-16.0.0.tgz",
        "149b4b2377f2454eba5d4ea50c889dbc2a95535c0727ad68b761bcc96b3625ab",
    ),
    "twitter": (
        "twitter_64.tar.gz",
        "https://registry.npmjs.org/emoji-datasource-twitter/-/emoji-datasource-twitter-16.0.0.tgz",
        "6a6c4f935748b80bb9c7e35a9e665866c7bf513ad79c737e9011a989ba50cefd",
    ),
    "openmoji": (
        "openmoji_72.tar.gz",
        "https://registry.npmjs.org/openmoji/-/openmoji-17.0.0.tgz",
        "3bcb7cfe4bf0246cf18053bbeba58eeca33937a79559d0e6fd15e4a57c0f2191",
    ),
}
_OPENMOJI_JSON = (  # byte-identical to data/openmoji.json in the npm openmoji@17.0.0 tarball
    "https://raw.githubusercontent.com/hfg-gmuend/openmoji/17.0.0/data/openmoji.json",
    "ab181dd523021dfbe2b98a13d96ab384b7b3014d17815261bc267fb39d9a211b",
)


@dataclass
class EmojiSet:
    """Emoji drawings with captions: ``images`` uint8 ``(N, size, size, 3)``, ``captions`` the
    emoji's name, ``ids`` ``"<artist>/<code points>"`` (e.g. ``"openmoji/1F600"``; the part after
    the slash is the join key across artists), ``artists`` the artist of each row."""

    images: np.ndarray
    captions: list[str]
    ids: list[str]
    artists: list[str]

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, index: np.ndarray | list[int]) -> EmojiSet:
        """The rows ``index`` (integer positions), in that order."""
        idx = [int(i) for i in index]
        pick = [self.captions, self.ids, self.artists]
        return EmojiSet(self.images[idx], *([x[i] for i in idx] for x in pick))


def _key(name: str) -> str:
    """Join key of a PNG member name: code points upper-cased, ``FE0F`` removed."""
    stem = name.rsplit("/", 1)[-1].removesuffix(".png")
    return "-".join(p for p in stem.upper().split("-") if p != "FE0F")


def _archive(artist: str) -> Path:
    name, url, sha = _ARCHIVES[artist]
    try:
        return find_data_file("emoji", name, url, sha, download=False)
    except QkvError as exc:
        raise QkvError(f"{exc}; see the emoji/ entry of the data README (source: {url})") from None


def _members(path: Path) -> list[tarfile.TarInfo]:
    try:
        with tarfile.open(path, "r:gz") as tar:
            return [m for m in tar.getmembers() if m.isfile() and m.name.endswith(".png")]
    except (tarfile.TarError, *READ_ERRORS) as exc:
        raise QkvError(f"cannot read {path}: {unreadable_because(exc)}") from None


@functools.lru_cache(maxsize=2)
def _shared(paths: tuple[Path, ...], json_path: Path) -> dict[str, str]:
    """Join key → caption of the emoji drawn by every artist, sorted by key."""
    try:
        entries = json.loads(json_path.read_text(encoding="utf-8"))
        names = {_key(e["hexcode"]): e["annotation"] for e in entries if e.get("annotation")}
    except (*READ_ERRORS, ValueError, KeyError, TypeError) as exc:
        raise QkvError(f"cannot read {json_path}: {unreadable_because(exc)}") from None
    keys = set(names)
    for path in paths:
        keys &= {_key(m.name) for m in _members(path)}
    if not keys:
        raise QkvError(f"no emoji is drawn by all of {', '.join(ARTISTS)} ({', '.join(map(str, paths))})")
    return {k: names[k] for k in sorted(keys)}


def _png(data: bytes, size: int, name: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.width * img.height > MAX_PIXELS:
                raise QkvError(f"{name}: {img.width} x {img.height} pixels is more than {MAX_PIXELS:,}")
            rgba = img.convert("RGBA")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise QkvError(f"{name}: truncated or corrupt image ({exc})") from None
    rgb = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return np.asarray(rgb.resize((size, size), Image.Resampling.BILINEAR))


@functools.lru_cache(maxsize=12)
def _decoded(path: Path, keys: tuple[str, ...], size: int) -> np.ndarray:
    """The images of ``keys`` in one archive, in that order (cached; read-only)."""
    start, where = time.perf_counter(), {k: i for i, k in enumerate(keys)}
    out, seen = np.empty((len(keys), size, size, 3), np.uint8), np.zeros(len(keys), bool)
    try:
        with tarfile.open(path, "r:gz") as tar:
            for m in tar:  # streamed: one pass over the gzip data
                i = where.get(_key(m.name)) if m.isfile() and m.name.endswith(".png") else None
                if i is not None and (f := tar.extractfile(m)) is not None:
                    out[i], seen[i] = _png(f.read(), size, f"{path.name}:{m.name}"), True
    except (tarfile.TarError, *READ_ERRORS) as exc:
        raise QkvError(f"cannot read {path}: {unreadable_because(exc)}") from None
    if not seen.all():
        raise QkvError(f"{path} lacks the image of {keys[int(np.argmin(seen))]}")
    logger.info(
        "decoded %d emoji from %s at %d px in %.1f s", len(keys), path.name, size, time.perf_counter() - start
    )
    out.flags.writeable = False
    return out


def load_emoji(artist: str, size: int = 32) -> EmojiSet:
    """The 3,786 emoji drawn by all three artists, as drawn by ``artist`` (one of
    :data:`ARTISTS`), at ``size × size`` px, sorted by join key: row ``i`` is the same emoji for
    every artist. Captions are OpenMoji's ``annotation`` (the CLDR short name, as given: e.g.
    ``"grinning face"``, ``"waving hand: light skin tone"``, ``"flag: Estonia"``), the one name
    source that covers every shared emoji (3,786 distinct names; skin-tone variants differ by
    their tone). Decoded images are cached per (archive, size); each call returns a copy.

    Raises:
        QkvError: an unknown artist, or a missing or corrupt archive or ``openmoji.json``.
    """
    if artist not in ARTISTS:
        raise QkvError(f"unknown emoji artist {artist!r}: use one of {', '.join(ARTISTS)}")
    if size < 1:
        raise QkvError(f"emoji image size must be at least 1 px (got {size})")
    paths = tuple(_archive(a) for a in ARTISTS)
    shared = _shared(paths, find_data_file("emoji", "openmoji.json", *_OPENMOJI_JSON))
    keys = tuple(shared)
    images = _decoded(paths[ARTISTS.index(artist)], keys, size).copy()
    return EmojiSet(images, list(shared.values()), [f"{artist}/{k}" for k in keys], [artist] * len(keys))


def _concat(sets: list[EmojiSet]) -> EmojiSet:
    return EmojiSet(
        np.concatenate([s.images for s in sets]),
        *([x for s in sets for x in getattr(s, f)] for f in ("captions", "ids", "artists")),
    )


SKIN_TONES = ("1F3FB", "1F3FC", "1F3FD", "1F3FE", "1F3FF")  # Fitzpatrick modifiers (Unicode TR51)


def tone_group(emoji_id: str) -> str:
    """The emoji an id draws, skin tones aside: ``"google/1F44B-1F3FB"`` → ``"1F44B"`` (the
    join key without its :data:`SKIN_TONES`), so the variants of one emoji split together."""
    key = emoji_id.rsplit("/", 1)[-1]
    return "-".join(p for p in key.split("-") if p not in SKIN_TONES) or key


def load_emoji_task(
    test_artist: str = "openmoji", size: int = 32, val_fraction: float = 0.1, split_seed: int = 0
) -> dict[str, EmojiSet]:
    """Splits ``{"train", "val", "test"}`` (:data:`EMOJI_SPLITS`) for captioning across artists.

    ``test``: every shared emoji drawn by ``test_artist``. The other two artists give train and
    val: ``val_fraction`` of the emoji (chosen by ``split_seed``, a base emoji and its skin-tone
    variants together: :func:`tone_group`) as drawn by the first of them in :data:`ARTISTS`
    order form ``val``, and the same emoji by the second stay in ``train``, as does every other
    (artist, emoji) pair of the two. So validation, like test, asks for an emoji's name from a
    drawing whose artist drew nothing of it that was trained on, not even another skin tone of
    it (the name itself was seen, from the other artist). ``train`` holds the first artist's rows, then
    the second's, each in join-key order.

    Raises:
        QkvError: an unknown ``test_artist``, ``val_fraction`` outside (0, 0.5), or what
            :func:`load_emoji` raises.
    """
    if test_artist not in ARTISTS:
        raise QkvError(f"unknown emoji test artist {test_artist!r}: use one of {', '.join(ARTISTS)}")
    if not 0 < val_fraction < 0.5:
        raise QkvError(f"val_fraction must be in (0, 0.5) (got {val_fraction})")
    first, second = (load_emoji(a, size) for a in ARTISTS if a != test_artist)
    groups = [tone_group(i) for i in first.ids]
    names = sorted(set(groups))
    drawn = np.random.default_rng(split_seed).permutation(len(names))[
        : max(1, round(val_fraction * len(names)))
    ]
    held = {names[i] for i in drawn}
    val = np.array([i for i, g in enumerate(groups) if g in held])
    rest = np.array([i for i, g in enumerate(groups) if g not in held])
    return {
        "train": _concat([first.subset(rest), second]),
        "val": first.subset(val),
        "test": load_emoji(test_artist, size),
    }


def emoji_scores(predicted: list[str], references: list[str]) -> dict:
    """``{"exact_match": fraction of predictions equal to their reference after strip + lower,
    "n": number of pairs}``.

    Raises:
        QkvError: the lists differ in length or are empty.
    """
    if len(predicted) != len(references) or not references:
        raise QkvError(
            f"need as many predictions as references, at least one ({len(predicted)} vs {len(references)})"
        )
    hits = sum(p.strip().lower() == r.strip().lower() for p, r in zip(predicted, references, strict=True))
    return {"exact_match": hits / len(references), "n": len(references)}
