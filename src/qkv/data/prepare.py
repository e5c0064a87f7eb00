"""``qkv prepare``: tokenize a corpus once into token shards (:mod:`qkv.data.shards`), streaming
it in bounded memory, resumable if interrupted.

Text (``prepare_lm``): the corpora are read in chunks of about ``CHUNK_BYTES``, cut after a line
break; a first pass counts characters and collects the character vocabulary (and, for BPE, a
sample of paragraphs to train it on), a second encodes. The validation split is the last
``val_fraction`` of the characters (nanoGPT's split, as the in-memory path does) or a separate
``val_corpus``. Proteins (``prepare_protein_mlm``): FASTA records (Biopython), held out by a
hash of the record id, identical sequences kept once (as the in-memory corpus does), training
shards sorted by length.

Memory is bounded by one shard in progress (``shard_tokens``) and one chunk, whatever the size
of the corpus; the set of sequence digests used to drop duplicates is the exception (about
70 bytes per protein; ``dedup=False`` turns it off). After each shard, ``progress.json`` records
the position in the input: running the same command again resumes there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..errors import QkvError
from ..files import folder_obstacle, write_json
from .protein import fasta_entries, held_out, pretraining_files, record_id
from .shards import FORMAT, SPLITS, VERSION, SplitWriter
from .text import check_val_fraction, load_corpus_path
from .tokenizers import (
    AMINO_ACIDS,
    PROTEIN_SPECIALS,
    RARE_CODES,
    AminoAcidTokenizer,
    CharTokenizer,
    SubwordTokenizer,
)

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 << 20
SHARD_TOKENS = 1 << 26  # 64 M tokens: 64-256 MB of ids per shard in memory while writing
BPE_SAMPLE_CHARS = 32_000_000  # BPE merges learnt from about 32 MB of text (recorded in meta.json)
# where a chunk of text may end: after a line break that precedes a non-space character (byte-
# level BPE then tokenizes both sides as it would the whole text)
_SAFE_CUT = re.compile(r"(?<=\n)(?=\S)")


class _Preparation:
    """The output directory of one preparation: refusals before anything is written, the
    progress record that resuming starts from, the final ``meta.json``."""

    def __init__(self, out: Path, settings: dict, sources: list[Path]) -> None:
        self.out, self.progress_path = out, out / "progress.json"
        missing = [str(p) for p in sources if not p.is_file()]
        if missing:
            raise QkvError(f"input file(s) not found: {', '.join(missing)}")
        self.sources = [{"path": str(p.resolve()), "bytes": p.stat().st_size} for p in sources]
        self.settings = settings
        self.state: dict = {}
        if (out / "meta.json").is_file():
            raise QkvError(f"{out} is already prepared (meta.json); choose another --out or remove it")
        if self.progress_path.is_file():
            saved = json.loads(self.progress_path.read_text(encoding="utf-8"))
            if saved.get("settings") != settings or saved.get("sources") != self.sources:
                raise QkvError(
                    f"{out} holds an unfinished preparation of other inputs or settings; remove it "
                    "or prepare into another --out"
                )
            self.state = saved["state"]
            logger.info(f"resuming the preparation in {out}")
        elif folder_obstacle(out)[0] in ("file", "not empty"):
            raise QkvError(f"--out {out} exists and is not empty; choose a new directory")
        for split in SPLITS:  # shards written after the last progress record are redone
            done = len(self.state.get("splits", {}).get(split, []))
            keep = self.state.get("pending", {}).get(split, [None])[0]
            for path in (out / split).glob("*-*.bin") if (out / split).is_dir() else []:
                kind, number = path.stem.split("-")
                if (kind == "pending" and path.name != keep) or (kind != "pending" and int(number) >= done):
                    path.unlink()

    def save(self, **state) -> None:
        self.state.update(state)
        write_json(
            self.progress_path, {"settings": self.settings, "sources": self.sources, "state": self.state}
        )

    def finish(self, kind: str, tokenizer, writers: dict[str, SplitWriter], **extra) -> dict:
        for name, w in writers.items():
            if w.buffered == 0 and not w.shards:
                raise QkvError(f"the {name} split is empty: a larger corpus or another val_fraction")
        for name, w in writers.items():
            w.flush()
            for stale in (self.out / name).glob("pending-*.bin"):
                stale.unlink()
        tokenizer.save(self.out / "tokenizer.json")
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "kind": kind,
            "dtype": str(writers["train"].dtype),
            "vocab_size": tokenizer.vocab_size,
            "sources": self.sources,
            "settings": self.settings,
            "splits": {name: w.shards for name, w in writers.items()},
            "tokens": {name: sum(s[0] for s in w.shards) for name, w in writers.items()},
            "sequences": {name: sum(s[1] for s in w.shards) for name, w in writers.items()},
            "token_counts": {name: w.counts.tolist() for name, w in writers.items()},
            **extra,
        }
        write_json(self.out / "meta.json", meta)
        self.progress_path.unlink(missing_ok=True)
        return meta

    def writers(self, vocab_size: int, shard_tokens: int, sort_train: bool = False) -> dict[str, SplitWriter]:
        done, pending = self.state.get("splits", {}), self.state.get("pending", {})
        counts = self.state.get("counts", {})
        writers = {
            name: SplitWriter(
                self.out / name,
                vocab_size,
                shard_tokens,
                sort_train and name == "train",
                done.get(name),
                counts.get(name),
            )
            for name in SPLITS
        }
        for name, (file, lengths) in pending.items():
            writers[name].load_pending(file, lengths)
        return writers

    def due(self, writers: dict[str, SplitWriter]) -> bool:
        """Whether a shard was completed since the last progress record."""
        recorded = self.state.get("splits", {})
        return any(len(w.shards) != len(recorded.get(n, [])) for n, w in writers.items())

    def checkpoint(self, writers: dict[str, SplitWriter], **state) -> None:
        """Save the shards in progress as they are and record how far the input was read
        (``state``); called when :meth:`due`. Resuming starts from there, drops the shards
        written after it and takes the shards in progress back."""
        generation = self.state.get("generation", 0) + 1
        pending = {
            n: (f"pending-{generation}.bin", w.save_pending(f"pending-{generation}.bin"))
            for n, w in writers.items()
        }
        old = self.state.get("pending", {})
        self.save(
            splits={n: [list(s) for s in w.shards] for n, w in writers.items()},
            counts={n: w.counts.tolist() for n, w in writers.items()},
            pending=pending,
            generation=generation,
            **state,
        )
        for name, (file, _) in old.items():
            (self.out / name / file).unlink(missing_ok=True)


def _bar(files: list[Path], desc: str, progress: bool):
    """A progress bar over the bytes of ``files``."""
    from tqdm import tqdm

    total = sum(p.stat().st_size for p in files)
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, disable=not progress, leave=False)


def _passes(
    files: list[Path], desc: str, progress: bool, file: int = 0, offset: int = 0
) -> Iterator[tuple[int, int, str]]:
    """``(file index, byte offset after the chunk, text)`` of every chunk of ``files``
    (:func:`text_chunks`) from byte ``offset`` of file ``file`` on, with a progress bar."""
    with _bar(files, desc, progress) as bar:
        bar.update(sum(p.stat().st_size for p in files[:file]) + offset)
        for f in range(file, len(files)):
            last = offset if f == file else 0
            for end, text in text_chunks(files[f], last):
                bar.update(end - last)
                last = end
                yield f, end, text


def text_chunks(path: Path, start: int = 0, chunk_bytes: int | None = None) -> Iterator[tuple[int, str]]:
    """``(byte offset after the chunk, text)`` of a UTF-8 file from byte ``start``, in chunks of
    about ``chunk_bytes`` (default :data:`CHUNK_BYTES`) that end after a line break followed by
    a non-space character (or at the end of the file; a text without such a place for
    ``4 * chunk_bytes`` is cut at a character boundary). Windows and old Mac line endings are
    read as ``"\\n"``, as Python's text mode reads them.

    Raises:
        QkvError: bytes that are not UTF-8 (naming the offset).
    """
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    with open(path, "rb") as handle:
        handle.seek(start)
        pos = start
        while True:
            data = handle.read(chunk_bytes)
            if not data:
                return
            while True:
                after = handle.peek(1)[:1]
                if not after or (data.endswith(b"\n") and not after.isspace()):
                    break
                if len(data) >= 4 * chunk_bytes:  # no safe place: cut at a character boundary
                    keep = len(data)
                    while keep and data[keep - 1] & 0xC0 == 0x80:  # continuation bytes
                        keep -= 1
                    if keep and data[keep - 1] >= 0xC0:  # the lead byte of a cut character
                        keep -= 1
                    data = data[:keep]
                    handle.seek(pos + keep)
                    break
                data += handle.readline(chunk_bytes)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise QkvError(f"{path} is not UTF-8 text (byte {pos + exc.start})") from None
            if "\r" in text:  # line endings as Python's text mode reads them (the in-memory path)
                text = text.replace("\r\n", "\n").replace("\r", "\n")
            pos += len(data)
            yield pos, text


def _char_codes(text: str) -> np.ndarray:
    """Code points of ``text``. Shape: ``(len(text),)`` uint8 (ASCII) or uint32."""
    if text.isascii():
        return np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def _scan_text(files: list[Path], progress: bool) -> tuple[list[int], list[str]]:
    """Characters per file and the sorted character set of all of them (a first pass)."""
    counts, ascii_seen, chars = [0] * len(files), np.zeros(128, dtype=bool), set[str]()
    for f, _, text in _passes(files, "scan", progress):
        counts[f] += len(text)
        if text.isascii():
            ascii_seen |= np.bincount(_char_codes(text), minlength=128).astype(bool)
        else:
            chars.update(text)
    chars.update(chr(c) for c in np.flatnonzero(ascii_seen))
    return counts, sorted(chars)


def _paragraph_sample(
    files: list[Path], train_chars: int, sample_chars: int, seed: int, progress: bool
) -> tuple[list[str], dict]:
    """Paragraphs (``"\\n\\n"``-separated, as the in-memory path trains BPE on) of the training
    text, each kept with probability ``sample_chars / train_chars`` (all when the text is
    smaller), drawn with ``random.Random(seed)``."""
    fraction = min(1.0, sample_chars / max(train_chars, 1))
    rng = random.Random(seed)
    kept: list[str] = []
    seen, carry = 0, ""

    def take(parts: list[str]) -> None:
        kept.extend(p for p in parts if fraction >= 1.0 or rng.random() < fraction)

    for _, _, text in _passes(files, "sample", progress):
        text = text[: max(0, train_chars - seen)]
        seen += len(text)
        parts = (carry + text).split("\n\n")
        carry = parts.pop()
        take(parts)
    take([carry])
    record = {"fraction": fraction, "seed": seed, "paragraphs": len(kept), "chars": sum(map(len, kept))}
    return kept, record


def _check_sizes(**sizes: int) -> None:
    """Refuse a size below 1, naming the sizes checked (``"a, b and c must be >= 1"``)."""
    if any(size < 1 for size in sizes.values()):
        *rest, last = sizes
        raise QkvError(f"{', '.join(rest)} and {last} must be >= 1" if rest else f"{last} must be >= 1")


def prepare_lm(
    corpora: list[str],
    out: str | Path,
    *,
    tokenizer: str = "char",
    vocab_size: int = 8000,
    val_fraction: float = 0.1,
    val_corpus: str | None = None,
    bpe_sample_chars: int = BPE_SAMPLE_CHARS,
    seed: int = 0,
    shard_tokens: int = SHARD_TOKENS,
    progress: bool = False,
) -> dict:
    """Tokenize text corpora (UTF-8 files or ``tinyshakespeare``, read one after another as one
    text) into ``out`` for ``qkv train lm data=OUT``. Returns ``meta.json``'s content.

    The tokenizer is trained as ``qkv train lm`` trains it on a text file: ``"char"``, the
    sorted characters of the whole corpus; ``"bpe"``, byte-level BPE of ``vocab_size`` pieces
    learnt from the training text's paragraphs, or from a sample of about ``bpe_sample_chars``
    characters of them (drawn with ``seed``; its fraction, seed and size go to ``meta.json``).
    On a corpus that fits the in-memory path, the ids are the same as that path's.

    Raises:
        QkvError: a missing or non-UTF-8 file, an ``out`` that is not empty (unless it holds this
            very preparation unfinished), a split left empty, bad settings.
    """
    if tokenizer not in ("char", "bpe"):
        raise QkvError(f"tokenizer must be char or bpe, not {tokenizer!r}")
    check_val_fraction(val_fraction)
    if not corpora:
        raise QkvError("qkv prepare lm needs at least one corpus file")
    _check_sizes(shard_tokens=shard_tokens, bpe_sample_chars=bpe_sample_chars, vocab_size=vocab_size)
    files = [load_corpus_path(c) for c in corpora]
    val_files = [load_corpus_path(val_corpus)] if val_corpus else []
    settings = {
        "corpora": list(corpora),
        "val_corpus": val_corpus,
        "tokenizer": tokenizer,
        "vocab_size": vocab_size if tokenizer == "bpe" else None,
        "val_fraction": None if val_corpus else val_fraction,
        "bpe_sample_chars": bpe_sample_chars if tokenizer == "bpe" else None,
        "seed": seed,
        "shard_tokens": shard_tokens,
    }
    prep = _Preparation(Path(out), settings, files + val_files)
    if "scan" in prep.state:
        counts, chars = prep.state["scan"]["chars_per_file"], prep.state["scan"]["vocabulary"]
    else:
        counts, chars = _scan_text(files + val_files, progress)
    train_chars, val_chars = sum(counts[: len(files)]), sum(counts[len(files) :])
    split_at = _split_at(train_chars, val_chars, corpora, val_corpus, val_fraction)
    if "scan" not in prep.state:  # the first write: every refusal above left nothing behind
        prep.save(scan={"chars_per_file": counts, "vocabulary": chars})
    tok, sample = _text_tokenizer(
        prep, tokenizer, chars, files, split_at, vocab_size, bpe_sample_chars, seed, progress
    )
    writers = prep.writers(tok.vocab_size, shard_tokens)
    _tokenize_text(prep, writers, files, val_files, split_at, _text_encoder(tok, chars), progress)
    return prep.finish(
        "lm",
        tok,
        writers,
        chars={"train": split_at, "val": val_chars if val_corpus else train_chars - split_at},
        **({"bpe_sample": sample} if sample else {}),
    )


def _split_at(
    total: int, val_total: int, corpora: list[str], val_corpus: str | None, val_fraction: float
) -> int:
    """How many of the corpora's ``total`` characters train: all of them with a validation
    corpus (of ``val_total`` characters), else all but the last ``val_fraction`` (the cut of
    :func:`~qkv.data.text.split_train_val`).

    Raises:
        QkvError: a split left empty.
    """
    if total == 0:
        raise QkvError(f"corpus {', '.join(corpora)} is empty")
    split_at = total if val_corpus else int(total * (1 - val_fraction))  # split_train_val's cut
    if split_at == 0 or (not val_corpus and split_at == total):
        raise QkvError(f"a corpus of {total} characters leaves a split empty at val_fraction {val_fraction}")
    if val_corpus and val_total == 0:
        raise QkvError(f"validation corpus {val_corpus} is empty")
    return split_at


def _text_tokenizer(
    prep: _Preparation,
    kind: str,
    chars: list[str],
    files: list[Path],
    split_at: int,
    vocab_size: int,
    sample_chars: int,
    seed: int,
    progress: bool,
) -> tuple[CharTokenizer | SubwordTokenizer, dict | None]:
    """The tokenizer of a text preparation and, for BPE, the record of the sample its merges
    were learnt from (``None`` for characters). BPE is trained once, on the first
    ``split_at`` characters' paragraphs (:func:`_paragraph_sample`), and saved with the record
    before anything is tokenized; a resumed preparation loads it back."""
    if kind == "char":
        return CharTokenizer(chars), None
    if "bpe_sample" in prep.state:  # resumed: the merges learnt before
        return SubwordTokenizer.load(prep.out / "tokenizer.json"), prep.state["bpe_sample"]
    paragraphs, sample = _paragraph_sample(files, split_at, sample_chars, seed, progress)
    tok = SubwordTokenizer.train(paragraphs, vocab_size, byte_level=True)
    del paragraphs
    tok.save(prep.out / "tokenizer.json")
    prep.save(bpe_sample=sample)
    return tok, sample


def _text_encoder(tok: CharTokenizer | SubwordTokenizer, chars: list[str]) -> Callable[[str], np.ndarray]:
    """Text → the ids ``tok`` gives it, for a chunk at a time: characters by their place among
    the sorted code points of ``chars``; BPE on the pieces between safe cuts, in one batch."""
    if isinstance(tok, SubwordTokenizer):
        bpe = tok

        def encode(text: str) -> np.ndarray:
            pieces = [p for p in _SAFE_CUT.split(text) if p]
            return np.fromiter((i for row in bpe.encode_batch(pieces) for i in row), dtype=np.int64)

        return encode
    codes = np.array([ord(c) for c in chars], dtype=np.uint32)
    return lambda text: np.searchsorted(codes, _char_codes(text))


def _tokenize_text(
    prep: _Preparation,
    writers: dict[str, SplitWriter],
    files: list[Path],
    val_files: list[Path],
    split_at: int,
    encode: Callable[[str], np.ndarray],
    progress: bool,
) -> None:
    """The second pass: every chunk from where the preparation stands, encoded into the
    training split up to character ``split_at`` and into the validation split after it (or
    from ``val_files``); each file starts a new sequence. Records the position whenever a
    shard is completed."""
    train, val = writers["train"], writers["val"]
    position = prep.state.get("position", {"file": 0, "offset": 0, "chars": 0})
    file, offset, chars_seen = position["file"], position["offset"], position["chars"]
    previous = file if offset else -1
    for f, end, text in _passes(files + val_files, "tokenize", progress, file, offset):
        first, previous = f != previous, f  # a file's first chunk starts a sequence
        if f >= len(files):  # the validation corpus
            val.add(encode(text), first)
        else:
            cut = min(max(split_at - chars_seen, 0), len(text))
            if cut:
                train.add(encode(text[:cut]), first)
            if cut < len(text):
                val.add(encode(text[cut:]), first or cut > 0)
            chars_seen += len(text)
        if prep.due(writers):
            prep.checkpoint(writers, position={"file": f, "offset": end, "chars": chars_seen})


def _residue_table() -> np.ndarray:
    """Byte → amino-acid id (lower case accepted), 255 for anything else."""
    tok = AminoAcidTokenizer()
    table = np.full(256, 255, dtype=np.uint8)
    for code in AMINO_ACIDS + RARE_CODES:
        table[ord(code)] = table[ord(code.lower())] = tok.tokens.index(code)
    return table


def prepare_protein_mlm(
    fastas: list[str],
    out: str | Path,
    *,
    val_fraction: float = 0.02,
    dedup: bool = True,
    shard_tokens: int = SHARD_TOKENS,
    progress: bool = False,
) -> dict:
    """Tokenize FASTA files (default: the UniProt + RefSeq corpus of ``qkv train protein-mlm``)
    into ``out`` for ``qkv train protein-mlm data=OUT``. Returns ``meta.json``'s content.

    Residues only (no ``<cls>``/``<eos>``: the recipe adds them to each window). A record goes to
    the held-out split by a hash of its id (:func:`~qkv.data.protein.held_out`); with ``dedup``
    a sequence seen before is dropped, so the held-out split never holds a training sequence
    verbatim: on the default corpus both splits are the in-memory recipe's. Records that are
    empty or hold non-protein characters are skipped and counted.

    Raises:
        QkvError: a missing or unreadable file, an ``out`` that is not empty (unless it holds
            this very preparation unfinished), a split left empty, bad settings.
    """
    check_val_fraction(val_fraction)
    _check_sizes(shard_tokens=shard_tokens)
    files = [Path(f) for f in fastas] if fastas else pretraining_files()
    settings = {
        "fastas": [str(f) for f in fastas] or "uniprot+refseq",
        "val_fraction": val_fraction,
        "dedup": dedup,
        "shard_tokens": shard_tokens,
    }
    prep = _Preparation(Path(out), settings, files)
    tok = AminoAcidTokenizer()
    writers = prep.writers(tok.vocab_size, shard_tokens, sort_train=True)
    stats = _tokenize_fasta(prep, writers, files, val_fraction, dedup, progress)
    if stats["skipped"]:
        logger.warning(f"skipped {stats['skipped']:,} empty or non-protein record(s)")
    return prep.finish(
        "protein-mlm",
        tok,
        writers,
        records=stats,
        specials=len(PROTEIN_SPECIALS),
    )


def _tokenize_fasta(
    prep: _Preparation,
    writers: dict[str, SplitWriter],
    files: list[Path],
    val_fraction: float,
    dedup: bool,
    progress: bool,
) -> dict[str, int]:
    """Every record from where the preparation stands into its split (by :func:`held_out`),
    unusable records and (``dedup``) repeated sequences counted and left out; records read
    before are read again only to rebuild the digests of the sequences seen. Records the
    position whenever a shard is completed. Returns the counts of records read, skipped and
    duplicated."""
    table = _residue_table()
    stats = prep.state.get("stats", {"records": 0, "skipped": 0, "duplicates": 0})
    position = prep.state.get("position", {"file": 0, "record": 0})
    seen: set[bytes] = set()
    with _bar(files, "tokenize", progress) as bar:
        for f, path in enumerate(files):
            if f < position["file"] and not dedup:  # done before, and no digests to rebuild
                bar.update(path.stat().st_size)
                continue
            skip = position["record"] if f == position["file"] else 0
            last = 0
            for n, (title, seq, read) in enumerate(fasta_entries(path), 1):
                bar.update(read - last)
                last = read
                rec_id = record_id(title)
                ids, valid, digest = _residues(rec_id, seq, table, dedup)
                if f < position["file"] or n <= skip:  # done before: only the digests are rebuilt
                    if digest:
                        seen.add(digest)
                    continue
                stats["records"] += 1
                if not valid:
                    stats["skipped"] += 1
                    continue
                if digest in seen:
                    stats["duplicates"] += 1
                    continue
                if digest:
                    seen.add(digest)
                writers["val" if held_out(rec_id, val_fraction) else "train"].add(ids)
                if prep.due(writers):
                    prep.checkpoint(writers, position={"file": f, "record": n}, stats=stats)
    return stats


def _residues(rec_id: str, seq: str, table: np.ndarray, dedup: bool) -> tuple[np.ndarray, bool, bytes]:
    """A record's residue ids (a final ``*`` dropped), whether it is usable (an id, at least one
    residue, only amino acids) and, for a usable record when ``dedup``, its sequence's digest
    (upper case; ``b""`` otherwise)."""
    residues = seq.strip().encode("ascii", "replace")
    if residues.endswith(b"*"):
        residues = residues[:-1]
    ids = table[np.frombuffer(residues, dtype=np.uint8)]
    valid = bool(rec_id) and len(ids) > 0 and not (ids == 255).any()
    digest = hashlib.blake2b(residues.upper(), digest_size=8).digest() if valid and dedup else b""
    return ids, valid, digest
