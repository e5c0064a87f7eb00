"""Recipe: masked-language-model pretraining of a protein encoder (ESM-style) on UniProt +
RefSeq proteomes, with a held-out 2 % (by record id) for validation perplexity.

Flow: read the FASTA corpora (Biopython) → amino-acid tokens → each epoch, a random window of
at most ``max_len - 2`` residues per protein (ESM's cropping), length-bucketed batches of
``max_tokens`` padded tokens → 15 % of residues corrupted (80/10/10) → cross-entropy on them →
:func:`qkv.train.loop.train_loop` (AdamW, warm-up + cosine decay, bf16 option) → the weights
with the best validation perplexity → ``model.safetensors``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..data.batching import OnDemandBatches, pad_sequences, token_batches
from ..data.masking import mask_tokens
from ..data.protein import load_pretraining_corpus
from ..data.shards import PreparedData, Split
from ..data.tokenizers import PROTEIN_SPECIALS, AminoAcidTokenizer
from ..errors import ConfigError, QkvError
from ..explain.explainers import ProteinExplainer
from ..generate.protein import ProteinEncoder
from ..models.config import EncoderConfig
from ..models.encoder import EncoderModel, mlm_loss
from ..models.model_types import ENCODER
from ..train import distributed
from ..train.checkpoint import write_json
from ..train.settings import TrainSettings
from .base import Recipe
from .common import (
    fit,
    keep_best,
    prepare_run_dir,
    prepared_data_record,
    require_at_least_one,
    start_run,
    write_settings,
)

logger = logging.getLogger(__name__)


SHARD_VAL_PROTEINS = 4096  # held-out proteins validated on from token shards (a cost flat in corpus size)


@dataclass(frozen=True, kw_only=True)
class ProteinMLMRecipe:
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


def _windows(seqs: list[list[int]], width: int, rng: random.Random | None) -> list[list[int]]:
    """Crop each residue list to ``width`` (a random window, or the start when ``rng`` is None)."""
    out = []
    for s in seqs:
        start = 0 if len(s) <= width or rng is None else rng.randrange(len(s) - width + 1)
        out.append(s[start : start + width])
    return out


class MaskedBatches:
    """Length-bucketed batches of ``<cls> residues <eos>`` rows, corrupted for MLM."""

    def __init__(self, tok: AminoAcidTokenizer, mask_prob: float) -> None:
        self.tok, self.mask_prob = tok, mask_prob
        self.special = list(range(len(PROTEIN_SPECIALS)))

    def tensor(self, rows: list[list[int]]) -> torch.Tensor:
        tok = self.tok
        return pad_sequences([[tok.cls_id, *r, tok.eos_id] for r in rows], tok.pad_id)

    def corrupt(
        self,
        tokens: torch.Tensor,
        generator: torch.Generator | None = None,
        split: tuple[float, float] = (0.8, 0.1),
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return mask_tokens(
            tokens, self.special, self.tok.mask_id, self.tok.residue_ids, self.mask_prob, generator, split
        )


class ShardBatches(OnDemandBatches):
    """One epoch of length-bucketed protein batches from token shards, made on demand
    (:class:`~qkv.data.batching.OnDemandBatches`).

    Batch ``i`` (a NumPy generator seeded with ``(seed, i)``) starts at a residue drawn
    uniformly from the split, takes the protein holding it and its neighbours in the shard
    (shards are sorted by length when prepared, so neighbours have similar lengths: little
    padding) while the padded batch, ``<cls>`` and ``<eos>`` included, stays within
    ``max_tokens``, and crops each protein longer than ``width`` to a random window (ESM's
    cropping). A batch thus costs the same whatever the corpus size, nothing is held per
    protein, and batch ``i`` is the same whenever it is asked for (exact resume; every torchrun
    process reads only its rows). Residues are drawn uniformly, so every residue of the corpus
    is equally likely to be trained on (a protein in proportion to its length, where the
    in-memory recipe takes each protein once per epoch, cropped). An epoch is as many batches
    as the split's residues fill at ``max_tokens``.
    """

    def __init__(self, split: Split, width: int, max_tokens: int, seed: int) -> None:
        self.split, self.width, self.max_tokens, self.seed = split, width, max_tokens, seed
        self.steps = max(1, -(-len(split) // max_tokens))

    def make(self, i: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, i])
        shard, first = self.split.locate(int(rng.integers(len(self.split))))
        n_seqs = int(self.split.shards[shard][1])
        most = max(1, self.max_tokens // 3)  # rows of a batch: at least <cls>, a residue, <eos> each
        starts = self.split.shard_starts(shard, first, first + most + 1)
        widths = np.minimum(np.diff(starts), self.width) + 2  # ascending: each new row is the widest
        fits = (np.arange(1, len(widths) + 1) * widths) <= self.max_tokens
        count = max(1, int(fits.argmin()) if not fits.all() else len(widths))
        last = first + count
        if last == n_seqs:  # the shard ran out: take shorter neighbours before it
            room = max(1, self.max_tokens // int(widths[count - 1]))
            first = max(0, last - room)
        rows = []
        for j in range(first, last):
            seq = self.split.shard_sequence(shard, j)
            start = int(rng.integers(len(seq) - self.width + 1)) if len(seq) > self.width else 0
            rows.append(seq[start : start + self.width].tolist())
        return rows


def validation_batches(
    val_ids: list[list[int]], width: int, collate: MaskedBatches
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed ``(inputs, labels)`` batches of the held-out proteins: the first window of each,
    15 % of residues all replaced by ``<mask>`` (none left visible), drawn once with a fixed
    seed, so the perplexity is comparable with the uniform 20 and the same at every evaluation."""
    rows = _windows(val_ids, width, None)
    g = torch.Generator().manual_seed(12345)
    return [
        collate.corrupt(collate.tensor([rows[i] for i in idx]), g, split=(1.0, 0.0))
        for idx in token_batches([(len(r), 0) for r in rows], 16384, shuffle=False)
    ]


