"""Recipe: train a decoder-only language model on a text corpus (default tiny-shakespeare,
character level, nanoGPT's split and CPU "baby GPT" settings so numbers compare).

Flow: load the corpus → first 90 % train / last 10 % validation → character vocabulary (or
BPE) → random ``block_size`` windows → :func:`qkv.train.loop.train_loop` (cross-entropy on the
next token, AdamW with weight decay on matrices only, warm-up + cosine decay) → the weights
with the best validation loss → ``model.safetensors`` → ``samples.txt``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F

from .. import runs
from ..data.text import consecutive_windows, load_corpus, random_windows, split_train_val, windows_at
from ..data.tokenizers import CharTokenizer, SubwordTokenizer, load_tokenizer
from ..errors import ConfigError, QkvError
from ..explain.explainers import LMExplainer
from ..generate.lm import TextGenerator
from ..models.config import LMConfig
from ..models.decoder_lm import DecoderLM
from ..models.model_types import DECODER_LM
from ..train import distributed
from ..train.checkpoint import write_json, write_text
from ..train.settings import TrainSettings
from .base import Recipe
from .common import fit, keep_best, prepare_run_dir, require_at_least_one, start_run, write_settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class LMRecipe:
    """Settings of ``qkv train lm``: ``model`` (an :class:`LMConfig`; ``model.max_len`` is the
    context, nanoGPT's ``block_size``), ``train`` (:class:`TrainSettings`: AdamW, warm-up +
    cosine decay), and the data fields.

    Defaults reproduce nanoGPT's CPU tiny-shakespeare run (``train_shakespeare_char.py`` with
    ``n_layer=4 n_head=4 n_embd=128 block_size=64 batch_size=12 max_iters=2000
    lr_decay_iters=2000 dropout=0``). ``corpus``: ``"tinyshakespeare"`` or a UTF-8 text file.
    ``tokenizer``: ``"char"`` or ``"bpe"`` (``vocab_size`` pieces). ``batch_size``: windows per
    micro-batch. ``eval_batches``: number of 128-window batches for validation (``None`` = the
    whole split). The samples file uses ``num_samples``, ``sample_tokens``, ``temperature``,
    ``top_k``.
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

    def __post_init__(self) -> None:
        self.train.lr_schedule(self.model.d_model)  # a cosine schedule needs an end
        require_at_least_one(
            self, "batch_size", "vocab_size", "eval_batches", "num_samples", "sample_tokens", "top_k"
        )
        if not self.temperature > 0.0:
            raise ConfigError(f"temperature ({self.temperature}) must be > 0")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"val_fraction ({self.val_fraction}) must be in (0, 1)")

    def model_config(self, tok) -> LMConfig:
        """``model`` with the tokenizer's vocabulary and start token."""
        return replace(self.model, vocab_size=tok.vocab_size, bos_id=start_token(tok))


def _build_tokenizer(recipe: LMRecipe, text: str, train_text: str):
    if recipe.tokenizer == "char":
        return CharTokenizer.train(text)  # nanoGPT's vocabulary: every character of the corpus
    # Byte-level BPE keeps newlines and spacing; it sees paragraphs, so merges stay within them.
    return SubwordTokenizer.train(train_text.split("\n\n"), recipe.vocab_size, byte_level=True)


def _encode(tok, text: str) -> torch.Tensor:
    return torch.tensor(tok.encode(text), dtype=torch.long)


def start_token(tok) -> int | None:
    """The token an empty prompt starts from: the newline when it is one token (documents of
    the corpus start after one, and it is nanoGPT's choice), else ``bos``."""
    try:
        newline = tok.encode("\n")
    except QkvError:  # a character vocabulary without a newline
        newline = []
    return newline[0] if len(newline) == 1 else tok.bos_id


def split_nll(
    model: DecoderLM,
    data: torch.Tensor,
    block_size: int,
    max_batches: int | None = None,
    batch_windows: int = 128,
) -> tuple[float, int]:
    """Summed next-token NLL (nats) and token count over consecutive windows of ``data``."""
    device = next(model.parameters()).device
    offsets = consecutive_windows(data, block_size)
    total, count = 0.0, 0
    for n, start in enumerate(range(0, len(offsets), batch_windows)):
        if max_batches is not None and n >= max_batches:
            break
        x, y = windows_at(data, offsets[start : start + batch_windows], block_size)
        logits = model(x.to(device)).logits
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), reduction="sum"))
        count += y.numel()
    return total, count


