"""Recipe: train a decoder-only language model on a text corpus (default tiny-shakespeare,
character level, nanoGPT's split and CPU "baby GPT" settings so numbers compare).

Flow: load the corpus → first 90 % train / last 10 % validation → character vocabulary (or
BPE) → random ``block_size`` windows (a protein corpus: whole sequences, one per row) →
:func:`qkv.train.loop.train_loop` (cross-entropy on the next token, AdamW with weight decay on
matrices only, warm-up + cosine decay) → the weights with the best validation loss →
``model.safetensors`` → ``samples.txt``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Literal, TypeAlias

import torch
import torch.nn.functional as F

from .. import runs
from ..data.shards import PreparedData, Split
from ..data.text import (
    IGNORE_INDEX,
    WindowBatches,
    consecutive_windows,
    load_corpus,
    num_windows,
    sequence_batch,
    split_train_val,
    windows_at,
)
from ..data.tokenizers import CharTokenizer, SubwordTokenizer, Tokenizer, load_tokenizer
from ..errors import ConfigError, QkvError
from ..explain.explainers import LMExplainer
from ..generate.lm import TextGenerator
from ..models.config import LMConfig
from ..models.decoder_lm import DecoderLM
from ..models.model_types import DECODER_LM
from ..train import distributed
from ..train.adapters import add_lora
from ..train.checkpoint import write_json, write_text
from ..train.settings import TrainSettings
from .base import Recipe
from .common import (
    NOT_THE_RUNS_DATA,
    fit,
    keep_best,
    prepare_run_dir,
    prepared_data_record,
    require_at_least_one,
    start_run,
    write_settings,
)

logger = logging.getLogger(__name__)


# what a prepared data directory fixes (qkv prepare lm), and the validation batches read from one
DATA_KEYS = ("corpus", "val_corpus", "tokenizer", "vocab_size", "val_fraction")
SHARD_EVAL_BATCHES = 100


@dataclass(frozen=True, kw_only=True)
class LMRecipe:
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
            default = LMRecipe()
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

    def model_config(self, tok) -> LMConfig:
        """``model`` with the tokenizer's vocabulary and start token."""
        return replace(self.model, vocab_size=tok.vocab_size, bos_id=start_token(tok))


def _build_tokenizer(recipe: LMRecipe, text: str, train_text: str):
    if recipe.tokenizer == "char":
        return CharTokenizer.train(text)  # nanoGPT's vocabulary: every character of the corpus
    # Byte-level BPE keeps newlines and spacing; it sees paragraphs, so merges stay within them.
    return SubwordTokenizer.train(train_text.split("\n\n"), recipe.vocab_size, byte_level=True)


def corpus_splits(
    corpus: str, val_corpus: str | None, val_fraction: float, by_line: bool = False
) -> tuple[str, str]:
    """``(training text, validation text)``: ``val_corpus`` when given, else the last
    ``val_fraction`` of ``corpus``'s characters (nanoGPT's split), moved to the next line break
    when the corpus is read ``by_line`` (one sequence per line: no sequence is cut in two).
    Raises :class:`QkvError` for a missing, unreadable or empty file."""
    text = load_corpus(corpus)
    if val_corpus is not None:
        return text, load_corpus(val_corpus)
    train_text, val_text = split_train_val(text, val_fraction)
    if by_line and "\n" in val_text:
        cut = len(train_text) + val_text.index("\n") + 1
        train_text, val_text = text[:cut], text[cut:]
    return train_text, val_text


def reads_lines(tok) -> bool:
    """Whether :func:`encode_corpus` reads a corpus one sequence per line with ``tok``: a
    protein vocabulary's (IgLM's)."""
    return bool(getattr(tok, "is_residue_vocabulary", False))


# a corpus as token ids: one stream ``(n,)`` in memory or on disk, or one tensor ``(L_i,)`` per sequence
LMData: TypeAlias = torch.Tensor | Split | list[torch.Tensor]


def encode_corpus(tok, text: str) -> LMData:
    """Token ids (int64) of a corpus. With a protein vocabulary (IgLM's) every line is one
    sequence, tags included (``[HEAVY] [HUMAN] EVQLV...``), followed by the vocabulary's end
    token (``[SEP]``: how IgLM scores a whole sequence), and the result is one tensor per
    sequence: such a model was trained on one sequence per row from position 0, and is trained
    and scored so (:func:`~qkv.data.text.sequence_batch`). Other tokenizers read the text as
    one stream ``(n,)``, newlines included, cut into windows.

    Raises:
        QkvError: characters the tokenizer does not know: a character vocabulary names them; a
            pretrained vocabulary's unknown token is refused too (the model would learn from a
            token that stands for anything).
    """
    rows = None
    if reads_lines(tok):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        end = tok.sep_id if tok.sep_id is not None else tok.eos_id
        rows = [[*row, end] for row in tok.encode_batch(lines, add_special_tokens=False)]
        ids = [i for row in rows for i in row]
    else:
        ids = tok.encode(text, add_special_tokens=False)
    unk = getattr(tok, "unk_id", None)
    if unk is not None and unk in ids:
        raise QkvError(
            f"{ids.count(unk)} token(s) are unknown to the tokenizer ({tok.id_to_token(unk)}), the "
            f"first at token {ids.index(unk)}"
        )
    if rows is not None:
        return [torch.tensor(row, dtype=torch.long) for row in rows]
    return torch.tensor(ids, dtype=torch.long)