def evaluate_mlm_run(run_dir: str | Path, split: str = "val", device: torch.device | str = "cpu") -> dict:
    """Held-out masked-residue perplexity of a ``protein-mlm`` run (its own split and
    settings, from ``train_config.json``), beside the uniform-20 baseline.

    Raises:
        QkvError: a split other than ``"val"`` (the held-out proteins), or a bad run directory.
    """
    if split != "val":
        raise QkvError(f"a protein-mlm run is scored on its held-out proteins: split val (got {split!r})")
    settings = json.loads((Path(run_dir) / "train_config.json").read_text(encoding="utf-8"))
    model = ProteinEncoder.from_run(run_dir, device).model
    tok = AminoAcidTokenizer()
    if settings.get("data"):
        recipe = ProteinMLMRecipe(data=settings["data"], val_limit=settings.get("val_limit"))
        val_ids = _corpus(recipe, tok)[1]
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


def token_counts(ids: list[list[int]], vocab_size: int) -> torch.Tensor:
    """How often each token occurs in ``ids``. Shape: ``(vocab_size,)`` float64."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for row in ids:
        counts += torch.bincount(torch.tensor(row, dtype=torch.long), minlength=vocab_size)
    return counts


def unigram_ppl(counts: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Perplexity of the training residues' frequencies ``counts`` ``(vocab_size,)`` (no
    context at all) on the masked positions of ``batches``: the bar a model must clear to show
    it uses context."""
    counts = counts.double() + 1  # add-one smoothing
    logp = (counts / counts.sum()).log()
    nll = torch.cat([-logp[labels[labels != -100]] for _, labels in batches])
    return math.exp(float(nll.mean()))


def _corpus(
    recipe: ProteinMLMRecipe, tok: AminoAcidTokenizer
) -> tuple[list[list[int]], list[list[int]], torch.Tensor, PreparedData | None]:
    """``(training ids, held-out ids, training token counts (vocab,), prepared data)``: the
    UniProt + RefSeq corpus in memory (``prepared`` None), or token shards (``data=``; the
    training ids are then read batch by batch and the list is empty)."""
    if recipe.data is not None:
        prepared = PreparedData.open(recipe.data, "protein-mlm")
        split = prepared.val
        val_ids = [split.sequence(i).tolist() for i in range(min(split.num_sequences, _val_cap(recipe)))]
        counts = torch.tensor(prepared.meta["token_counts"]["train"], dtype=torch.float64)
        logger.info(
            f"{recipe.data}: {prepared.train.num_sequences:,} training proteins ({len(prepared.train):,} "
            f"residues, on disk), {len(val_ids):,} held-out proteins validated on"
        )
        return [], val_ids, counts, prepared
    train_seqs, val_seqs = load_pretraining_corpus(recipe.val_fraction)
    train_seqs, val_seqs = train_seqs[: recipe.train_limit], val_seqs[: recipe.val_limit]
    train_ids = [tok.encode(s, add_special_tokens=False) for s in train_seqs]
    val_ids = [tok.encode(s, add_special_tokens=False) for s in val_seqs]
    logger.info(
        f"UniProt + RefSeq: {len(train_ids):,} training proteins ({sum(map(len, train_ids)):,} "
        f"residues), {len(val_ids):,} held out ({sum(map(len, val_ids)):,} residues)"
    )
    return train_ids, val_ids, token_counts(train_ids, tok.vocab_size), None


