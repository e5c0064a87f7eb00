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
machine, device and thread count. :func:`read_embeddings` reads the means, and with
``per_residue=True`` the per-residue tensors (:class:`ResidueEmbeddings`, one shard read at a
time).

A sequence's id is its whole FASTA header line, stripped, as fair-esm's ``FastaBatchedDataset``
keeps it (its label). A directory begun by a qkv that cut ids at the first space (its manifest
has no ``ids`` entry) is resumed with that rule, so its shards stay of one kind.

fair-esm's files (:class:`EsmJob`, ``qkv embed --format esm``): what fair-esm 2.0's
``scripts/extract.py`` writes, one ``<label>.pt`` per sequence (a ``/`` in a label makes
folders, as there), a dict with ``label`` and, as ``include`` asks, ``representations``
(``{layer: (L, D)}``), ``mean_representations`` (``{layer: (D,)}``), ``bos_representations``
(``{layer: (D,)}``, the ``<cls>`` token's) and ``contacts`` ``(L, L)``; float32, each tensor its
own storage, read with ``torch.load(path, weights_only=True)``. As there, a sequence longer
than the model (ESM-2: 1,022 residues, extract.py's ``--truncation_seq_length``) is cut to its
first residues, not windowed.
"""

from __future__ import annotations

import array
import ctypes
import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, overload

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
ESM_FORMAT = "fair-esm-extract/1"  # EsmJob's directory: extract.py's <label>.pt files
# what extract.py's --include may ask for, in the order its dicts hold them
ESM_INCLUDE = ("per_tok", "mean", "bos", "contacts")

SHARD_SIZE = 10_000  # sequences per shard, mean vectors only
SHARD_SIZE_PER_RESIDUE = 1_000  # with per-residue tensors: a shard is held in memory whole

Progress = Callable[[int], object]  # called with the number of sequences just finished


def fasta_label(header: str) -> str:
    """A FASTA record's id: its whole header line, stripped, as fair-esm's
    ``FastaBatchedDataset.from_file`` keeps it (``line[1:].strip()``)."""
    return header.strip()


# a record's id by a directory's manifest "ids" (absent: a qkv that cut ids at the first space)
ID_RULES: dict[str, Callable[[str], str]] = {"header": fasta_label, "first word": record_id}


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

    Call :meth:`add` with each batch's states, then :meth:`tensors`. ``bos``: also keep the
    ``<cls>`` token's vector ``(n, D)`` per layer (of each sequence's first window), as
    extract.py's ``bos_representations``.
    """

    def __init__(
        self, plan: ChunkPlan, layers: Sequence[int], d_model: int, per_residue: bool, bos: bool = False
    ) -> None:
        self.plan, self.layers, self.per_residue = plan, tuple(layers), per_residue
        n = len(plan.lengths)
        self.sums = {k: torch.zeros(n, d_model) for k in self.layers}
        self.residues = (
            {k: [torch.empty(L, d_model) for L in plan.lengths] for k in self.layers} if per_residue else {}
        )
        self.bos = {k: torch.zeros(n, d_model) for k in self.layers} if bos else {}
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
            for j, (i, w) in enumerate(pieces if self.bos else ()):
                if w.start == 0:  # the sequence's first window holds its <cls>
                    self.bos[k][i] = h[j, 0].cpu()
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
    program set it. ``bos``: the :class:`Pooler` keeps the ``<cls>`` vectors too.

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
        bos: bool = False,
    ) -> None:
        self.encoder, self.per_residue, self.cpu, self.bos = encoder, per_residue, cpu, bos
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
        pool = Pooler(plan, self.layers, self.d_model, self.per_residue, self.bos)
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
    """What a first pass over a FASTA file found: ``sequences`` (records), the file's
    ``sha256`` and the ``longest`` sequence's residues."""

    sequences: int
    sha256: str
    longest: int = 0


def _residues(text: str) -> str:
    """A record's residues as the tokenizers read them: upper case, one trailing ``*`` off."""
    return text.strip().upper().removesuffix("*")


def scan_fasta(
    path: str | Path,
    tok: ProteinTokenizer,
    id_of: Callable[[str], str] = fasta_label,
    check_id: Callable[[str], object] | None = None,
) -> FastaScan:
    """Check every record of a FASTA file before anything is embedded: a header with an id
    (``id_of`` the header: by default the whole line), unique ids, a sequence that is not empty
    and that ``tok`` can encode, and whatever ``check_id`` (called with each id) raises.
    Memory: 8 bytes per record (a hash of its id), nothing else kept.

    Raises:
        QkvError: what :func:`~qkv.data.protein.fasta_entries` raises, no records, an empty
            header or sequence, a duplicate id, a bad character (the tokenizer's message:
            id, position, character), or what ``check_id`` raises.
    """
    path = Path(path)
    allowed = _encodable_letters(tok)
    hashes = array.array("q")
    longest = 0
    for title, text, _ in fasta_entries(path):
        sid = id_of(title)
        if not sid:
            raise QkvError(f"{path}: a record has an empty header")
        residues = _residues(text)
        if not residues:
            raise QkvError(f"{path}: record {sid} has an empty sequence")
        if not set(residues) <= allowed:
            tok.encode(text, f"{path.name}: {sid}")  # raises, naming the position and character
            raise QkvError(f"{path}: record {sid} holds characters the model's tokenizer refuses")
        if check_id is not None:
            check_id(sid)
        hashes.append(hash(sid))
        longest = max(longest, len(residues))
    if not hashes:
        raise QkvError(f"{path}: no FASTA records found (is it a FASTA file?)")
    _refuse_duplicates(path, np.frombuffer(hashes, dtype=np.int64), id_of)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return FastaScan(len(hashes), digest.hexdigest(), longest)


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


def _refuse_duplicates(path: Path, hashes: np.ndarray, id_of: Callable[[str], str]) -> None:
    """Raise for a duplicate id (``id_of`` a header); equal hashes are confirmed on the ids
    themselves."""
    values, counts = np.unique(hashes, return_counts=True)
    clashing = set(values[counts > 1].tolist())
    if not clashing:
        return
    seen: set[str] = set()
    for title, _, _ in fasta_entries(path):
        sid = id_of(title)
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


def _records(path: Path, skip: int, id_of: Callable[[str], str] = fasta_label) -> Iterator[tuple[str, str]]:
    """``(id, sequence text)`` of each record after the first ``skip`` (``id_of`` a header)."""
    for n, (title, text, _) in enumerate(fasta_entries(path)):
        if n >= skip:
            yield id_of(title), text


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


class _Job:
    """What the two output formats' jobs share: a manifest whose ``settings`` count the input's
    sequences and whose ``shards`` (safetensors shards, or chunks of ``.pt`` files) count those
    written."""

    manifest: dict

    @property
    def total(self) -> int:
        """Sequences in the input."""
        return self.manifest["settings"]["sequences"]

    @property
    def done(self) -> int:
        """Sequences already written (in shards, or in the files of a recorded chunk)."""
        return sum(s["sequences"] for s in self.manifest["shards"])


class EmbedJob(_Job):
    """Embeddings of a FASTA file into the directory ``out`` (format in the module docstring).

    :meth:`open` checks everything and writes nothing; :meth:`run` writes. A directory that
    holds this job's manifest (same model weights, input bytes and settings) is resumed at its
    next shard; a finished one is left as it is.

    Raises (:meth:`open`):
        QkvError: what :func:`scan_fasta` raises; ``shard_size`` below 1; ``out`` is a file, a
            directory with other files and no manifest, or holds the manifest of another job
            (the differing settings named), or lacks a shard its manifest lists.
    """

    def __init__(
        self,
        embedder: Embedder,
        fasta: Path,
        out: Path,
        shard_size: int,
        manifest: dict,
        id_of: Callable[[str], str] = fasta_label,
    ) -> None:
        self.embedder, self.fasta, self.out, self.shard_size = embedder, fasta, out, shard_size
        self.manifest, self.id_of = manifest, id_of

    @classmethod
    def open(
        cls, embedder: Embedder, fasta: str | Path, out: str | Path, shard_size: int | None = None
    ) -> EmbedJob:
        fasta, out = Path(fasta), Path(out)
        if shard_size is None:
            shard_size = SHARD_SIZE_PER_RESIDUE if embedder.per_residue else SHARD_SIZE
        found = _manifest_in(out, shard_size)
        ids = "header"
        if found is not None and found.get("format") == FORMAT:  # begun with ids cut at a space: go on so
            ids = found.get("ids", "first word")
        scan = scan_fasta(fasta, embedder.encoder.tok, ID_RULES[ids])
        manifest = {
            "format": FORMAT,
            "ids": ids,
            "settings": _job_settings(embedder, scan, shard_size),
            "d_model": embedder.d_model,
            "shards": [],
            "complete": False,
        }
        resumed = _same_job(out, found, manifest)
        if resumed is not None:
            manifest = _keep_intact_shards(out, resumed)
        return cls(embedder, fasta, out, shard_size, manifest, ID_RULES[ids])

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
        records = _records(self.fasta, self.done, self.id_of)
        for index, chunk in enumerate(_chunks(records, self.shard_size), first):
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


class EsmJob(_Job):
    """fair-esm ``extract.py``'s files of a FASTA file in the directory ``out`` (format in the
    module docstring; ``manifest.json`` beside them), for ``include`` (a subset of
    :data:`ESM_INCLUDE`, as extract.py's ``--include``). ``contacts``: ``(sequence, label) ->
    (L, L)`` contact probabilities (``"contacts"`` in ``include`` needs it). ``embedder`` gives
    the model, layers and batch size; what it keeps follows ``include``.

    :meth:`open` checks everything and writes nothing; :meth:`run` writes, ``chunk_size``
    sequences at a time (a chunk is held in memory whole). The same job again resumes: a chunk
    whose files are all there is skipped, as extract.py skips such a batch.

    Raises (:meth:`open`):
        QkvError: what :func:`scan_fasta` and :func:`esm_file` raise (a label that names no file
            inside ``out``), ``include`` empty or outside :data:`ESM_INCLUDE`, ``chunk_size``
            below 1, ``out`` a file, a directory with other files and no manifest, or another
            job's.
        ValueError: ``contacts`` given without ``"contacts"`` in ``include``, or missing with it.
    """

    def __init__(
        self,
        embedder: Embedder,
        fasta: Path,
        out: Path,
        chunk_size: int,
        manifest: dict,
        contacts: Callable[[str, str], torch.Tensor] | None = None,
    ) -> None:
        self.embedder, self.fasta, self.out, self.chunk_size = embedder, fasta, out, chunk_size
        self.manifest, self.contacts = manifest, contacts
        self.include = tuple(manifest["settings"]["include"])

    @classmethod
    def open(
        cls,
        embedder: Embedder,
        fasta: str | Path,
        out: str | Path,
        include: Iterable[str] = ("mean",),
        contacts: Callable[[str, str], torch.Tensor] | None = None,
        chunk_size: int | None = None,
    ) -> EsmJob:
        fasta, out, asked = Path(fasta), Path(out), set(include)
        if not asked or not asked <= set(ESM_INCLUDE):
            raise QkvError(f"include: {sorted(asked)} is not a choice of {', '.join(ESM_INCLUDE)}")
        if ("contacts" in asked) != (contacts is not None):
            raise ValueError("contacts: give the contact predictor when, and only when, including contacts")
        per_tok = "per_tok" in asked
        embedder = Embedder(
            embedder.encoder, embedder.layers, per_tok, embedder.max_tokens, embedder.cpu, "bos" in asked
        )
        if chunk_size is None:
            chunk_size = SHARD_SIZE_PER_RESIDUE if per_tok else SHARD_SIZE
        found = _manifest_in(out, chunk_size)
        scan = scan_fasta(fasta, embedder.encoder.tok, check_id=lambda label: esm_file(out, label))
        settings = _job_settings(embedder, scan, chunk_size)
        del settings["windows"]  # none: a long sequence is cut as extract.py cuts it
        settings.update(include=[k for k in ESM_INCLUDE if k in asked], truncation=embedder.encoder.width)
        manifest = {
            "format": ESM_FORMAT,
            "ids": "header",
            "settings": settings,
            "d_model": embedder.d_model,
            "shards": [],
            "complete": False,
        }
        manifest = _same_job(out, found, manifest) or manifest
        if scan.longest > embedder.encoder.width:
            logger.warning(
                "%s: sequences longer than %d residues are cut to their first %d, as extract.py "
                "cuts them (--truncation_seq_length); the default format reads them whole in windows",
                fasta,
                embedder.encoder.width,
                embedder.encoder.width,
            )
        return cls(embedder, fasta, out, chunk_size, manifest, contacts)

    def run(self, progress: Progress | None = None) -> dict:
        """Write the files of every chunk not yet written whole (a chunk the manifest records
        whose files are all there is skipped), then the manifest (atomically); returns it.
        ``progress``: called after each batch of a chunk not yet recorded, with the number of
        sequences it completed."""
        chunks = self.manifest["shards"]  # {"sequences": n} per chunk written
        if not chunks:  # the manifest first: a killed first chunk leaves a directory that resumes
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / MANIFEST, self.manifest)
        for index, chunk in enumerate(_chunks(_records(self.fasta, 0), self.chunk_size)):
            if index < len(chunks) and all(esm_file(self.out, label).is_file() for label, _ in chunk):
                continue
            self._write(chunk, progress if index >= len(chunks) else None)
            chunks[index : index + 1] = [{"sequences": len(chunk)}]
            self.manifest["complete"] = self.done == self.total
            write_json(self.out / MANIFEST, self.manifest)
        return self.manifest

    def _write(self, chunk: list[tuple[str, str]], progress: Progress | None) -> None:
        """Embed one chunk of ``(label, sequence text)`` and write its files."""
        labels = [label for label, _ in chunk]
        texts = [_residues(text)[: self.embedder.encoder.width] for _, text in chunk]
        pool = self.embedder.pool(texts, labels, progress)
        means = pool.means()
        for i, (label, text) in enumerate(zip(labels, texts, strict=True)):
            result = esm_result(pool, means, i, label, self.include)
            if self.contacts is not None:
                with torch.inference_mode():
                    result["contacts"] = self.contacts(text, label).to(torch.float32).cpu().clone()
            atomic_write(esm_file(self.out, label), functools.partial(torch.save, result))


