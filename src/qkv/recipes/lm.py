"""Recipe: train a decoder-only language model on a text corpus (default tiny-shakespeare,
character level, nanoGPT's split and CPU "baby GPT" settings so numbers compare).

Flow: load the corpus → first 90 % train / last 10 % validation → character vocabulary (or
BPE) → random ``block_size`` windows (a protein corpus: whole sequences, one per row) →
:func:`qkv.train.loop.train_loop` (cross-entropy on the next token, AdamW with weight decay on
matrices only, warm-up + cosine decay) → the weights with the best validation loss →
``model.safetensors`` → ``samples.txt``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from .. import runs
from ..data.lm import (
    LMData,
    build_tokenizer,
    check_stream,
    corpus_splits,
    encode_corpus,
    encode_splits,
    eval_batches,
    lm_batch,
    num_tokens,
    reads_lines,
    train_batches,
)
from ..data.shards import PreparedData
from ..data.text import IGNORE_INDEX
from ..data.tokenizers import Tokenizer, load_tokenizer
from ..errors import ConfigError, QkvError
from ..explain.explainers import LMExplainer
from ..files import write_text
from ..inference.lm import TextGenerator
from ..models.config import LMConfig
from ..models.decoder_lm import DecoderLM
from ..models.model_types import DECODER_LM, built_as
from ..runs.layout import CONFIG, DATA, TOKENIZER
from ..runs.record import prepared_data_record, recorded_input, refuse_other_data
from ..train.adapters import add_lora
from ..train.loop import LoopState
from ..train.run import TrainingRun
from ..train.train_settings import TrainSettings
from .common import LORA_KEYS, closing_sentence, require_at_least_one
from .recipe import Recipe

logger = logging.getLogger(__name__)


# what a prepared data directory fixes (qkv prepare lm), and the validation batches read from one
DATA_KEYS = ("corpus", "val_corpus", "tokenizer", "vocab_size", "val_fraction")
SHARD_EVAL_BATCHES = 100


@dataclass(frozen=True, kw_only=True)
class LMSettings:
    """Settings of ``qkv train lm``: ``model`` (an :class:`LMConfig`; ``model.max_len`` is the
    context, nanoGPT's ``block_size``), ``train`` (:class:`TrainSettings`: AdamW, warm-up +
    cosine decay), and the data fields.

    Defaults reproduce nanoGPT's CPU tiny-shakespeare run (``train_shakespeare_char.py`` with
    ``n_layer=4 n_head=4 n_embd=128 block_size=64 batch_size=12 max_iters=2000
    lr_decay_iters=2000 dropout=0``). ``corpus``: ``"tinyshakespeare"`` or a UTF-8 text file.
    ``tokenizer``: ``"char"`` or ``"bpe"`` (``vocab_size`` pieces). ``batch_size``: windows per
    micro-batch (sequences, for a protein corpus). ``eval_batches``: number of 128-window
    batches for validation (``None`` = the whole split). The samples file uses
    ``num_samples``, ``sample_tokens``, ``temperature``, ``top_k``.

    ``init``: continue a pretrained language model instead of starting from random weights: a
    qkv LM run directory, an HF folder (a GPT-2 checkpoint) or a short name (``iglm``). Its
    architecture, weights and tokenizer are used (``tokenizer`` and ``vocab_size`` are
    ignored); ``model.max_len`` is the window (at most the checkpoint's context: a longer
    learned position table is cut, as nanoGPT's ``crop_block_size``) and ``model.dropout``,
    ``attention_dropout``, ``activation_dropout`` apply; any other ``model`` key set to a value
    that differs from the checkpoint's is refused. ``train.lora_rank`` > 0 trains LoRA adapters
    instead of every weight.

    ``data``: a directory written by ``qkv prepare lm`` (token shards read from disk: a corpus
    of any size); it carries the corpus, tokenizer and split, so ``corpus``, ``val_corpus``,
    ``tokenizer``, ``vocab_size`` and ``val_fraction`` are left out. Validation then reads at
    most ``eval_batches`` (default :data:`SHARD_EVAL_BATCHES`) batches of the held-out split.
    """

    model: LMConfig = LMConfig()
    train: TrainSettings = TrainSettings(
        lr=1e-3,
        min_lr_ratio=0.1,
        warmup_steps=100,
        beta2=0.99,
        weight_decay=0.1,
        max_steps=2000,
        eval_every=250,
        snapshot_minutes=10.0,
        keep_snapshots=1,
        seed=1337,
    )
    corpus: str = "tinyshakespeare"
    tokenizer: Literal["char", "bpe"] = "char"
    vocab_size: int = 8000
    val_fraction: float = 0.1
    batch_size: int = 12
    eval_batches: int | None = None
    num_samples: int = 3
    sample_tokens: int = 500
    temperature: float = 0.8
    top_k: int | None = 200
    init: str | None = None
    val_corpus: str | None = None
    data: str | None = None

    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = (*DATA_KEYS, "data", "init", *LORA_KEYS)
    # of those, what data.json compares by content (the same text or shards moved resume)
    BY_CONTENT: ClassVar[tuple[str, ...]] = ("corpus", "val_corpus", "val_fraction", "data")

    def __post_init__(self) -> None:
        self.train.lr_schedule(self.model.d_model)  # a cosine schedule needs an end
        require_at_least_one(
            self, "batch_size", "vocab_size", "eval_batches", "num_samples", "sample_tokens", "top_k"
        )
        if not self.temperature > 0.0:
            raise ConfigError(f"temperature ({self.temperature}) must be > 0")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction ({self.val_fraction}) must be in (0, 1)")
        if self.train.lora_rank and self.init is None:
            raise ConfigError(
                "train.lora_rank adapts a pretrained model: set init (--init RUN|HF_FOLDER|NAME)"
            )
        if self.data is not None:
            default = LMSettings()
            clash = [k for k in DATA_KEYS if getattr(self, k) != getattr(default, k)]
            if clash:
                raise ConfigError(
                    f"data={self.data} carries its corpus, tokenizer and split; leave out "
                    + ", ".join(f"{k}={getattr(self, k)!r}" for k in clash)
                )
            if self.init is not None:
                raise ConfigError(
                    "data= holds ids of its own tokenizer; continuing a pretrained model (init) reads "
                    "a text corpus (corpus=FILE)"
                )

    @property
    def eval_limit(self) -> int | None:
        """Validation batches: ``eval_batches``, else the whole split (a prepared one: at most
        :data:`SHARD_EVAL_BATCHES`, so validation costs the same at any corpus size)."""
        if self.eval_batches is None and self.data is not None:
            return SHARD_EVAL_BATCHES
        return self.eval_batches

    @property
    def summary_limit(self) -> int | None:
        """Batches of the summary's validation: the whole split, as far as a prepared one is not
        too large for it (at most :data:`SHARD_EVAL_BATCHES`: the same cap at any size)."""
        return None if self.data is None else SHARD_EVAL_BATCHES

    def model_config(self, tok) -> LMConfig:
        """``model`` with the tokenizer's vocabulary and start token."""
        return replace(self.model, vocab_size=tok.vocab_size, bos_id=start_token(tok))


# the model keys a run started from a checkpoint may set (the rest is the checkpoint's)
INIT_KEYS = ("max_len", "dropout", "attention_dropout", "activation_dropout")


def init_model(settings: LMSettings) -> tuple[DecoderLM, Tokenizer]:
    """``(model, tokenizer)`` of ``settings.init``: the pretrained decoder with the recipe's window
    (``model.max_len``) and dropouts, its weights loaded (a learned position table cut to the
    window), in training mode, on the CPU.

    Raises:
        QkvError: ``init`` is not a language model, or not found (:func:`qkv.hub.pretrained.load`).
        ConfigError: ``model.max_len`` beyond the checkpoint's context, or another ``model`` key
            that contradicts the checkpoint.
    """
    from ..hub.pretrained import load

    assert settings.init is not None
    pretrained, tok = load(settings.init)
    if not built_as(pretrained, DECODER_LM):
        raise QkvError(f"init={settings.init} is not a language model (a {type(pretrained).__name__})")
    base, default = pretrained.config, LMConfig()
    clash = [
        f"model.{f.name}={getattr(settings.model, f.name)!r} (the checkpoint's: {getattr(base, f.name)!r})"
        for f in fields(LMConfig)
        if f.name not in INIT_KEYS
        and getattr(settings.model, f.name) not in (getattr(default, f.name), getattr(base, f.name))
    ]
    if clash:
        raise ConfigError(f"init={settings.init} fixes the architecture; leave out {', '.join(clash)}")
    if settings.model.max_len > base.max_len:
        raise ConfigError(
            f"model.max_len ({settings.model.max_len}) is longer than init={settings.init}'s context "
            f"({base.max_len})"
        )
    config = replace(base, **{k: getattr(settings.model, k) for k in INIT_KEYS})
    if config.bos_id is None:  # a config without a usable start token: the corpus's (for samples)
        config = replace(config, bos_id=start_token(tok))
    if config.bos_id is None:
        raise QkvError(
            f"init={settings.init} names no start token and its tokenizer has neither a newline token "
            "nor a bos token: the samples at the end of the run would have nothing to start from"
        )
    model = DecoderLM(config)
    window = {
        k: v[: config.max_len] if k.startswith("positional.") else v
        for k, v in pretrained.state_dict().items()
    }
    model.load_state_dict(window)
    return model, tok


def start_token(tok) -> int | None:
    """The token an empty prompt starts from: the newline when it is one token (documents of
    the corpus start after one, and it is nanoGPT's choice), else ``bos``."""
    try:
        newline = tok.encode("\n")
    except QkvError:  # a character vocabulary without a newline
        newline = []
    return newline[0] if len(newline) == 1 else tok.bos_id


def next_token_nll(model: DecoderLM, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy (nats, a float32 scalar) of a batch and the number of
    targets it counts (padding, :data:`~qkv.data.text.IGNORE_INDEX`, left out).
    Shapes: ``x``, ``y`` ``(B, T)`` long, on any device (moved to the model's)."""
    device = next(model.parameters()).device
    count = int((y != IGNORE_INDEX).sum())  # before the move: no device sync
    logits = model(x.to(device)).logits  # (B, T, vocab)
    nll = F.cross_entropy(
        logits.flatten(0, 1).float(), y.to(device).flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )
    return nll, count


def split_nll(
    model: DecoderLM,
    data: LMData,
    block_size: int,
    max_batches: int | None = None,
    batch_windows: int = 128,
) -> tuple[float, int]:
    """Summed next-token NLL (nats) and token count over a split (:func:`eval_batches`)."""
    total, count = 0.0, 0
    for n, (x, y) in enumerate(eval_batches(data, block_size, batch_windows)):
        if max_batches is not None and n >= max_batches:
            break
        nll, targets = next_token_nll(model, x, y)
        total, count = total + float(nll), count + targets
    return total, count


def _metrics(nll: float, n_tokens: int, chars_per_token: float, prefix: str = "val_") -> dict:
    loss = nll / n_tokens
    return {
        f"{prefix}loss": loss,
        f"{prefix}ppl": math.exp(loss),
        f"{prefix}bits_per_token": loss / math.log(2),
        f"{prefix}bits_per_char": loss / chars_per_token / math.log(2),
    }


def corpus_record(train_text: str, val_text: str, settings: LMSettings) -> dict:
    """What a run trained on a text corpus keeps as ``data.json``: the corpus it named and the
    sha256 of its training and validation texts as split, so that a resume on other text, another
    split or token shards is refused (:func:`~qkv.runs.record.refuse_other_data`)."""
    named = {"corpus": settings.corpus, "val_corpus": settings.val_corpus}
    return {
        "path": {k: v if v is None else recorded_input(v, k) for k, v in named.items()},  # not compared
        "val_fraction": None if settings.val_corpus else settings.val_fraction,
        "train_sha256": hashlib.sha256(train_text.encode("utf-8")).hexdigest(),
        "val_sha256": hashlib.sha256(val_text.encode("utf-8")).hexdigest(),
    }


def changed_text(saved: dict, now: dict) -> list[str]:
    """The settings that another text of a resume (two :func:`corpus_record` records) is due to:
    ``val_corpus`` when the validation text is a file of its own in one of them or another file
    in both, ``val_fraction`` when the split of one corpus moved, ``corpus`` when the training
    text changed; none when ``saved`` is not such a record (token shards)."""
    if "train_sha256" not in saved:
        return []
    own = saved.get("val_fraction") is None, now["val_fraction"] is None
    if own[0] != own[1]:
        return ["val_corpus"]
    changed = [] if saved["train_sha256"] == now["train_sha256"] else ["corpus"]
    if all(own):
        return changed + (["val_corpus"] if saved["val_sha256"] != now["val_sha256"] else [])
    return ["val_fraction"] if saved["val_fraction"] != now["val_fraction"] else changed


class LMRun(TrainingRun):
    """``qkv train lm``: a corpus (or token shards, ``data=``) in random windows or whole
    sequences, next-token cross-entropy; the best validation loss kept; samples written to
    ``samples.txt``. With ``init``: a pretrained model continued (its validation scores before
    training kept in ``init.json``), optionally through LoRA adapters."""

    name = "lm"

    def setup(self) -> LMConfig:
        s = self.settings
        self.pretrained: DecoderLM | None = None
        if s.data is not None:
            self.train_data, self.val_data, self.chars_per_token = self._prepared(s.data)
        else:
            self.train_data, self.val_data, self.chars_per_token = self._corpus()
        tok = self.tokenizer
        logger.info(
            f"{s.corpus}: {num_tokens(self.train_data):,} training and {num_tokens(self.val_data):,} "
            f"validation tokens, {tok.kind} vocabulary of {tok.vocab_size}"
        )
        if self.pretrained is not None:
            return self.pretrained.config
        if s.init is not None:  # resumed: the weights come from the training state
            return LMConfig.load(self.run_dir / CONFIG)
        return s.model_config(tok)

    def _prepared(self, data: str) -> tuple[LMData, LMData, float]:
        """Token shards (``qkv prepare lm``): their tokenizer, splits and ``data.json`` record."""
        prepared = PreparedData.open(data, "lm")
        self.tokenizer = load_tokenizer(prepared.tokenizer_path)
        self.record = prepared_data_record(self.run_dir, prepared, self.resume, data)
        for name, split in (("training", prepared.train), ("validation", prepared.val)):
            check_stream(name, len(split), self.settings.model.max_len)
        meta = prepared.meta
        return prepared.train, prepared.val, meta["chars"]["val"] / meta["tokens"]["val"]

    def _corpus(self) -> tuple[LMData, LMData, float]:
        """The corpus in memory, with the run's tokenizer (a resumed run's), the init's, or a new one."""
        s, tok = self.settings, None
        if self.resume:
            tok = load_tokenizer(self.run_dir / TOKENIZER)
        elif s.init is not None:
            self.pretrained, tok = init_model(s)
        by_line = self.by_line(tok)  # a tokenizer built below (characters, BPE) never reads lines
        train_text, val_text = corpus_splits(s.corpus, s.val_corpus, s.val_fraction, by_line)
        self.record = corpus_record(train_text, val_text, s)
        if self.resume:
            refuse_other_data(
                self.run_dir,
                DATA,
                self.record,
                {"corpus": s.corpus, "val_corpus": s.val_corpus, "val_fraction": s.val_fraction},
                explain=changed_text,
            )
        if tok is None:
            tok = build_tokenizer(s.tokenizer, s.vocab_size, train_text + val_text, train_text)
        self.tokenizer = tok
        try:
            train_data, val_data = encode_splits(tok, train_text, val_text, s.model.max_len, by_line)
        except QkvError as exc:
            if s.init is None:
                raise
            raise QkvError(f"the corpus does not fit init={s.init}'s tokenizer: {exc}") from None
        return train_data, val_data, len(val_text) / num_tokens(val_data)

    def by_line(self, tok: Tokenizer | None) -> bool:
        """Whether the corpus is read one sequence per line (:func:`~qkv.data.lm.encode_corpus`):
        with a protein vocabulary (IgLM's)."""
        return reads_lines(tok)

    def new_run_files(self) -> dict[str, dict]:
        return {DATA: self.record}

    def build_model(self, config: LMConfig) -> DecoderLM:
        s = self.settings
        model = (self.pretrained or DecoderLM(config)).to(self.device)
        if isinstance(self.train_data, list) and isinstance(self.val_data, list):
            _warn_cut(self.train_data + self.val_data, config.max_len)
        self.zero_shot = self._zero_shot(model)
        if s.train.lora is not None:
            add_lora(model, s.train.lora)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        logger.info(
            f"model: {model.num_parameters() / 1e6:.2f} M parameters ({trainable:,} trained) on {self.device}"
        )
        self.block_size = config.max_len
        return model

    def batches(self, epoch: int) -> Sequence[torch.Tensor]:
        seed = self.settings.train.seed * 1000 + epoch
        return train_batches(self.train_data, self.settings.batch_size, self.block_size, seed)

    def loss(self, model, item) -> tuple[torch.Tensor, int]:
        return next_token_nll(model, *lm_batch(self.train_data, item, self.block_size))

    def validate(self, model) -> dict:
        nll, n = split_nll(model, self.val_data, self.block_size, self.settings.eval_limit)
        return _metrics(nll, n, self.chars_per_token)

    def summarize(self, model, state: LoopState) -> dict:
        s = self.settings
        with torch.no_grad():
            nll, n = split_nll(model, self.val_data, self.block_size, s.summary_limit)
        summary: dict = {"validation": {**_metrics(nll, n, self.chars_per_token), "tokens": n}}
        if self.zero_shot is not None:
            summary.update(init=s.init, init_validation=self.zero_shot)
        generator = TextGenerator(model, self.tokenizer, cpu=self.context.cpu)
        summary["samples"] = write_samples(generator, self.run_dir / "samples.txt", s)
        return summary

    def _zero_shot(self, model: DecoderLM) -> dict | None:
        """The validation scores of the starting checkpoint (``init``), before any training
        step: measured when the run starts and kept in ``init.json`` (a resumed run reads them
        back); ``None`` for a run from random weights."""
        s = self.settings
        if s.init is None:
            return None
        path = self.run_dir / "init.json"
        if self.resume and path.is_file():
            return runs.run_json(self.run_dir, "init.json")["validation"]
        model.eval()
        with torch.no_grad():
            nll, n = split_nll(model, self.val_data, model.config.max_len, s.eval_limit)
        scores = _metrics(nll, n, self.chars_per_token)
        self.save_json("init.json", {"init": s.init, "validation": scores})
        logger.info(
            f"init={s.init} before training: validation loss {scores['val_loss']:.4f} "
            f"(ppl {scores['val_ppl']:.2f})"
        )
        return scores


def _warn_cut(sequences: list[torch.Tensor], block_size: int) -> None:
    """Warn that sequences longer than the context are trained and scored on their start only."""
    long = sum(len(s) > block_size + 1 for s in sequences)
    if long:
        logger.warning(
            f"{long} of {len(sequences)} sequences are longer than model.max_len ({block_size}) + 1 "
            "tokens: only their start is trained and scored (a larger model.max_len, up to the "
            "checkpoint's context, keeps them whole)"
        )


def write_samples(generator: TextGenerator, path: Path, settings: LMSettings) -> list[str]:
    """``num_samples`` samples from the start token, written to ``path`` (nanoGPT's sample.py
    settings by default: temperature 0.8, top-k 200)."""
    with warnings.catch_warnings():  # samples outgrow the context by design (as nanoGPT's): it slides
        warnings.filterwarnings("ignore", message="context longer than the model's max_len")
        texts = generator.generate(
            [""] * settings.num_samples,
            settings.sample_tokens,
            temperature=settings.temperature,
            top_k=settings.top_k,
            seed=settings.train.seed,
        )
    header = (
        f"# {settings.num_samples} samples, {settings.sample_tokens} tokens each, from the start "
        f"token; temperature {settings.temperature}, top-k {settings.top_k}, seed {settings.train.seed}\n"
    )
    write_text(path, header + "\n---------------\n".join(texts) + "\n")
    return texts


def run_split(run_dir: str | Path, tok, split: str) -> tuple[LMData, float]:
    """A language-model run's corpus split (``"val"`` or ``"train"``) as the run read it (its
    token shards, or its corpus split again with its tokenizer, one sequence per line where
    training read it so: a ``by_line`` setting or a protein vocabulary), and its characters
    per token.

    Raises:
        QkvError: an unknown split, a missing corpus or shard directory.
    """
    meta = runs.RunInfo.read(run_dir).settings
    if split not in ("val", "train"):
        raise QkvError(f"unknown split {split!r} for a language model; choose val or train")
    if meta.get("data"):  # token shards (qkv prepare lm): the whole split, read from disk
        prepared = PreparedData.open(meta["data"], "lm")
        shard = prepared.val if split == "val" else prepared.train
        return shard, prepared.meta["chars"][split] / len(shard)
    by_line = bool(meta.get("by_line")) or reads_lines(tok)
    train_text, val_text = corpus_splits(
        meta["corpus"], meta.get("val_corpus"), meta["val_fraction"], by_line
    )
    text = val_text if split == "val" else train_text
    data = encode_corpus(tok, text, by_line)
    return data, len(text) / num_tokens(data)


def evaluate_run(
    run_dir: str | Path,
    split: str = "val",
    device: torch.device | str = "cpu",
) -> dict:
    """Loss, perplexity, bits per token and per character of a run on its corpus split
    (``"val"`` or ``"train"``), every token predicted once (consecutive windows, or whole
    sequences for a protein corpus: :func:`~qkv.data.lm.eval_batches`): ``{"split", "loss",
    "ppl", "bits_per_token", "bits_per_char", "tokens"}``, the names every recipe's evaluation
    gives these quantities (the split is named once, not in each key)."""
    model, tok = runs.load_run(run_dir, device=device, family="lm")
    data, chars_per_token = run_split(run_dir, tok, split)
    with torch.no_grad():
        nll, n = split_nll(model, data, model.config.max_len)
    return {"split": split, **_metrics(nll, n, chars_per_token, prefix=""), "tokens": n}


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train lm`` shows at the end: a sample and the validation scores."""
    val = summary["validation"]
    before = summary.get("init_validation")
    start = (
        f"{summary['init']} before training: validation loss {before['val_loss']:.4f} "
        f"(ppl {before['val_ppl']:.2f}); "
        if before
        else ""
    )
    return (
        f"sample:\n{summary['samples'][0]}\n\n{start}"
        f"validation loss {val['val_loss']:.4f} (ppl {val['val_ppl']:.2f}, "
        f"{val['val_bits_per_char']:.3f} bits/char) {closing_sentence(summary, run_dir)}"
    )


RECIPE = Recipe(
    name="lm",
    settings=LMSettings,
    train=LMRun.train,
    evaluate=evaluate_run,
    splits=("val", "train"),
    summary=summary_text,
    model_type=DECODER_LM,
    explainer=LMExplainer,
    inputs="text",
    adapters=True,
)