def _val_cap(recipe: ProteinMLMRecipe) -> int:
    return recipe.val_limit if recipe.val_limit is not None else SHARD_VAL_PROTEINS


def train_protein_mlm(
    recipe: ProteinMLMRecipe, run_dir: str | Path, resume: bool = False, progress: bool = True
) -> dict:
    """Pretrain; keep the best-on-validation weights. Returns a summary dict."""
    t_start = time.perf_counter()
    run_dir = prepare_run_dir(run_dir, resume, "protein-mlm")
    run = start_run(recipe.train)
    device = run.device
    tok = AminoAcidTokenizer()
    train_ids, val_ids, counts, prepared = _corpus(recipe, tok)
    record = None if prepared is None else prepared_data_record(run_dir, prepared, resume, str(recipe.data))
    model_cfg = recipe.model_config(tok)
    if not resume:
        tok.save(run_dir / "tokenizer.json")
        if record is not None:
            write_json(run_dir / "data.json", record)
    write_settings(run_dir, "protein-mlm", recipe, model_cfg, run, resume)
    width = model_cfg.max_len - 2
    collate = MaskedBatches(tok, recipe.mask_prob)
    val_batches = validation_batches(val_ids, width, collate)
    model = EncoderModel(model_cfg).to(device)
    logger.info(f"model: {model.num_parameters() / 1e6:.2f} M parameters on {device}")

    def batches(epoch: int) -> Sequence[list[list[int]]]:
        if prepared is not None:
            return ShardBatches(prepared.train, width, recipe.max_tokens, recipe.train.seed * 1000 + epoch)
        rng = random.Random(recipe.train.seed * 1000 + epoch)
        rows = _windows(train_ids, width, rng)
        order = token_batches(
            [(len(r), 0) for r in rows],
            recipe.max_tokens,
            shuffle=True,
            seed=recipe.train.seed * 1000 + epoch,
        )
        return [[rows[i] for i in idx] for idx in order]

    def loss_fn(model, rows):
        inputs, labels = collate.corrupt(collate.tensor(rows))
        return mlm_loss(model(inputs.to(device)).logits, labels.to(device))

    def validate(model) -> dict:
        nll, n = masked_nll(model, val_batches)
        return {"val_loss": nll / n, "val_ppl": math.exp(nll / n)}

    state = fit(
        model,
        recipe.train,
        batches,
        loss_fn,
        validate,
        run_dir,
        progress,
        resume=resume,
        precision=run.precision,
    )
    if not distributed.is_main():  # torchrun: the other processes only helped train
        return {}
    keep_best(model, run_dir)
    with torch.no_grad():
        metrics = validate(model)
    summary = {
        "validation": {
            **metrics,
            "uniform_ppl": 20.0,
            "unigram_ppl": unigram_ppl(counts, val_batches),
            "masked_positions": sum(int((lab != -100).sum()) for _, lab in val_batches),
        },
        "train_minutes": round(state.elapsed_s / 60, 2),
        "steps": state.step,
        "epochs": state.epoch,
        "parameters": model.num_parameters(),
        "total_minutes": round((time.perf_counter() - t_start) / 60, 2),
    }
    write_json(run_dir / "summary.json", summary)
    return summary


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train protein-mlm`` shows at the end: the held-out perplexity."""
    val = summary["validation"]
    return (
        f"held-out masked-residue perplexity {val['val_ppl']:.2f} (uniform over 20 residues: 20) "
        f"after {summary['train_minutes']:.1f} min and {summary['steps']} steps; run directory: "
        f"{Path(run_dir).resolve()}"
    )


RECIPE = Recipe(
    name="protein-mlm",
    settings=ProteinMLMRecipe,
    train=train_protein_mlm,
    evaluate=evaluate_mlm_run,
    splits=("val",),
    summary=summary_text,
    model_type=ENCODER,
    explainer=ProteinExplainer,
    inputs="protein",
)