def esm_result(
    pool: Pooler, means: dict[int, torch.Tensor], i: int, label: str, include: Sequence[str]
) -> dict[str, object]:
    """The dict extract.py saves for sequence ``i`` of ``pool`` (its ``means``): ``label`` and,
    as ``include`` asks, ``representations`` ``{layer: (L, D)}``, ``mean_representations`` and
    ``bos_representations`` ``{layer: (D,)}``, float32, each tensor cloned out of the batch's
    storage as extract.py clones it (``contacts`` is the caller's)."""
    result: dict[str, object] = {"label": label}
    parts: dict[str, tuple[str, dict[int, Any]]] = {
        "per_tok": ("representations", pool.residues),
        "mean": ("mean_representations", means),
        "bos": ("bos_representations", pool.bos),
    }
    for key, (name, per_layer) in parts.items():
        if key in include:
            result[name] = {k: per_layer[k][i].clone() for k in pool.layers}
    return result


def esm_file(out: str | Path, label: str) -> Path:
    """Where extract.py writes the file of ``label``: ``out/<label>.pt`` (a ``/`` in the label
    makes folders, as there).

    Raises:
        QkvError: a label that names no file inside ``out`` (an empty, ``.`` or ``..`` part
            between slashes, or a leading ``/``), or a part longer than a file name may be
            (255 bytes).
    """
    parts = f"{label}.pt".split("/")
    if any(part in ("", ".", "..") for part in parts[:-1]):
        raise QkvError(
            f"record {label!r}: its file {label}.pt would not be inside the output folder; "
            "rename the record (extract.py names each file by the whole header line)"
        )
    if max(len(part.encode()) for part in parts) > 255:
        raise QkvError(
            f"record {label[:60]!r}...: its file name is longer than 255 bytes; shorten the header "
            "(extract.py names each file by the whole header line)"
        )
    return Path(out, *parts)


