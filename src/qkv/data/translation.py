"""Multi30k (Elliott et al. 2016, doi:10.18653/v1/W16-3210): image captions in en/de/fr/cs.

Files are looked up in ``$QKV_DATA_DIR/multi30k/`` first, then in the user cache
(``~/.cache/qkv/multi30k``); if absent there they are downloaded from the data set's canonical
repository and verified against the sha256 sums below.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from ..errors import QkvError
from .batching import TranslationBatch, make_batch, token_batches
from .sources import READ_ERRORS, find_data_file, unreadable_because
from .tokenizers import SubwordTokenizer

LANGUAGES = ("en", "de", "fr", "cs")
SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
URL = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d/data/task1/raw/{name}"
SHA256 = {
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
}


def find_file(name: str, download: bool = True) -> Path:
    """Path of one Multi30k file, e.g. ``"train.de.gz"``: data dir, cache, else download."""
    if name not in SHA256:
        raise QkvError(f"unknown Multi30k file {name!r}")
    return find_data_file("multi30k", name, URL.format(name=name), SHA256[name], download)


def read_lines(path: Path) -> list[str]:
    """Lines of a gzipped UTF-8 file, without trailing newlines (empty lines kept)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [line.rstrip("\r\n") for line in f]
    except READ_ERRORS as exc:
        raise QkvError(f"cannot read {path}: {unreadable_because(exc)}") from None


def load_multi30k(split: str, src_lang: str = "de", tgt_lang: str = "en") -> tuple[list[str], list[str]]:
    """Aligned ``(sources, targets)`` of one split: ``train``, ``val`` or ``test2016``.

    Raises:
        QkvError: unknown split/language, files missing and not downloadable, or misaligned.
    """
    if split not in SPLITS:
        raise QkvError(f"unknown Multi30k split {split!r}; choose one of {', '.join(SPLITS)}")
    for lang in (src_lang, tgt_lang):
        if lang not in LANGUAGES:
            raise QkvError(f"unknown Multi30k language {lang!r}; choose one of {', '.join(LANGUAGES)}")
    src = read_lines(find_file(f"{SPLITS[split]}.{src_lang}.gz"))
    tgt = read_lines(find_file(f"{SPLITS[split]}.{tgt_lang}.gz"))
    if len(src) != len(tgt):
        raise QkvError(f"Multi30k {split}: {len(src)} {src_lang} lines but {len(tgt)} {tgt_lang} lines")
    return src, tgt


def encode_pairs(tok: SubwordTokenizer, src: list[str], tgt: list[str]) -> list[tuple[list[int], list[int]]]:
    """``(source ids, target ids)`` per sentence pair, without special tokens."""
    return list(zip(tok.encode_batch(src), tok.encode_batch(tgt), strict=True))


def eval_batches(tok: SubwordTokenizer, pairs) -> list[TranslationBatch]:
    """Length-sorted batches of ~8000 padded tokens for scoring, in a fixed order."""
    return [
        make_batch([pairs[i] for i in idx], idx, tok.pad_id, tok.bos_id, tok.eos_id)
        for idx in token_batches([(len(s), len(t)) for s, t in pairs], 8000, shuffle=False)
    ]


def fitting_pairs(pairs: list, max_len: int) -> list:
    """The pairs whose source + eos and bos + target fit in ``max_len`` positions: those the
    teacher-forced loss can score (decoding cuts over-long sources instead)."""
    return [(s, t) for s, t in pairs if len(s) < max_len and len(t) < max_len]
