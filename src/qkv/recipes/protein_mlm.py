"""Recipe: masked-language-model pretraining of a protein encoder (ESM-style) on UniProt +
RefSeq proteomes, with a held-out 2 % (by record id) for validation perplexity.

Flow: read the FASTA corpora (Biopython) → amino-acid tokens → each epoch, a random window of
at most ``max_len - 2`` residues per protein (ESM's cropping), length-bucketed batches of
``max_tokens`` padded tokens → 15 % of residues corrupted (80/10/10) → cross-entropy on them →
:func:`qkv.train.loop.train_loop` (AdamW, warm-up + cosine decay, bf16 option) → the weights
with the best validation perplexity → ``model.safetensors``.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

import torch

from ..data.batching import token_batches
from ..data.protein import load_pretraining_corpus
from ..data.protein_mlm import MaskedBatches, ShardBatches, token_counts, validation_batches, windows
from ..data.shards import PreparedData
from ..data.tokenizers import AminoAcidTokenizer
from ..errors import ConfigError, QkvError
from ..explain.explainers import ProteinExplainer
from ..inference.protein import ProteinEncoder
from ..models.config import EncoderConfig
from ..models.encoder import EncoderModel, mlm_loss
from ..models.model_types import ENCODER
from ..runs import RunInfo
from ..runs.layout import DATA
from ..runs.record import prepared_data_record
from ..train.loop import LoopState
from ..train.run import TrainingRun
from ..train.train_settings import TrainSettings
from .common import closing_sentence, require_at_least_one
from .recipe import Recipe

logger = logging.getLogger(__name__)


SHARD_VAL_PROTEINS = 4096  # held-out proteins validated on from token shards (a cost flat in corpus size)


@dataclass(frozen=True, kw_only=True)
class ProteinMLMSettings:
    """Settings of ``qkv train protein-mlm``: ``model`` (an :class:`EncoderConfig`, qkv's
    protein encoder by default; ``model.max_len`` counts ``<cls>`` and ``<eos>``, longer
    proteins are cropped to a random window each epoch), ``train`` (:class:`TrainSettings`:
    AdamW, warm-up + cosine decay; training by time needs ``train.lr_decay_steps``), and the
    data fields: ``val_fraction`` held out by record id, ``mask_prob`` (residues corrupted,
    80/10/10), ``max_tokens`` (padded tokens per micro-batch), ``train_limit``/``val_limit``.

    ``data``: a directory written by ``qkv prepare protein-mlm`` (token shards read from disk:
    a corpus of any size) instead of the UniProt + RefSeq corpus held in memory; its split is
    the one it was prepared with (``val_fraction`` is left out), batches are drawn by
    :class:`ShardBatches`, and validation reads the first ``val_limit`` held-out proteins
    (default :data:`SHARD_VAL_PROTEINS`).
    """

    model: EncoderConfig = EncoderConfig()
    train: TrainSettings = TrainSettings(
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=500,
        weight_decay=0.01,
        max_steps=3300,
        max_minutes=115.0,
        eval_every=500,
        snapshot_minutes=10.0,
        keep_snapshots=1,
    )
    val_fraction: float = 0.02
    mask_prob: float = 0.15
    max_tokens: int = 8192
    train_limit: int | None = None
    val_limit: int | None = None
    data: str | None = None

    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = ("data", "val_fraction", "train_limit")
    # of those, what data.json compares by content (the same shards moved resume)
    BY_CONTENT: ClassVar[tuple[str, ...]] = ("data",)

    def __post_init__(self) -> None:
        self.train.lr_schedule(self.model.d_model)  # a cosine schedule needs an end
        require_at_least_one(self, "max_tokens", "train_limit", "val_limit")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction ({self.val_fraction}) must be in (0, 1)")
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"mask_prob ({self.mask_prob}) must be in (0, 1)")
        if self.data is not None and (self.train_limit is not None or self.val_fraction != 0.02):
            raise ConfigError(
                f"data={self.data} carries its own split: leave out train_limit and val_fraction "
                "(a budget: train.max_steps)"
            )
        if self.model.max_len < 3:
            raise ConfigError(
                f"model.max_len ({self.model.max_len}) must leave room for <cls>, a residue and <eos>"
            )

    def model_config(self, tok: AminoAcidTokenizer) -> EncoderConfig:
        return replace(self.model, vocab_size=tok.vocab_size, pad_id=tok.pad_id)


def evaluate_run(run_dir: str | Path, split: str = "val", device: torch.device | str = "cpu") -> dict:
    """Held-out masked-residue perplexity of a ``protein-mlm`` run (its own split and
    settings, from ``train_config.json``), beside the uniform-20 baseline.

    Raises:
        QkvError: a split other than ``"val"`` (the held-out proteins), or a bad run directory.
    """
    if split != "val":
        raise QkvError(f"a protein-mlm run is scored on its held-out proteins: split val (got {split!r})")
    settings = RunInfo.read(run_dir).settings
    model = ProteinEncoder.from_run(run_dir, device).model
    tok = AminoAcidTokenizer()
    if settings.get("data"):
        run_settings = ProteinMLMSettings(data=settings["data"], val_limit=settings.get("val_limit"))
        val_ids = _corpus(run_settings, tok)[1]
    else:
        _, val_seqs = load_pretraining_corpus(settings["val_fraction"])
        val_ids = [tok.encode(s, add_special_tokens=False) for s in val_seqs[: settings.get("val_limit")]]
    batches = validation_batches(val_ids, model.config.max_len - 2, MaskedBatches(tok, settings["mask_prob"]))
    with torch.no_grad():
        nll, n = masked_nll(model, batches)
    return {
        "split": "held-out",
        "val_loss": nll / n,
        "val_ppl": math.exp(nll / n),
        "uniform_ppl": 20.0,
        "masked_positions": n,
        "proteins": len(val_ids),
    }


def masked_nll(model: EncoderModel, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, int]:
    """Summed NLL (nats) over the masked positions of fixed ``(inputs, labels)`` batches."""
    device = next(model.parameters()).device
    total, n = 0.0, 0
    for inputs, labels in batches:
        loss, count = mlm_loss(model(inputs.to(device)).logits, labels.to(device))
        total, n = total + float(loss), n + count
    return total, n


def unigram_ppl(counts: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Perplexity of the training residues' frequencies ``counts`` ``(vocab_size,)`` (no
    context at all) on the masked positions of ``batches``: the bar a model must clear to show
    it uses context."""
    counts = counts.double() + 1  # add-one smoothing
    logp = (counts / counts.sum()).log()
    nll = torch.cat([-logp[labels[labels != -100]] for _, labels in batches])
    return math.exp(float(nll.mean()))