def _manifest_in(out: Path, shard_size: int) -> dict | None:
    """The manifest in ``out`` (``None``: none there), once ``out`` and ``shard_size`` are
    checked to be usable.

    Raises:
        QkvError: ``shard_size`` below 1, or ``out`` is a file.
    """
    if shard_size < 1:
        raise QkvError(f"shard size ({shard_size}) must be >= 1")
    if out.exists() and not out.is_dir():
        raise QkvError(f"{out} is a file; the embeddings go into a directory")
    return _read_manifest(out)


def _same_job(out: Path, found: dict | None, manifest: dict) -> dict | None:
    """``found`` (the manifest in ``out``) when it is of the job ``manifest`` describes (same
    format and settings), to resume; ``None`` when ``out`` is new or empty.

    Raises:
        QkvError: another job's manifest (the differing settings named), or files and no manifest.
    """
    if found is None:
        if folder_obstacle(out)[0] == "not empty":
            raise QkvError(f"{out} is not empty and holds no {MANIFEST}; give a new or empty directory")
        return None
    settings = manifest["settings"]
    differ = [k for k in settings if found.get("settings", {}).get(k) != settings[k]]
    if found.get("format") != manifest["format"] or differ:
        raise QkvError(
            f"{out} holds embeddings made with another {', '.join(differ) or 'format'}; "
            "give another --out (or remove it) to start afresh"
        )
    return found


