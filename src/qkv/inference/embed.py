"""Protein embeddings at scale: a FASTA file streamed through a protein encoder into a directory
of safetensors shards that a killed run resumes.

What is computed (:class:`Embedder`): the hidden states after the chosen layers, numbered as
ESM's ``repr_layers`` (Rives et al. 2021; Lin et al. 2023, ESM-2): 0 = the embeddings that
enter the first layer, ``k`` = the output of layer ``k``, ``n_layers`` = the last layer after
the final norm (what :meth:`~qkv.models.encoder.EncoderModel.encode` returns); negative
indices count from the end (-1 = ``n_layers``). Per sequence: the mean over its residues
(specials and padding excluded) and, on request, one ``(L, D)`` tensor.

Long sequences (more residues than the model's width ``W = max_len - 2``): overlapping windows
of ``W`` residues with stride ``W // 2`` (the last window ends at the chain's end), and each
residue takes its vector from the window in which it sits most centrally (ties: the earlier
window). Every residue inside the chain is then embedded with at least about ``W / 4``
residues of context on each side, the most any window offers it; averaging the windows
instead would mix in vectors computed at a window's cut edge, with context on one side only.
A sequence that fits in one window is embedded as that one window.

The directory (:class:`EmbedJob`): ``shard-00000.safetensors``, ... hold ``shard_size``
sequences each, in input order; in each, the metadata ``ids`` (a JSON list, in row order), the
tensors ``mean/layer<k>`` ``(n, D)`` float32 and, with ``per_residue``, ``residues/layer<k>/<id>``
``(L, D)`` float32. ``manifest.json`` (rewritten atomically after each shard) records the
settings, the model's and the input's SHA-256 and the shards written: running the same job
again resumes at the next shard, and every shard has the same bytes as in an uninterrupted run
(its batches depend on its own sequences only; nothing in a file depends on time), on the same
machine, device and thread count.
"""

from __future__ import annotations

import array
import ctypes
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch

from ..cpu_share import CpuShare
from ..data.batching import pad_sequences, token_batches
from ..data.protein import fasta_entries, record_id
from ..data.sources import sha256sum
from ..errors import QkvError
from ..files import atomic_write, folder_obstacle, read_json, write_json
from ..models.encoder import EncoderModel

if TYPE_CHECKING:
    from ..data.tokenizers import AminoAcidTokenizer, PretrainedProteinTokenizer

    ProteinTokenizer = AminoAcidTokenizer | PretrainedProteinTokenizer

logger = logging.getLogger(__name__)


class ProteinEncoder(Protocol):
    """What the embedder reads of a :class:`~qkv.inference.protein.ProteinEncoder` (named
    structurally, so that class can delegate its ``embed`` here without an import cycle)."""

    model: EncoderModel
    tok: ProteinTokenizer
    device: torch.device
    width: int
    max_tokens: int


MANIFEST = "manifest.json"
FORMAT = "qkv-embeddings/1"
SHARD_SIZE = 10_000  # sequences per shard, mean vectors only
SHARD_SIZE_PER_RESIDUE = 1_000  # with per-residue tensors: a shard is held in memory whole

Progress = Callable[[int], object]  # called with the number of sequences just finished


class Window(NamedTuple):
    """One window of a chain: residues ``[start, stop)`` enter the model; the window's vectors
    are kept for residues ``[own_start, own_stop)`` (0-based residue indices of the chain)."""

    start: int
    stop: int
    own_start: int
    own_stop: int


