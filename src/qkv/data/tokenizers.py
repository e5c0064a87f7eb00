"""Subword tokenizers built on HF ``tokenizers`` (BPE; Sennrich et al. 2016).

The paper (§5.1) uses byte-pair encoding with a shared source-target vocabulary. qkv trains one
on the training split and saves it beside the model as ``tokenizer.json``.

Five tokenizers share one interface, :class:`Tokenizer`: :class:`SubwordTokenizer` (qkv's BPE),
:class:`CharTokenizer`, :class:`HFTokenizer` (a pretrained model's own), :class:`AminoAcidTokenizer`
and :class:`PretrainedProteinTokenizer`. :func:`load_tokenizer` reads any of them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# HF ``tokenizers``' own class is ``Tokenizer`` too; here that name is qkv's Protocol.
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as RustTokenizer

from ..errors import QkvError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = [PAD, BOS, EOS, UNK]  # ids 0, 1, 2, 3


@runtime_checkable
class Tokenizer(Protocol):
    """What every qkv tokenizer offers: text ⇄ ids, the vocabulary size, the end token, saving.

    ``encode(text, add_special_tokens=...)`` takes the text positionally (the protein tokenizers
    call it ``sequence`` and take a ``seq_id`` for error messages as their second argument) and
    ``add_special_tokens`` by keyword. Each class keeps its own default for it, which is what its
    callers rely on: ``False`` for :class:`SubwordTokenizer` and :class:`CharTokenizer` (recipes
    add ``bos``/``eos`` themselves), ``True`` for :class:`HFTokenizer` and the protein tokenizers
    (they frame with the model's own specials). ``decode`` drops special tokens.

    ``eos_id`` is the one special id all five have (``None`` for a character vocabulary and for
    a pretrained vocabulary without one). Others exist where they make sense: ``bos_id`` (not on
    protein tokenizers, which start with ``cls_id``), ``pad_id`` (not on
    :class:`CharTokenizer`), ``unk_id``, ``mask_id``; read them with ``getattr(tok, name, None)``.
    ``id_to_token`` is ``None`` for an id outside an HF vocabulary (e.g. a padded output layer).
    """

    @property
    def kind(self) -> str:
        """``"bpe"``, ``"char"``, ``"hf"``, ``"amino-acid"`` or ``"hf-protein"``."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_id(self) -> int | None: ...

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str], /, *, add_special_tokens: bool = ...) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int], /) -> str: ...

    def decode_batch(self, batch: Sequence[Sequence[int]], /) -> list[str]: ...

    def id_to_token(self, i: int, /) -> str | None: ...

    def save(self, path: str | Path) -> None: ...