def num_tokens(data: LMData) -> int:
    """Tokens in an encoded corpus (:func:`encode_corpus`), end tokens included."""
    return sum(len(s) for s in data) if isinstance(data, list) else len(data)


def lm_batch(data: LMData, item: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` ``(B, T)`` of one batch: ``item`` holds window offsets into a stream
    (:func:`~qkv.data.text.windows_at`, ``T = block_size``) or indices of sequences
    (:func:`~qkv.data.text.sequence_batch`, ``T`` up to ``block_size``, padding targets
    :data:`~qkv.data.text.IGNORE_INDEX`)."""
    if isinstance(data, list):
        return sequence_batch([data[i] for i in item.tolist()], block_size)
    return windows_at(data, item, block_size)


def eval_batches(data: LMData, block_size: int, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, y)`` batches that predict every token of a split once: consecutive windows of a
    stream (made batch by batch: a split on disk is never held whole), or whole sequences
    (shortest first, little padding), ``batch`` at a time."""
    if isinstance(data, list):
        order = torch.tensor(sorted(range(len(data)), key=lambda i: len(data[i])), dtype=torch.long)
        for start in range(0, len(order), batch):
            yield lm_batch(data, order[start : start + batch], block_size)
        return
    for start in range(0, num_windows(len(data), block_size), batch):
        yield lm_batch(data, consecutive_windows(len(data), block_size, start, batch), block_size)


# the model keys a run started from a checkpoint may set (the rest is the checkpoint's)
INIT_KEYS = ("max_len", "dropout", "attention_dropout", "activation_dropout")


def init_model(recipe: LMRecipe) -> tuple[DecoderLM, Tokenizer]:
    """``(model, tokenizer)`` of ``recipe.init``: the pretrained decoder with the recipe's window
    (``model.max_len``) and dropouts, its weights loaded (a learned position table cut to the
    window), in training mode, on the CPU.

    Raises:
        QkvError: ``init`` is not a language model, or not found (:func:`qkv.hub.pretrained.load`).
        ConfigError: ``model.max_len`` beyond the checkpoint's context, or another ``model`` key
            that contradicts the checkpoint.
    """
    from ..hub.pretrained import load

    assert recipe.init is not None
    pretrained, tok = load(recipe.init)
    if not isinstance(pretrained, DecoderLM):
        raise QkvError(f"init={recipe.init} is not a language model (a {type(pretrained).__name__})")
    base, default = pretrained.config, LMConfig()
    clash = [
        f"model.{f.name}={getattr(recipe.model, f.name)!r} (the checkpoint's: {getattr(base, f.name)!r})"
        for f in fields(LMConfig)
        if f.name not in INIT_KEYS
        and getattr(recipe.model, f.name) not in (getattr(default, f.name), getattr(base, f.name))
    ]
    if clash:
        raise ConfigError(f"init={recipe.init} fixes the architecture; leave out {', '.join(clash)}")
    if recipe.model.max_len > base.max_len:
        raise ConfigError(
            f"model.max_len ({recipe.model.max_len}) is longer than init={recipe.init}'s context "
            f"({base.max_len})"
        )
    config = replace(base, **{k: getattr(recipe.model, k) for k in INIT_KEYS})
    if config.bos_id is None:  # a config without a usable start token: the corpus's (for samples)
        config = replace(config, bos_id=start_token(tok))
    if config.bos_id is None:
        raise QkvError(
            f"init={recipe.init} names no start token and its tokenizer has neither a newline token "
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


def _load_data(recipe: LMRecipe, run_dir: Path, resume: bool):
    """``(pretrained model or None, tokenizer, training data, validation data, characters per
    validation token)``, checked before anything is written; the tokenizer is saved in a new
    run (and a prepared directory's record as ``data.json``)."""
    tok_path = run_dir / "tokenizer.json"
    pretrained, tok = None, None
    if recipe.data is not None:
        prepared = PreparedData.open(recipe.data, "lm")
        tok = load_tokenizer(prepared.tokenizer_path)
        record = prepared_data_record(run_dir, prepared, resume, recipe.data)
        if resume and tok_path.read_bytes() != prepared.tokenizer_path.read_bytes():
            raise QkvError(f"data={recipe.data} {NOT_THE_RUNS_DATA}")
        for name, split in (("training", prepared.train), ("validation", prepared.val)):
            _check_stream(name, len(split), recipe.model.max_len)
        meta = prepared.meta
        if not resume:
            tok.save(tok_path)
            write_json(run_dir / "data.json", record)
        return None, tok, prepared.train, prepared.val, meta["chars"]["val"] / meta["tokens"]["val"]
    if resume:
        tok = load_tokenizer(tok_path)
    elif recipe.init is not None:
        pretrained, tok = init_model(recipe)
    train_text, val_text = corpus_splits(
        recipe.corpus, recipe.val_corpus, recipe.val_fraction, reads_lines(tok)
    )
    if tok is None:
        tok = _build_tokenizer(recipe, train_text + val_text, train_text)
    try:
        train_data, val_data = encode_corpus(tok, train_text), encode_corpus(tok, val_text)
    except QkvError as exc:
        if recipe.init is None:
            raise
        raise QkvError(f"the corpus does not fit init={recipe.init}'s tokenizer: {exc}") from None
    for name, data in (("training", train_data), ("validation", val_data)):  # checked before any write
        if isinstance(data, list):
            if not data:
                raise QkvError(f"the {name} split has no sequences (one per line)")
        else:
            _check_stream(name, len(data), recipe.model.max_len)
    if not resume:
        tok.save(tok_path)
    return pretrained, tok, train_data, val_data, len(val_text) / num_tokens(val_data)


def _check_stream(name: str, n_tokens: int, max_len: int) -> None:
    if n_tokens <= max_len:
        raise QkvError(
            f"the {name} split has {n_tokens} tokens, too few for windows of model.max_len "
            f"{max_len} (a longer corpus, or a smaller model.max_len)"
        )


def train_lm(recipe: LMRecipe, run_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train, keep the best-on-validation weights, write samples. Returns a summary dict.

    Raises:
        QkvError: bad corpus, an existing run directory without ``resume``, etc.
    """
    t_start = time.perf_counter()
    run_dir = prepare_run_dir(run_dir, resume, "lm")
    run = start_run(recipe.train)
    device = run.device
    pretrained, tok, train_data, val_data, chars_per_token = _load_data(recipe, run_dir, resume)
    if pretrained is not None:
        model_cfg = pretrained.config
    elif recipe.init is not None:  # resumed: the weights come from the training state
        model_cfg = LMConfig.load(run_dir / "config.json")
    else:
        model_cfg = recipe.model_config(tok)
    write_settings(run_dir, "lm", recipe, model_cfg, run, resume)
    logger.info(
        f"{recipe.corpus}: {num_tokens(train_data):,} training and {num_tokens(val_data):,} "
        f"validation tokens, {tok.kind} vocabulary of {tok.vocab_size}"
    )
    model = (pretrained or DecoderLM(model_cfg)).to(device)
    block_size = model_cfg.max_len
    if isinstance(train_data, list) and isinstance(val_data, list):
        _warn_cut(train_data + val_data, block_size)
    zero_shot = _zero_shot(model, val_data, chars_per_token, recipe, run_dir, resume)
    if recipe.train.lora is not None:
        add_lora(model, recipe.train.lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info(f"model: {model.num_parameters() / 1e6:.2f} M parameters ({trainable:,} trained) on {device}")

    def batches(epoch: int) -> Sequence[torch.Tensor]:
        # Fixed per epoch so a resumed run sees the same batches. Sequences: each once, shuffled;
        # a stream: as many random windows as the split has tokens.
        seed = recipe.train.seed * 1000 + epoch
        if isinstance(train_data, list):
            g = torch.Generator().manual_seed(seed)
            return list(torch.randperm(len(train_data), generator=g).split(recipe.batch_size))
        steps = max(1, len(train_data) // (recipe.batch_size * block_size))
        return WindowBatches(len(train_data), block_size, recipe.batch_size, steps, seed)

    def loss_fn(model, item):
        return next_token_nll(model, *lm_batch(train_data, item, block_size))

    def validate(model) -> dict:
        nll, n = split_nll(model, val_data, block_size, recipe.eval_limit)
        return _metrics(nll, n, chars_per_token)

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
    trained = keep_best(model, run_dir, recipe.train.lora)
    with torch.no_grad():
        # the whole split, as far as a prepared one is not too large for it (the same cap at any size)
        nll, n = split_nll(model, val_data, block_size, None if recipe.data is None else SHARD_EVAL_BATCHES)
    summary = {
        "validation": {**_metrics(nll, n, chars_per_token), "tokens": n},
        "train_minutes": round(state.elapsed_s / 60, 2),
        "steps": state.step,
        "parameters": model.num_parameters(),
        "trainable_parameters": trained,
    }
    if zero_shot is not None:
        summary.update(init=recipe.init, init_validation=zero_shot)
    samples = write_samples(TextGenerator(model, tok), run_dir / "samples.txt", recipe)
    summary["samples"] = samples
    summary["total_minutes"] = round((time.perf_counter() - t_start) / 60, 2)
    write_json(run_dir / "summary.json", summary)
    return summary


def _warn_cut(sequences: list[torch.Tensor], block_size: int) -> None:
    """Warn that sequences longer than the context are trained and scored on their start only."""
    long = sum(len(s) > block_size + 1 for s in sequences)
    if long:
        logger.warning(
            f"{long} of {len(sequences)} sequences are longer than model.max_len ({block_size}) + 1 "
            "tokens: only their start is trained and scored (a larger model.max_len, up to the "
            "checkpoint's context, keeps them whole)"
        )


def _zero_shot(
    model: DecoderLM,
    val_data: LMData,
    chars_per_token: float,
    recipe: LMRecipe,
    run_dir: Path,
    resume: bool,
) -> dict | None:
    """The validation scores of the starting checkpoint (``init``), before any training step:
    measured when the run starts and kept in ``init.json`` (a resumed run reads them back);
    ``None`` for a run from random weights."""
    if recipe.init is None:
        return None
    path = run_dir / "init.json"
    if resume and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))["validation"]
    model.eval()
    with torch.no_grad():
        nll, n = split_nll(model, val_data, model.config.max_len, recipe.eval_limit)
    scores = _metrics(nll, n, chars_per_token)
    write_json(path, {"init": recipe.init, "validation": scores})
    logger.info(
        f"init={recipe.init} before training: validation loss {scores['val_loss']:.4f} "
        f"(ppl {scores['val_ppl']:.2f})"
    )
    return scores


def write_samples(generator: TextGenerator, path: Path, recipe: LMRecipe) -> list[str]:
    """``num_samples`` samples from the start token, written to ``path`` (nanoGPT's sample.py
    settings by default: temperature 0.8, top-k 200)."""
    texts = generator.generate(
        [""] * recipe.num_samples,
        recipe.sample_tokens,
        temperature=recipe.temperature,
        top_k=recipe.top_k,
        seed=recipe.train.seed,
    )
    header = (
        f"# {recipe.num_samples} samples, {recipe.sample_tokens} tokens each, from the start "
        f"token; temperature {recipe.temperature}, top-k {recipe.top_k}, seed {recipe.train.seed}\n"
    )
    write_text(path, header + "\n---------------\n".join(texts) + "\n")
    return texts


def evaluate_lm_run(
    run_dir: str | Path,
    split: str = "val",
    device: torch.device | str = "cpu",
    weights: str = "model.safetensors",
) -> dict:
    """Loss, perplexity, bits per token and per character of a run on its corpus split
    (``"val"`` or ``"train"``), every token predicted once (consecutive windows, or whole
    sequences for a protein corpus: :func:`eval_batches`)."""
    run_dir = Path(run_dir)
    model, tok = runs.load_run(run_dir, weights, device, family="lm")
    meta = json.loads((run_dir / "train_config.json").read_text(encoding="utf-8"))
    if split not in ("val", "train"):
        raise QkvError(f"unknown split {split!r} for a language model; choose val or train")
    data: LMData
    if meta.get("data"):  # token shards (qkv prepare lm): the whole split, read from disk
        prepared = PreparedData.open(meta["data"], "lm")
        data = prepared.val if split == "val" else prepared.train
        chars_per_token = prepared.meta["chars"][split] / len(data)
    else:
        train_text, val_text = corpus_splits(
            meta["corpus"], meta.get("val_corpus"), meta["val_fraction"], reads_lines(tok)
        )
        text = val_text if split == "val" else train_text
        data = encode_corpus(tok, text)
        chars_per_token = len(text) / num_tokens(data)
    with torch.no_grad():
        nll, n = split_nll(model, data, model.config.max_len)
    metrics = _metrics(nll, n, chars_per_token, prefix="")
    return {"split": split, f"{split}_loss": metrics.pop("loss"), **metrics, "tokens": n}


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
        f"{val['val_bits_per_char']:.3f} bits/char) after {summary['train_minutes']:.1f} min "
        f"and {summary['steps']} steps; run directory: {Path(run_dir).resolve()}"
    )


RECIPE = Recipe(
    name="lm",
    settings=LMRecipe,
    train=train_lm,
    evaluate=evaluate_lm_run,
    splits=("val", "train"),
    summary=summary_text,
    model_type=DECODER_LM,
    explainer=LMExplainer,
    inputs="text",
    adapters=True,
)