def _corpus(
    settings: ProteinMLMSettings, tok: AminoAcidTokenizer
) -> tuple[list[list[int]], list[list[int]], torch.Tensor, PreparedData | None]:
    """``(training ids, held-out ids, training token counts (vocab,), prepared data)``: the
    UniProt + RefSeq corpus in memory (``prepared`` None), or token shards (``data=``; the
    training ids are then read batch by batch and the list is empty)."""
    if settings.data is not None:
        prepared = PreparedData.open(settings.data, "protein-mlm")
        split = prepared.val
        val_ids = [split.sequence(i).tolist() for i in range(min(split.num_sequences, _val_cap(settings)))]
        counts = torch.tensor(prepared.meta["token_counts"]["train"], dtype=torch.float64)
        logger.info(
            f"{settings.data}: {prepared.train.num_sequences:,} training proteins ({len(prepared.train):,} "
            f"residues, on disk), {len(val_ids):,} held-out proteins validated on"
        )
        return [], val_ids, counts, prepared
    train_seqs, val_seqs = load_pretraining_corpus(settings.val_fraction)
    train_seqs, val_seqs = train_seqs[: settings.train_limit], val_seqs[: settings.val_limit]
    train_ids = [tok.encode(s, add_special_tokens=False) for s in train_seqs]
    val_ids = [tok.encode(s, add_special_tokens=False) for s in val_seqs]
    logger.info(
        f"UniProt + RefSeq: {len(train_ids):,} training proteins ({sum(map(len, train_ids)):,} "
        f"residues), {len(val_ids):,} held out ({sum(map(len, val_ids)):,} residues)"
    )
    return train_ids, val_ids, token_counts(train_ids, tok.vocab_size), None