def read_tokenizer_json(path: str | Path) -> RustTokenizer:
    """An HF ``tokenizers`` JSON file; raises :class:`QkvError` if missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise QkvError(f"tokenizer file not found: {path}")
    try:
        return RustTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise QkvError(f"cannot read tokenizer {path}: {exc}") from None


class SubwordTokenizer:
    """Text ⇄ ids with a reversible BPE (spaces kept as ``▁``, punctuation split off).

    ``encode`` returns ids without specials; callers add ``bos``/``eos`` (or pass
    ``add_special_tokens=True`` for ``<bos> … <eos>``). ``decode`` drops specials and restores
    the text (detokenized, ready for sacreBLEU). Characters never seen in training become ``<unk>``.
    """

    kind = "bpe"

    def __init__(self, tokenizer: RustTokenizer) -> None:
        self._tok = tokenizer
        ids = [tokenizer.token_to_id(s) for s in SPECIALS]
        if ids != [0, 1, 2, 3]:
            raise QkvError(f"tokenizer special tokens must be {SPECIALS} with ids 0-3, got {ids}")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2, byte_level: bool = False
    ) -> SubwordTokenizer:
        """Learn a BPE vocabulary of at most ``vocab_size`` entries from ``texts``.

        ``byte_level=False`` (sentences, translation): NFKC, words marked with ``▁``,
        punctuation and digits split off. ``byte_level=True`` (running text, language
        models): GPT-2's byte-level BPE, which encodes any text losslessly, newlines and
        spacing included, and has no unknown pieces.
        """
        tok = RustTokenizer(models.BPE(unk_token=None if byte_level else UNK))
        if byte_level:
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            tok.decoder = decoders.ByteLevel()
            alphabet = pre_tokenizers.ByteLevel.alphabet()
        else:
            # NFKC folds look-alikes (e.g. non-breaking spaces in Multi30k) into plain characters.
            tok.normalizer = normalizers.NFKC()
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Metaspace(),
                    pre_tokenizers.Punctuation(behavior="isolated"),
                    pre_tokenizers.Digits(individual_digits=True),
                ]
            )
            tok.decoder = decoders.Metaspace()
            alphabet = []
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=SPECIALS,
            show_progress=False,
            initial_alphabet=alphabet,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def residues(cls) -> SubwordTokenizer:
        """One piece per amino-acid code (the 20 standard residues and ``XBZUO``) after the
        specials ``<pad> <bos> <eos> <unk>``: a BPE with no merges, so that a translation run
        between proteins (heavy → light chain) reads residues with the same framing and
        decoding as text. ``decode`` joins the residues without spaces."""
        vocab = {t: i for i, t in enumerate(SPECIALS + list(AMINO_ACIDS + RARE_CODES))}
        tok = RustTokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
        tok.add_special_tokens(SPECIALS)
        tok.decoder = decoders.Fuse()
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path) -> SubwordTokenizer:
        """Load ``tokenizer.json``; raises :class:`QkvError` if missing or unreadable."""
        return cls(read_tokenizer_json(path))

    def save(self, path: str | Path) -> None:
        """Write the HF ``tokenizers`` JSON to ``path`` (atomically)."""
        from ..files import atomic_write

        atomic_write(Path(path), lambda tmp: self._tok.save(str(tmp)))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids, self.eos_id] if add_special_tokens else ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        rows = [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]
        return [[self.bos_id, *r, self.eos_id] for r in rows] if add_special_tokens else rows

    def tokens(self, text: str) -> list[str]:
        """The subword pieces of ``text`` (for display)."""
        return self._tok.encode(text, add_special_tokens=False).tokens

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def unknown_characters(self, text: str) -> list[str]:
        """The characters of ``text`` the vocabulary lacks (each read as ``<unk>``), each once,
        in the order they first appear; ``[]`` for a byte-level BPE, which has none."""
        enc = self._tok.encode(text, add_special_tokens=False)
        found = (text[a:b] for i, (a, b) in zip(enc.ids, enc.offsets, strict=True) if i == self.unk_id)
        return list(dict.fromkeys(found))

    def id_to_token(self, i: int) -> str | None:
        """The piece of id ``i`` (for display); ``None`` outside the vocabulary."""
        return self._tok.id_to_token(i)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self._tok.decode_batch(batch, skip_special_tokens=True)


class CharTokenizer:
    """One token per character, the vocabulary being the characters of the training corpus
    (sorted by code point, as nanoGPT and char-rnn do: tiny-shakespeare gives 65).

    There is no unknown token: a character outside the vocabulary is an error that names it,
    since silently mapping it would make the model condition on something else. An empty
    prompt starts from ``"\\n"`` when the vocabulary has it (nanoGPT's convention), so
    ``bos_id`` is the id of ``"\\n"`` (or ``None``). There are no special tokens: ``eos_id`` is
    ``None`` and ``add_special_tokens`` adds nothing.
    """

    kind = "char"

    def __init__(self, chars: Iterable[str]) -> None:
        self.chars = list(chars)
        if len(set(self.chars)) != len(self.chars) or any(len(c) != 1 for c in self.chars):
            raise QkvError("a character vocabulary needs distinct single characters")
        self._index = {c: i for i, c in enumerate(self.chars)}
        self.bos_id: int | None = self._index.get("\n")
        self.eos_id: int | None = None

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        """The sorted set of characters of ``text``."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Ids of ``text``; raises :class:`QkvError` naming characters outside the vocabulary.
        ``add_special_tokens`` is accepted for the :class:`Tokenizer` interface; there are none."""
        try:
            return [self._index[c] for c in text]
        except KeyError:
            bad = sorted({c for c in text if c not in self._index})
            where = next(i for i, c in enumerate(text) if c not in self._index)
            shown = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in bad[:10])
            raise QkvError(
                f"{len(bad)} character(s) not in the model's {self.vocab_size}-character "
                f"vocabulary: {shown}; first at position {where}"
            ) from None

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def id_to_token(self, i: int) -> str:
        return self.chars[i]

    def save(self, path: str | Path) -> None:
        from ..files import write_json

        write_json(Path(path), {"type": "char", "chars": self.chars})


# Names pretrained vocabularies give their special tokens (BERT, RoBERTa/Marian, ESM, GPT-2),
# in order of preference.
HF_SPECIALS = {
    "pad": ("[PAD]", "<pad>"),
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<eos>"),
    "unk": ("[UNK]", "<unk>"),
    "mask": ("[MASK]", "<mask>"),
    "eot": ("<|endoftext|>",),
}


class HFTokenizer:
    """A pretrained model's own tokenizer (BERT WordPiece, GPT-2 byte-level BPE, ESM residues):
    an HF ``tokenizers`` :class:`~tokenizers.Tokenizer` with its special ids found by name
    (:data:`HF_SPECIALS`; ``None`` where the vocabulary has none).

    ``encode`` adds the model's specials (``[CLS] … [SEP]`` for BERT, ``<cls> … <eos>`` for
    ESM; GPT-2 adds none) unless ``add_special_tokens=False``. Padding and truncation stored in
    the file are turned off: callers pad with ``pad_id`` and decide about long inputs.
    ``bos_id``/``eos_id`` (what generation starts from and stops at) are ``[CLS]``/``[SEP]``
    or GPT-2's ``<|endoftext|>``.
    """

    kind = "hf"

    def __init__(self, tokenizer: RustTokenizer) -> None:
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self._tok = tokenizer
        found: dict[str, int | None] = {}
        for role, names in HF_SPECIALS.items():
            found[role] = next((i for i in map(tokenizer.token_to_id, names) if i is not None), None)
        self.pad_id, self.cls_id, self.sep_id = found["pad"], found["cls"], found["sep"]
        self.unk_id, self.mask_id = found["unk"], found["mask"]
        self.bos_id = self.cls_id if self.cls_id is not None else found["eot"]
        self.eos_id = self.sep_id if self.sep_id is not None else found["eot"]

    @classmethod
    def load(cls, path: str | Path) -> HFTokenizer:
        """Read an HF ``tokenizer.json``; raises :class:`QkvError` if missing or unreadable."""
        return cls(read_tokenizer_json(path))

    @classmethod
    def from_vocab(cls, path: str | Path, lowercase: bool = False) -> HFTokenizer:
        """A WordPiece tokenizer from a BERT-style ``vocab.txt`` (one token per line, id = line
        number), as ``BertTokenizerFast`` builds it. Entries written ``[X]`` or ``<x>`` are
        special tokens, matched whole. A vocabulary of single characters (a protein model's:
        AntiBERTy, ESM, IgLM) is split into characters, so ``EVQL`` needs no spaces.
        Raises :class:`QkvError` for a missing or empty file."""
        path = Path(path)
        try:
            vocab_list = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines()]
        except OSError as exc:
            raise QkvError(f"cannot read vocabulary {path}: {exc}") from None
        except UnicodeDecodeError as exc:
            raise QkvError(f"vocabulary {path} is not UTF-8 text (byte {exc.start})") from None
        if not vocab_list:
            raise QkvError(f"vocabulary {path} is empty")
        return cls.from_tokens(vocab_list, lowercase)

    @classmethod
    def from_tokens(cls, vocab_list: Sequence[str], lowercase: bool = False) -> HFTokenizer:
        """:meth:`from_vocab` from the tokens themselves (id = index), for a vocabulary that
        comes as a list rather than a file (fair-esm's alphabet)."""
        vocab = {t: i for i, t in enumerate(vocab_list)}
        special = [t for t in vocab_list if (t[:1], t[-1:]) in (("[", "]"), ("<", ">")) and len(t) > 2]
        unk = next((t for t in HF_SPECIALS["unk"] if t in vocab), special[0] if special else vocab_list[0])
        tok = RustTokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
        per_char = all(len(t) == 1 for t in vocab_list if t not in special)
        if lowercase:
            tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = (
            pre_tokenizers.Sequence(
                [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex("."), "isolated")]
            )
            if per_char
            else pre_tokenizers.BertPreTokenizer()
        )
        tok.decoder = decoders.Fuse() if per_char else decoders.WordPiece()  # residues: no spaces
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        first = next((t for names in (HF_SPECIALS["cls"],) for t in names if t in vocab), None)
        last = next((t for t in HF_SPECIALS["sep"] if t in vocab), None)
        if first and last:
            tok.post_processor = processors.TemplateProcessing(
                single=f"{first} $A {last}",
                pair=f"{first} $A {last} $B:1 {last}:1",
                special_tokens=[(first, vocab[first]), (last, vocab[last])],
            )
        return cls(tok)

    def save(self, path: str | Path) -> None:
        """Write the HF ``tokenizers`` JSON to ``path`` (atomically)."""
        from ..files import atomic_write

        atomic_write(Path(path), lambda tmp: self._tok.save(str(tmp)))

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    @property
    def vocab(self) -> dict[str, int]:
        """Token → id, special tokens included."""
        return self._tok.get_vocab()

    @property
    def is_residue_vocabulary(self) -> bool:
        """One token per amino acid and few others (< 64 in all): a protein model's
        vocabulary (AntiBERTy, ESM, IgLM), not a text model's."""
        return self.vocab_size < 64 and all(a in self.vocab for a in AMINO_ACIDS)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        """Ids and token types (0 for ``first``, 1 for ``second``) of a sentence pair."""
        enc = self._tok.encode(first, second)
        return enc.ids, enc.type_ids

    def tokens(self, text: str, add_special_tokens: bool = True) -> list[str]:
        """The pieces of ``text`` (for display)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).tokens

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return self._tok.decode_batch(batch, skip_special_tokens=True)

    def id_to_token(self, i: int) -> str | None:
        """The piece of id ``i``; ``None`` outside the vocabulary."""
        return self._tok.id_to_token(i)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load ``tokenizer.json``: a :class:`CharTokenizer` or :class:`AminoAcidTokenizer` (qkv's
    own JSON), a :class:`SubwordTokenizer` (qkv's BPE: specials ``<pad> <bos> <eos> <unk>``
    at ids 0-3) or an :class:`HFTokenizer` (a pretrained model's). Raises :class:`QkvError`
    if unreadable."""
    import json

    path = Path(path)
    if not path.is_file():
        raise QkvError(f"tokenizer file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise QkvError(f"cannot read tokenizer {path}: {exc}") from None
    if isinstance(data, dict) and data.get("type") == "char":
        return CharTokenizer(data["chars"])
    if isinstance(data, dict) and data.get("type") == "amino-acid":
        tok = AminoAcidTokenizer()
        if data.get("tokens") != tok.tokens:
            raise QkvError(f"tokenizer {path} has another amino-acid vocabulary than this qkv version")
        return tok
    hf = HFTokenizer.load(path)
    if [hf.vocab.get(t) for t in SPECIALS] == [0, 1, 2, 3]:
        return SubwordTokenizer(hf._tok)
    return hf


AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"  # the 20 standard residues
RARE_CODES = "XBZUO"  # unknown, Asx, Glx, selenocysteine, pyrrolysine
PROTEIN_SPECIALS = ["<cls>", "<pad>", "<eos>", "<unk>", "<mask>"]  # ids 0-4 (ESM's order)


class AminoAcidTokenizer:
    """One token per residue: the 20 standard amino acids, the codes X B Z U O, and the
    specials ``<cls> <pad> <eos> <unk> <mask>`` (ids 0–4, as in ESM).

    ``encode`` accepts lowercase and strips one trailing ``*`` (a stop codon in translated
    FASTA); any other character (gaps ``-``/``.``, digits, spaces) is refused with
    :class:`QkvError` naming the sequence id, the position (1-based) and the character, because a
    gap in a sequence is usually an alignment pasted by mistake.
    """

    kind = "amino-acid"

    def __init__(self) -> None:
        self.tokens = PROTEIN_SPECIALS + list(AMINO_ACIDS + RARE_CODES)
        self._index = {t: i for i, t in enumerate(self.tokens)}
        self.cls_id, self.pad_id, self.eos_id, self.unk_id, self.mask_id = range(5)
        self.residue_ids = list(range(5, 5 + len(AMINO_ACIDS)))  # what MLM may substitute

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def clean(self, sequence: str, seq_id: str = "sequence") -> str:
        """Upper-cased residues of ``sequence`` without a trailing ``*``; raises
        :class:`QkvError` for characters that are not amino-acid codes."""
        seq = sequence.strip().upper()
        if seq.endswith("*"):
            seq = seq[:-1]
        for i, c in enumerate(seq):
            if c not in self._index or c.startswith("<"):
                raise QkvError(
                    f"{seq_id}: character {c!r} at position {i + 1} is not an amino-acid "
                    f"code (allowed: {AMINO_ACIDS} and {RARE_CODES}, any case, one trailing *)"
                )
        return seq

    def encode(self, sequence: str, seq_id: str = "sequence", add_special_tokens: bool = True) -> list[int]:
        """Ids of a protein sequence: ``<cls> residues <eos>`` (or residues only)."""
        ids = [self._index[c] for c in self.clean(sequence, seq_id)]
        return [self.cls_id, *ids, self.eos_id] if add_special_tokens else ids

    def encode_batch(self, sequences: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Ids of each sequence; errors name it ``sequence N`` (1-based)."""
        return [
            self.encode(s, f"sequence {n}", add_special_tokens=add_special_tokens)
            for n, s in enumerate(sequences, 1)
        ]

    def decode(self, ids: Iterable[int]) -> str:
        """Residues of ``ids`` (specials dropped)."""
        return "".join(self.tokens[i] for i in ids if i >= len(PROTEIN_SPECIALS))

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def id_to_token(self, i: int) -> str:
        return self.tokens[i]

    def save(self, path: str | Path) -> None:
        from ..files import write_json

        write_json(Path(path), {"type": "amino-acid", "tokens": self.tokens})


class PretrainedProteinTokenizer:
    """A pretrained protein model's own vocabulary (AntiBERTy, ESM, IgLM: one token per residue,
    read by :class:`HFTokenizer`) behind :class:`AminoAcidTokenizer`'s interface, so the protein
    recipes and :class:`~qkv.inference.protein.ProteinEncoder` run on it unchanged.

    Residues are cleaned as :meth:`AminoAcidTokenizer.clean` does; a code the vocabulary lacks
    (e.g. ``X`` for AntiBERTy) becomes its unknown token. ``cls_id``/``eos_id`` are the
    model's start and end tokens (``[CLS]``/``[SEP]``, ``<cls>``/``<eos>``).

    Raises:
        QkvError: on construction, a vocabulary without start, end or padding tokens.
    """

    kind = "hf-protein"

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self.hf = tokenizer
        cls_id, sep_id, pad_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
        if cls_id is None or sep_id is None or pad_id is None:
            named = (("cls_id", cls_id), ("sep_id", sep_id), ("pad_id", pad_id))
            missing = [n for n, i in named if i is None]
            raise QkvError(f"this vocabulary cannot frame protein sequences: no {', '.join(missing)}")
        self.cls_id, self.eos_id, self.pad_id = cls_id, sep_id, pad_id
        self.unk_id, self.mask_id = tokenizer.unk_id, tokenizer.mask_id
        vocab = tokenizer.vocab
        # A code the vocabulary lacks maps to its unknown token; with no unknown token it has no id.
        self._index: dict[str, int] = {}
        for c in AMINO_ACIDS + RARE_CODES:
            i = vocab.get(c, self.unk_id)
            if i is not None:
                self._index[c] = i
        self.residue_ids = sorted({self._index[a] for a in AMINO_ACIDS if a in self._index} - {self.unk_id})
        self._clean = AminoAcidTokenizer().clean

    @property
    def vocab_size(self) -> int:
        return self.hf.vocab_size

    def clean(self, sequence: str, seq_id: str = "sequence") -> str:
        return self._clean(sequence, seq_id)

    def encode(self, sequence: str, seq_id: str = "sequence", add_special_tokens: bool = True) -> list[int]:
        seq = self.clean(sequence, seq_id)
        missing = sorted({c for c in seq if c not in self._index})
        if missing:
            raise QkvError(
                f"{seq_id}: this vocabulary has no token for {', '.join(missing)} and no unknown token"
            )
        ids = [self._index[c] for c in seq]
        return [self.cls_id, *ids, self.eos_id] if add_special_tokens else ids

    def encode_batch(self, sequences: Sequence[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Ids of each sequence; errors name it ``sequence N`` (1-based)."""
        return [
            self.encode(s, f"sequence {n}", add_special_tokens=add_special_tokens)
            for n, s in enumerate(sequences, 1)
        ]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.hf.id_to_token(i) or "" for i in ids if i in self.residue_ids)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def id_to_token(self, i: int) -> str | None:
        return self.hf.id_to_token(i)

    def save(self, path: str | Path) -> None:
        self.hf.save(path)


def protein_tokenizer(tokenizer: Any) -> AminoAcidTokenizer | PretrainedProteinTokenizer:
    """The protein interface of a run's tokenizer: qkv's :class:`AminoAcidTokenizer` as it is,
    a pretrained model's :class:`HFTokenizer` wrapped in :class:`PretrainedProteinTokenizer`."""
    if isinstance(tokenizer, (AminoAcidTokenizer, PretrainedProteinTokenizer)):
        return tokenizer
    if isinstance(tokenizer, HFTokenizer):
        return PretrainedProteinTokenizer(tokenizer)
    raise QkvError(f"a {type(tokenizer).__name__} cannot encode protein sequences")