def windows(length: int, width: int) -> list[Window]:
    """The windows that cover a chain of ``length`` residues for a model of ``width`` residues
    (rule in the module docstring): one window if it fits, else windows starting at 0,
    ``width // 2``, ``2 · (width // 2)``, ... and a last one ending at ``length``; each residue
    is owned by the window whose centre is nearest (the earlier one on a tie), so the owned
    ranges partition ``[0, length)``.

    Raises:
        ValueError: ``length`` or ``width`` below 1.
    """
    if length < 1 or width < 1:
        raise ValueError(f"length ({length}) and width ({width}) must be >= 1")
    if length <= width:
        return [Window(0, length, 0, length)]
    stride = max(width // 2, 1)
    starts = [*range(0, length - width, stride), length - width]
    # residue p belongs to window j while p <= the midpoint of the centres of windows j, j + 1
    cuts = [0, *((a + b + width + 1) // 2 for a, b in zip(starts, starts[1:], strict=False)), length]
    return [Window(s, s + width, cuts[j], cuts[j + 1]) for j, s in enumerate(starts)]


def resolve_layers(layers: str | Iterable[int], n_layers: int) -> tuple[int, ...]:
    """Layer indices as ESM's ``repr_layers`` (module docstring), made non-negative, sorted and
    unique; ``"all"`` is ``0 .. n_layers``.

    Raises:
        QkvError: an index outside ``-(n_layers + 1) .. n_layers``, or no index.
    """
    if isinstance(layers, str):
        if layers != "all":
            raise QkvError(f"layers: {layers!r} is not a list of layer indices or 'all'")
        return tuple(range(n_layers + 1))
    chosen = list(layers)
    bad = [k for k in chosen if not -(n_layers + 1) <= k <= n_layers]
    if bad:
        raise QkvError(
            f"layer {bad[0]} does not exist: this model has {n_layers} layers "
            f"(0 = embeddings, 1..{n_layers} = after each layer, negative counts from the end)"
        )
    if not chosen:
        raise QkvError("no layer chosen")
    return tuple(sorted({k % (n_layers + 1) for k in chosen}))


def encode_layers(
    model: EncoderModel, tokens: torch.Tensor, layers: Sequence[int]
) -> dict[int, torch.Tensor]:
    """Hidden states after each of ``layers`` (non-negative, as :func:`resolve_layers` gives
    them), read by forward hooks on ``model.layers`` during one :meth:`EncoderModel.encode`.

    Shape: ``tokens (B, T)`` long, right-padded with the model's ``pad_id`` →
    ``{k: (B, T, D)}`` in the model's dtype; layer ``n_layers`` is ``encode(tokens)[0]``.
    """
    n = len(model.layers)
    states: dict[int, torch.Tensor] = {}
    hooks = []
    for k in layers:
        if k == n:
            continue
        if k == 0:  # the input of the first layer
            hooks.append(
                model.layers[0].register_forward_pre_hook(lambda _m, args: states.__setitem__(0, args[0]))
            )
        else:  # layers return (x, attention weights)
            hooks.append(
                model.layers[k - 1].register_forward_hook(
                    lambda _m, _args, out, k=k: states.__setitem__(k, out[0])
                )
            )
    try:
        hidden, _, _ = model.encode(tokens)
    finally:
        for h in hooks:
            h.remove()
    if n in layers:
        states[n] = hidden
    return {k: states[k] for k in layers}


@dataclass
class ChunkPlan:
    """Token rows of a chunk of sequences and the batches they run in.

    Attributes:
        rows: token ids per row, ``[cls, residues of one window..., eos]``.
        pieces: per row, ``(index of its sequence, its Window)``.
        lengths: residues per sequence.
        batches: row indices per batch, sorted by length, each under ``max_tokens`` padded
            tokens (a longer single row runs alone).
    """

    rows: list[list[int]]
    pieces: list[tuple[int, Window]]
    lengths: list[int]
    batches: list[list[int]]

    def tokens(self, batch: list[int], pad_id: int) -> torch.Tensor:
        """``(B, T)`` long: the batch's rows, right-padded."""
        return pad_sequences([self.rows[i] for i in batch], pad_id)


def plan_chunk(
    tok: ProteinTokenizer, width: int, max_tokens: int, sequences: Sequence[str], ids: Sequence[str]
) -> ChunkPlan:
    """Rows and batches of ``sequences`` (tokenised by ``tok``, a protein tokenizer; windows
    by :func:`windows`), batched by :func:`~qkv.data.batching.token_batches` so that a batch
    holds at most ``max_tokens`` tokens, padding included.

    Raises:
        QkvError: an empty sequence or a character the tokenizer refuses (naming the id).
    """
    rows, pieces, lengths = [], [], []
    for i, (seq, sid) in enumerate(zip(sequences, ids, strict=True)):
        res = tok.encode(seq, sid, add_special_tokens=False)
        if not res:
            raise QkvError(f"{sid}: empty sequence")
        lengths.append(len(res))
        for w in windows(len(res), width):
            rows.append([tok.cls_id, *res[w.start : w.stop], tok.eos_id])
            pieces.append((i, w))
    # token_batches pads a batch to (longest length + 1) per row: the rows' lengths - 1 make it exact
    batches = token_batches([(len(r) - 1, 0) for r in rows], max_tokens, shuffle=False)
    return ChunkPlan(rows, pieces, lengths, batches)


class Pooler:
    """Joins the windows of a :class:`ChunkPlan` back into per-sequence results: the sum of
    each sequence's owned residue vectors per layer (``/ L`` = the mean) and, if
    ``per_residue``, its ``(L, D)`` vectors.

    Call :meth:`add` with each batch's states, then :meth:`tensors`.
    """

    def __init__(self, plan: ChunkPlan, layers: Sequence[int], d_model: int, per_residue: bool) -> None:
        self.plan, self.layers, self.per_residue = plan, tuple(layers), per_residue
        n = len(plan.lengths)
        self.sums = {k: torch.zeros(n, d_model) for k in self.layers}
        self.residues = (
            {k: [torch.empty(L, d_model) for L in plan.lengths] for k in self.layers} if per_residue else {}
        )
        self.left = [0] * n  # windows not yet added, per sequence
        for i, _ in plan.pieces:
            self.left[i] += 1

    def add(self, batch: list[int], states: dict[int, torch.Tensor]) -> int:
        """Add the states ``{k: (B, T, D)}`` of the rows ``batch``; returns how many sequences
        are now complete."""
        pieces = [self.plan.pieces[i] for i in batch]
        t = next(iter(states.values())).size(1)
        own = torch.zeros(len(batch), t)  # (B, T): 1 where the row's vector is kept
        for j, (_, w) in enumerate(pieces):
            own[j, 1 + w.own_start - w.start : 1 + w.own_stop - w.start] = 1
        seq = torch.tensor([i for i, _ in pieces])
        for k in self.layers:
            h = states[k].float()  # (B, T, D)
            sums = torch.einsum("btd,bt->bd", h, own.to(h.device)).cpu()  # (B, D)
            self.sums[k].index_add_(0, seq, sums)
            if self.per_residue:
                h = h.cpu()
                for j, (i, w) in enumerate(pieces):
                    self.residues[k][i][w.own_start : w.own_stop] = h[
                        j, 1 + w.own_start - w.start : 1 + w.own_stop - w.start
                    ]
        done = 0
        for i, _ in pieces:
            self.left[i] -= 1
            done += self.left[i] == 0
        return done

    def means(self) -> dict[int, torch.Tensor]:
        """``{k: (n, D)}`` float32: each sequence's mean residue vector at layer ``k``."""
        lengths = torch.tensor(self.plan.lengths, dtype=torch.float32)[:, None]  # (n, 1)
        return {k: (self.sums[k] / lengths).contiguous() for k in self.layers}

    def tensors(self, ids: Sequence[str]) -> dict[str, torch.Tensor]:
        """``mean/layer<k>`` ``(n, D)`` and, if ``per_residue``, ``residues/layer<k>/<id>``
        ``(L, D)``: float32, contiguous."""
        out = {f"mean/layer{k}": m for k, m in self.means().items()}
        for k, per_seq in self.residues.items():
            out.update({f"residues/layer{k}/{sid}": r for sid, r in zip(ids, per_seq, strict=True)})
        return out


class Embedder:
    """A :class:`~qkv.inference.protein.ProteinEncoder` read at ``layers`` (ESM's
    ``repr_layers`` numbering, see :func:`resolve_layers`; default the last), with windows as
    the module docstring says, in length-sorted batches of at most ``max_tokens`` padded tokens
    (default the encoder's). ``cpu``: the caller's :class:`~qkv.cpu_share.CpuShare` (an entry
    point's), ticked between batches; ``None``: torch's thread count is left as the calling
    program set it.

    Raises:
        QkvError: a layer the model does not have, or ``max_tokens`` below 1.
    """

    def __init__(
        self,
        encoder: ProteinEncoder,
        layers: str | Iterable[int] = (-1,),
        per_residue: bool = False,
        max_tokens: int | None = None,
        cpu: CpuShare | None = None,
    ) -> None:
        self.encoder, self.per_residue, self.cpu = encoder, per_residue, cpu
        self.model: EncoderModel = encoder.model
        self.layers = resolve_layers(layers, len(self.model.layers))
        self.max_tokens = encoder.max_tokens if max_tokens is None else max_tokens
        if self.max_tokens < 1:
            raise QkvError(f"max_tokens ({self.max_tokens}) must be >= 1")

    @property
    def d_model(self) -> int:
        return self.model.config.d_model

    def plan(self, sequences: Sequence[str], ids: Sequence[str]) -> ChunkPlan:
        """:func:`plan_chunk` with this encoder's tokenizer, width and ``max_tokens``."""
        return plan_chunk(self.encoder.tok, self.encoder.width, self.max_tokens, sequences, ids)

    def embed(
        self, sequences: Sequence[str], ids: Sequence[str], progress: Progress | None = None
    ) -> dict[str, torch.Tensor]:
        """The tensors of one shard (names and shapes in the module docstring) for
        ``sequences`` named ``ids``; ``progress`` is called after each batch with the number
        of sequences it completed.

        Raises:
            QkvError: an empty sequence or a character the tokenizer refuses.
        """
        return self.pool(sequences, ids, progress).tensors(ids)

    @torch.inference_mode()
    def pool(self, sequences: Sequence[str], ids: Sequence[str], progress: Progress | None = None) -> Pooler:
        """:meth:`embed`'s results before they are named: a :class:`Pooler` holding every batch
        (``ids`` name sequences in error messages only)."""
        plan = self.plan(sequences, ids)
        pool = Pooler(plan, self.layers, self.d_model, self.per_residue)
        for batch in plan.batches:
            tokens = plan.tokens(batch, self.encoder.tok.pad_id).to(self.encoder.device)
            done = pool.add(batch, encode_layers(self.model, tokens, self.layers))
            _return_freed_memory()
            if self.cpu is not None:
                self.cpu.tick(1)
            if progress is not None:
                progress(done)
        return pool


@dataclass(frozen=True)
class FastaScan:
    """What a first pass over a FASTA file found: ``sequences`` (records) and the file's
    ``sha256``."""

    sequences: int
    sha256: str


def scan_fasta(path: str | Path, tok: ProteinTokenizer) -> FastaScan:
    """Check every record of a FASTA file before anything is embedded: a header with an id,
    unique ids, a sequence that is not empty and that ``tok`` can encode. Memory: 8 bytes per
    record (a hash of its id), nothing else kept.

    Raises:
        QkvError: what :func:`~qkv.data.protein.fasta_entries` raises, no records, an empty
            header or sequence, a duplicate id, or a bad character (the tokenizer's message:
            id, position, character).
    """
    path = Path(path)
    allowed = _encodable_letters(tok)
    hashes = array.array("q")
    for title, text, _ in fasta_entries(path):
        sid = record_id(title)
        if not sid:
            raise QkvError(f"{path}: a record has an empty header")
        residues = text.strip().upper().removesuffix("*")
        if not residues:
            raise QkvError(f"{path}: record {sid} has an empty sequence")
        if not set(residues) <= allowed:
            tok.encode(text, f"{path.name}: {sid}")  # raises, naming the position and character
            raise QkvError(f"{path}: record {sid} holds characters the model's tokenizer refuses")
        hashes.append(hash(sid))
    if not hashes:
        raise QkvError(f"{path}: no FASTA records found (is it a FASTA file?)")
    _refuse_duplicates(path, np.frombuffer(hashes, dtype=np.int64))
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return FastaScan(len(hashes), digest.hexdigest())


def _encodable_letters(tok: ProteinTokenizer) -> set[str]:
    """The upper-case letters ``tok`` encodes (a letter its vocabulary lacks, with no unknown
    token, is refused by it)."""
    letters = set()
    for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ":
        try:
            tok.encode(c, add_special_tokens=False)
        except QkvError:
            continue
        letters.add(c)
    return letters


def _refuse_duplicates(path: Path, hashes: np.ndarray) -> None:
    """Raise for a duplicate id; equal hashes are confirmed on the ids themselves."""
    values, counts = np.unique(hashes, return_counts=True)
    clashing = set(values[counts > 1].tolist())
    if not clashing:
        return
    seen: set[str] = set()
    for title, _, _ in fasta_entries(path):
        sid = record_id(title)
        if hash(sid) in clashing:
            if sid in seen:
                raise QkvError(
                    f"{path}: duplicate record id {sid!r} (ids must be unique so results can be matched back)"
                )
            seen.add(sid)


# the parts of a TransformerStack that encode() runs; heads (masked LM, classification) are left
# out: a converted checkpoint without them gets them randomly initialised on every load
ENCODER_PARTS = ("embed", "positional", "token_type", "embed_norm", "layers", "final_norm")


def model_sha256(model: torch.nn.Module) -> str:
    """SHA-256 of the weights that make a model's embeddings (its :data:`ENCODER_PARTS`: names,
    dtypes, shapes and bytes, in name order): the same weights give the same digest wherever
    they were loaded from."""
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(n for n in state if n.split(".", 1)[0] in ENCODER_PARTS):
        t = state[name].detach()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _records(path: Path, skip: int) -> Iterator[tuple[str, str]]:
    """``(id, sequence text)`` of each record after the first ``skip``."""
    for n, (title, text, _) in enumerate(fasta_entries(path)):
        if n >= skip:
            yield record_id(title), text


def _chunks(records: Iterator[tuple[str, str]], size: int) -> Iterator[list[tuple[str, str]]]:
    chunk: list[tuple[str, str]] = []
    for rec in records:
        chunk.append(rec)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


class EmbedJob:
    """Embeddings of a FASTA file into the directory ``out`` (format in the module docstring).

    :meth:`open` checks everything and writes nothing; :meth:`run` writes. A directory that
    holds this job's manifest (same model weights, input bytes and settings) is resumed at its
    next shard; a finished one is left as it is.

    Raises (:meth:`open`):
        QkvError: what :func:`scan_fasta` raises; ``shard_size`` below 1; ``out`` is a file, a
            directory with other files and no manifest, or holds the manifest of another job
            (the differing settings named), or lacks a shard its manifest lists.
    """

    def __init__(self, embedder: Embedder, fasta: Path, out: Path, shard_size: int, manifest: dict) -> None:
        self.embedder, self.fasta, self.out, self.shard_size = embedder, fasta, out, shard_size
        self.manifest = manifest

    @classmethod
    def open(
        cls, embedder: Embedder, fasta: str | Path, out: str | Path, shard_size: int | None = None
    ) -> EmbedJob:
        fasta, out = Path(fasta), Path(out)
        if shard_size is None:
            shard_size = SHARD_SIZE_PER_RESIDUE if embedder.per_residue else SHARD_SIZE
        if shard_size < 1:
            raise QkvError(f"shard size ({shard_size}) must be >= 1")
        if out.exists() and not out.is_dir():
            raise QkvError(f"{out} is a file; the embeddings go into a directory")
        scan = scan_fasta(fasta, embedder.encoder.tok)
        width = embedder.encoder.width
        dtype = next(embedder.model.parameters()).dtype
        settings = {
            "model_sha256": model_sha256(embedder.model),
            "input_sha256": scan.sha256,
            "sequences": scan.sequences,
            "layers": list(embedder.layers),
            "per_residue": embedder.per_residue,
            "max_tokens": embedder.max_tokens,
            "shard_size": shard_size,
            "windows": {"width": width, "stride": max(width // 2, 1), "rule": "centre-most"},
            "device": embedder.encoder.device.type,
            "dtype": str(dtype).removeprefix("torch."),
        }
        manifest = {
            "format": FORMAT,
            "settings": settings,
            "d_model": embedder.d_model,
            "shards": [],
            "complete": False,
        }
        found = _read_manifest(out)
        if found is not None:
            differ = [k for k in settings if found.get("settings", {}).get(k) != settings[k]]
            if found.get("format") != FORMAT or differ:
                raise QkvError(
                    f"{out} holds embeddings made with another {', '.join(differ) or 'format'}; "
                    "give another --out (or remove it) to start afresh"
                )
            manifest = _keep_intact_shards(out, found)
        elif folder_obstacle(out)[0] == "not empty":
            raise QkvError(f"{out} is not empty and holds no {MANIFEST}; give a new or empty directory")
        return cls(embedder, fasta, out, shard_size, manifest)

    @property
    def total(self) -> int:
        """Sequences in the input."""
        return self.manifest["settings"]["sequences"]

    @property
    def done(self) -> int:
        """Sequences already in shards."""
        return sum(s["sequences"] for s in self.manifest["shards"])

    def run(self, progress: Progress | None = None) -> dict:
        """Embed the sequences not yet in shards, writing each shard, then the manifest
        (atomically); returns the manifest. ``progress`` is called after each batch with the
        number of sequences it completed."""
        if self.manifest["complete"]:
            logger.info("%s already holds all %d embeddings", self.out, self.total)
            return self.manifest
        first = len(self.manifest["shards"])
        if first:
            logger.info("resuming at shard %d (%d of %d sequences done)", first, self.done, self.total)
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / MANIFEST, self.manifest)
        for index, chunk in enumerate(_chunks(_records(self.fasta, self.done), self.shard_size), first):
            ids = [sid for sid, _ in chunk]
            tensors = self.embedder.embed([text for _, text in chunk], ids, progress)
            _save_shard(self.out / _shard_name(index), tensors, ids)
            digest = sha256sum(self.out / _shard_name(index))
            self.manifest["shards"].append(
                {"file": _shard_name(index), "sequences": len(ids), "sha256": digest}
            )
            self.manifest["complete"] = self.done == self.total
            write_json(self.out / MANIFEST, self.manifest)
        return self.manifest


def _keep_intact_shards(out: Path, manifest: dict) -> dict:
    """``manifest`` with its shards up to the first one that is missing, or whose bytes are not
    those written (its sha256; a manifest of an older qkv has none, and its shards count as
    written): that shard and the ones after it are embedded again, with the same bytes."""
    shards = manifest["shards"]
    for i, shard in enumerate(shards):
        path = out / shard["file"]
        want = shard.get("sha256")
        if path.is_file() and (want is None or want == sha256sum(path)):
            continue
        logger.warning(
            f"{path} is {'changed or truncated' if path.is_file() else 'missing'}: embedding it and the "
            f"{len(shards) - i - 1} shard(s) after it again"
        )
        return {**manifest, "shards": shards[:i], "complete": False}
    return manifest


def _return_freed_memory() -> None:
    """Hand the pages the allocator holds free back to the system, after each batch. glibc keeps
    them (every batch's activations have another shape, and its heap fragments), so without this
    a run's resident memory grew with the number of batches, by half over 300,000 peptides,
    though nothing is kept; with it, it stays flat. Elsewhere than glibc: nothing to do."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _save_shard(path: Path, tensors: dict[str, torch.Tensor], ids: list[str]) -> None:
    from safetensors.torch import save_file

    # one metadata key: safetensors writes several in a per-process random order, which
    # would make the same shard's bytes differ between runs
    metadata = {"ids": json.dumps(ids, ensure_ascii=False)}
    atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def _read_manifest(out: Path) -> dict | None:
    path = out / MANIFEST
    return read_json(path, "qkv embeddings manifest") if path.is_file() else None


def read_embeddings(out: str | Path, layer: int | None = None) -> tuple[list[str], np.ndarray]:
    """The ids and mean embeddings ``(N, D)`` float32 of an embeddings directory written by
    :class:`EmbedJob`, in input order, at ``layer`` (a layer it holds, as numbered in its
    manifest; default the last one it holds). An unfinished directory gives the shards written.

    Raises:
        QkvError: no manifest, a layer the directory does not hold, or a missing or corrupt
            shard.
    """
    out = Path(out)
    manifest = _read_manifest(out)
    if manifest is None or manifest.get("format") != FORMAT:
        raise QkvError(f"{out} holds no qkv embeddings ({MANIFEST} missing or of another format)")
    held = manifest["settings"]["layers"]
    layer = held[-1] if layer is None else layer
    if layer not in held:
        raise QkvError(f"{out} holds layers {held}, not layer {layer}")
    ids: list[str] = []
    parts = []
    for shard in manifest["shards"]:
        shard_ids, mean = _read_shard(out / shard["file"], f"mean/layer{layer}")
        ids += shard_ids
        parts.append(mean.numpy())
    d = manifest["d_model"]
    return ids, np.concatenate(parts) if parts else np.zeros((0, d), dtype=np.float32)


def _read_shard(path: Path, name: str) -> tuple[list[str], torch.Tensor]:
    """A shard's ids and its tensor ``name`` (the rest is not read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return json.loads(f.metadata()["ids"]), f.get_tensor(name)
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:
        raise QkvError(
            f"cannot read {path}: missing, truncated or corrupt ({str(exc).splitlines()[0][:200]})"
        ) from None