def _job_settings(embedder: Embedder, scan: FastaScan, shard_size: int) -> dict:
    """What a manifest records of a job, compared on resume."""
    width = embedder.encoder.width
    dtype = next(embedder.model.parameters()).dtype
    return {
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


@overload
def read_embeddings(
    out: str | Path, layer: int | None = None, per_residue: Literal[False] = False
) -> tuple[list[str], np.ndarray]: ...


@overload
def read_embeddings(
    out: str | Path, layer: int | None = None, *, per_residue: Literal[True]
) -> tuple[list[str], ResidueEmbeddings]: ...


def read_embeddings(
    out: str | Path, layer: int | None = None, per_residue: bool = False
) -> tuple[list[str], np.ndarray] | tuple[list[str], ResidueEmbeddings]:
    """The ids and mean embeddings ``(N, D)`` float32 of an embeddings directory written by
    :class:`EmbedJob`, in input order, at ``layer`` (a layer it holds, as numbered in its
    manifest; default the last one it holds). An unfinished directory gives the shards written.
    ``per_residue=True``: the ids and the per-residue embeddings instead, a
    :class:`ResidueEmbeddings` (a list-like of ``(L, D)`` float32 arrays, read from the shards
    as they are asked for) of a directory made with ``per_residue``.

    An id is the record's whole header line (the first word in a directory begun by a qkv that
    cut it there).

    Raises:
        QkvError: no manifest (or fair-esm files, read with ``torch.load``), a layer the
            directory does not hold, no per-residue tensors, or a missing or corrupt shard.
    """
    out = Path(out)
    manifest = _read_manifest(out)
    if manifest is not None and manifest.get("format") == ESM_FORMAT:
        raise QkvError(
            f"{out} holds fair-esm extract.py files: read each <label>.pt with "
            "torch.load(path, weights_only=True)"
        )
    if manifest is None or manifest.get("format") != FORMAT:
        raise QkvError(f"{out} holds no qkv embeddings ({MANIFEST} missing or of another format)")
    held = manifest["settings"]["layers"]
    layer = held[-1] if layer is None else layer
    if layer not in held:
        raise QkvError(f"{out} holds layers {held}, not layer {layer}")
    if per_residue:
        if not manifest["settings"]["per_residue"]:
            raise QkvError(f"{out} holds mean embeddings only: embed again with --per-residue")
        residues = ResidueEmbeddings(out, layer, [shard["file"] for shard in manifest["shards"]])
        return residues.ids, residues
    ids: list[str] = []
    parts = []
    for shard in manifest["shards"]:
        with _open_shard(out / shard["file"]) as f:
            ids += json.loads(f.metadata()["ids"])
            parts.append(f.get_tensor(f"mean/layer{layer}").numpy())
    d = manifest["d_model"]
    return ids, np.concatenate(parts) if parts else np.zeros((0, d), dtype=np.float32)


class ResidueEmbeddings:
    """The per-residue embeddings of an embeddings directory (:class:`EmbedJob` with
    ``per_residue``) at one layer, a list-like read from the shards as it is asked for:
    ``len()``, ``[i]`` (negative from the end) or ``[id]`` → ``(L, D)`` float32 array, and
    iteration in input order (each shard opened once). ``ids``: in input order, each item's
    own. Made by :func:`read_embeddings` with ``per_residue=True``.

    Raises:
        QkvError: a missing or corrupt shard (on making it, or on reading a tensor).
    """

    def __init__(self, out: str | Path, layer: int, files: Sequence[str]) -> None:
        self.out, self.layer = Path(out), layer
        self.shards: list[tuple[str, list[str]]] = []
        for file in files:
            with _open_shard(self.out / file) as f:
                self.shards.append((file, json.loads(f.metadata()["ids"])))
        self.ids = [sid for _, ids in self.shards for sid in ids]
        self._file = [file for file, ids in self.shards for _ in ids]
        self._index = {sid: i for i, sid in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, key: int | str) -> np.ndarray:
        """The ``(L, D)`` float32 array of item ``key`` (an index or an id).

        Raises:
            IndexError, KeyError: no such item.
        """
        i = self._index[key] if isinstance(key, str) else range(len(self))[key]
        with _open_shard(self.out / self._file[i]) as f:
            return f.get_tensor(self._name(self.ids[i])).numpy()

    def __iter__(self) -> Iterator[np.ndarray]:
        for file, ids in self.shards:
            with _open_shard(self.out / file) as f:
                for sid in ids:
                    yield f.get_tensor(self._name(sid)).numpy()

    def _name(self, sid: str) -> str:
        return f"residues/layer{self.layer}/{sid}"


@contextmanager
def _open_shard(path: Path) -> Iterator:
    """A shard opened with ``safetensors.safe_open`` (a tensor is read when asked for).

    Raises:
        QkvError: a missing, truncated or corrupt shard, or one without a tensor asked for.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as f:
            yield f
    except (SafetensorError, OSError, ValueError, KeyError, TypeError) as exc:
        raise QkvError(
            f"cannot read {path}: missing, truncated or corrupt ({str(exc).splitlines()[0][:200]})"
        ) from None
