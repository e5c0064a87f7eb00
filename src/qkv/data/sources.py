"""Where data files come from: the data directory, the user cache, else a verified download.

Lookup order for ``<dataset>/<name>``: ``$QKV_DATA_DIR/<dataset>/<name>``, then
``~/.cache/qkv/<dataset>/<name>`` (``$XDG_CACHE_HOME`` respected); if absent, the file is
downloaded from its canonical URL into the cache and verified against its SHA-256.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
import urllib.request
import zlib
from pathlib import Path

from ..errors import QkvError

# what reading a (possibly gzipped) text or binary input file raises when its bytes are bad
READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError)


def sha256sum(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _download(url: str, sha256: str, dest: Path, dataset: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(dest.suffix + ".part")
    try:
        urllib.request.urlretrieve(url, tmp)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise QkvError(
            f"{dataset} file {dest.name} not found locally and the download from {url} failed "
            f"({exc}). Put the file in $QKV_DATA_DIR/{dataset}/ "
            f"(QKV_DATA_DIR={os.environ.get('QKV_DATA_DIR', 'unset')})"
        ) from None
    if sha256sum(tmp) != sha256:
        tmp.unlink(missing_ok=True)
        raise QkvError(f"downloaded {dataset} file {dest.name} has a wrong sha256; not using it")
    os.replace(tmp, dest)  # atomic: a half-downloaded file is never found later


def find_data_file(dataset: str, name: str, url: str, sha256: str, download: bool = True) -> Path:
    """Path of ``<dataset>/<name>``: data dir, cache, else download (verified).

    Raises:
        QkvError: not found and ``download=False``, the download failed, or its checksum is wrong.
    """
    candidates = []
    if os.environ.get("QKV_DATA_DIR"):
        candidates.append(Path(os.environ["QKV_DATA_DIR"]) / dataset / name)
    cache_root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    cache = cache_root / "qkv" / dataset / name
    candidates.append(cache)
    for path in candidates:
        if path.is_file():
            return path
    if not download:
        raise QkvError(f"{dataset} file {name} not found in {', '.join(map(str, candidates))}")
    _download(url, sha256, cache, dataset)
    return cache


def unreadable_because(exc: BaseException) -> str:
    """Why a (possibly gzipped) input file could not be read, in a few words: a truncated gzip
    stream (``EOFError``), a corrupt one, text that is not UTF-8."""
    if isinstance(exc, EOFError):
        return "truncated (the compressed stream ends early)"
    if isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        return f"corrupt gzip data ({' '.join(str(exc).split())})"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text (byte {exc.start})"
    return " ".join(str(exc).split()) or type(exc).__name__


def read_lines(path: str | Path) -> list[str]:
    """The non-empty lines of a UTF-8 text file, stripped: one text per line (``-``: standard
    input, for a pipe).

    Raises:
        QkvError: the file cannot be read, is not UTF-8, or holds no text.
    """
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise QkvError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        lines = [line.strip() for line in data.decode("utf-8").splitlines()]
    except UnicodeDecodeError as exc:
        raise QkvError(f"{path} is not valid UTF-8 (byte {exc.start})") from None
    lines = [line for line in lines if line]
    if not lines:
        raise QkvError(f"{path} holds no text")
    return lines