def _metrics(nll: float, n_tokens: int, chars_per_token: float, prefix: str = "val_") -> dict:
    loss = nll / n_tokens
    return {
        f"{prefix}loss": loss,
        f"{prefix}ppl": math.exp(loss),
        f"{prefix}bits_per_token": loss / math.log(2),
        f"{prefix}bits_per_char": loss / chars_per_token / math.log(2),
    }


def train_lm(recipe: LMRecipe, run_dir: str | Path, resume: bool = False, progress: bool = True) -> dict:
    """Train, keep the best-on-validation weights, write samples. Returns a summary dict.

    Raises:
        QkvError: bad corpus, an existing run directory without ``resume``, etc.
    """
    t_start = time.perf_counter()
    run_dir = prepare_run_dir(run_dir, resume, "lm")
    run = start_run(recipe.train)
    device = run.device
    text = load_corpus(recipe.corpus)
    train_text, val_text = split_train_val(text, recipe.val_fraction)
    tok_path = run_dir / "tokenizer.json"
    tok = load_tokenizer(tok_path) if resume else _build_tokenizer(recipe, text, train_text)
    train_data, val_data = _encode(tok, train_text), _encode(tok, val_text)
    for name, data in (("training", train_data), ("validation", val_data)):  # checked before any write
        if len(data) <= recipe.model.max_len:
            raise QkvError(
                f"the {name} split has {len(data)} tokens, too few for windows of model.max_len "
                f"{recipe.model.max_len} (a longer corpus, or a smaller model.max_len)"
            )
    if not resume:
        tok.save(tok_path)
    chars_per_token = len(val_text) / len(val_data)
    model_cfg = recipe.model_config(tok)
    write_settings(run_dir, "lm", recipe, model_cfg, run, resume)
    logger.info(
        f"{recipe.corpus}: {len(train_data):,} training and {len(val_data):,} validation tokens, "
        f"{tok.kind} vocabulary of {tok.vocab_size}"
    )
    model = DecoderLM(model_cfg).to(device)
    logger.info(f"model: {model.num_parameters() / 1e6:.2f} M parameters on {device}")
    block_size = model_cfg.max_len
    steps_per_epoch = max(1, len(train_data) // (recipe.batch_size * block_size))

    def batches(epoch: int) -> list[torch.Tensor]:
        # An "epoch" is as many random windows as the split has tokens; fixed per epoch so a
        # resumed run sees the same batches.
        g = torch.Generator().manual_seed(recipe.train.seed * 1000 + epoch)
        return [random_windows(train_data, block_size, recipe.batch_size, g) for _ in range(steps_per_epoch)]

    def loss_fn(model, offsets):
        x, y = windows_at(train_data, offsets, block_size)
        logits = model(x.to(device)).logits
        loss = F.cross_entropy(logits.flatten(0, 1).float(), y.to(device).flatten(), reduction="sum")
        return loss, y.numel()

    def validate(model) -> dict:
        nll, n = split_nll(model, val_data, block_size, recipe.eval_batches)
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
    keep_best(model, run_dir)
    with torch.no_grad():
        nll, n = split_nll(model, val_data, block_size)
    summary = {
        "validation": {**_metrics(nll, n, chars_per_token), "tokens": n},
        "train_minutes": round(state.elapsed_s / 60, 2),
        "steps": state.step,
        "parameters": model.num_parameters(),
    }
    samples = write_samples(TextGenerator(model, tok), run_dir / "samples.txt", recipe)
    summary["samples"] = samples
    summary["total_minutes"] = round((time.perf_counter() - t_start) / 60, 2)
    write_json(run_dir / "summary.json", summary)
    return summary


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
    (``"val"`` or ``"train"``), every token predicted once (consecutive windows)."""
    run_dir = Path(run_dir)
    model, tok = runs.load_run(run_dir, weights, device, family="lm")
    meta = json.loads((run_dir / "train_config.json").read_text(encoding="utf-8"))
    if split not in ("val", "train"):
        raise QkvError(f"unknown split {split!r} for a language model; choose val or train")
    train_text, val_text = split_train_val(load_corpus(meta["corpus"]), meta["val_fraction"])
    text = val_text if split == "val" else train_text
    data = _encode(tok, text)
    with torch.no_grad():
        nll, n = split_nll(model, data, model.config.max_len)
    metrics = _metrics(nll, n, len(text) / len(data), prefix="")
    return {"split": split, f"{split}_loss": metrics.pop("loss"), **metrics, "tokens": n}


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train lm`` shows at the end: a sample and the validation scores."""
    val = summary["validation"]
    return (
        f"sample:\n{summary['samples'][0]}\n\n"
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
)