def _val_cap(settings: ProteinMLMSettings) -> int:
    return settings.val_limit if settings.val_limit is not None else SHARD_VAL_PROTEINS


class ProteinMLMRun(TrainingRun):
    """``qkv train protein-mlm``: proteins (in memory, or token shards with ``data=``) cropped
    to random windows, 15 % of residues corrupted; the masked residues' cross-entropy; the best
    held-out perplexity kept, beside the uniform (20) and unigram baselines."""

    name = "protein-mlm"

    def setup(self) -> EncoderConfig:
        s = self.settings
        self.tokenizer = tok = AminoAcidTokenizer()
        self.train_ids, val_ids, self.counts, self.prepared = _corpus(s, tok)
        if self.prepared is not None:
            self.record = prepared_data_record(self.run_dir, self.prepared, self.resume, str(s.data))
        config = s.model_config(tok)
        self.width = config.max_len - 2
        self.collate = MaskedBatches(tok, s.mask_prob)
        self.val_batches = validation_batches(val_ids, self.width, self.collate)
        return config

    def new_run_files(self) -> dict[str, dict]:
        return {DATA: self.record} if self.prepared is not None else {}

    def build_model(self, config: EncoderConfig) -> EncoderModel:
        model = EncoderModel(config).to(self.device)
        logger.info(f"model: {model.num_parameters() / 1e6:.2f} M parameters on {self.device}")
        return model

    def batches(self, epoch: int) -> Sequence[list[list[int]]]:
        s, seed = self.settings, self.settings.train.seed * 1000 + epoch
        if self.prepared is not None:
            return ShardBatches(self.prepared.train, self.width, s.max_tokens, seed)
        rows = windows(self.train_ids, self.width, random.Random(seed))
        order = token_batches([(len(r), 0) for r in rows], s.max_tokens, shuffle=True, seed=seed)
        return [[rows[i] for i in idx] for idx in order]

    def loss(self, model, rows) -> tuple[torch.Tensor, int]:
        inputs, labels = self.collate.corrupt(self.collate.tensor(rows))
        return mlm_loss(model(inputs.to(self.device)).logits, labels.to(self.device))

    def validate(self, model) -> dict:
        nll, n = masked_nll(model, self.val_batches)
        return {"val_loss": nll / n, "val_ppl": math.exp(nll / n)}

    def summarize(self, model, state: LoopState) -> dict:
        with torch.no_grad():
            metrics = self.validate(model)
        return {
            "validation": {
                **metrics,
                "uniform_ppl": 20.0,
                "unigram_ppl": unigram_ppl(self.counts, self.val_batches),
                "masked_positions": sum(int((lab != -100).sum()) for _, lab in self.val_batches),
            }
        }


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train protein-mlm`` shows at the end: the held-out perplexity."""
    val = summary["validation"]
    return (
        f"held-out masked-residue perplexity {val['val_ppl']:.2f} (uniform over 20 residues: 20) "
        f"{closing_sentence(summary, run_dir)}"
    )


RECIPE = Recipe(
    name="protein-mlm",
    settings=ProteinMLMSettings,
    train=ProteinMLMRun.train,
    evaluate=evaluate_run,
    splits=("val",),
    summary=summary_text,
    model_type=ENCODER,
    explainer=ProteinExplainer,
    inputs="protein",
)
