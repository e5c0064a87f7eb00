"""Recipe: train the encoder-decoder Transformer on Multi30k (default German → English), and
its recurrent baseline (``qkv train translation-rnn``: the same data, BPE, batches, loop and
decoding around :class:`~qkv.models.rnn.RNNSeq2Seq`).

Flow: load Multi30k → train a joint BPE on the training split → token-count batches →
:func:`qkv.train.loop.train_loop` (label-smoothed loss, Adam + the paper's warm-up schedule) →
choose among the last, best and averaged checkpoints on a *validation* figure (``select``,
chrF by default) → write ``model.safetensors`` → score the test split with beam search.
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar, cast

import torch

from ..data.batching import make_batch, token_batches
from ..data.parallel import PAIRS_FILE, ParallelData, file_record, read_pairs, split_pairs
from ..data.tokenizers import SubwordTokenizer
from ..data.translation import SPLITS, encode_pairs, eval_batches, fitting_pairs, load_multi30k
from ..errors import ConfigError, QkvError
from ..evaluate.bleu import residue_recovery, translation_scores
from ..explain.explainers import RNNTranslationExplainer, TranslationExplainer
from ..files import load_weights, read_json, save_weights
from ..inference.translator import SEQ2SEQ_RECIPES, Translator, run_decoding_of
from ..models.config import RNNConfig, TransformerConfig
from ..models.model_types import RNN_SEQ2SEQ, TRANSFORMER, for_config
from ..models.rnn import RNNSeq2Seq
from ..models.transformer import Transformer
from ..runs import load_run, run_settings
from ..runs.layout import AVERAGED, BEST, LAST, TOKENIZER, WEIGHTS, run_file
from ..runs.record import refuse_other_data
from ..train.checkpointer import average_weights
from ..train.loop import LoopState
from ..train.losses import label_smoothed_nll
from ..train.run import TrainingRun
from ..train.train_settings import TrainSettings
from .common import require_at_least_one, run_directory, trained_for
from .recipe import Recipe

logger = logging.getLogger(__name__)

# the vocabularies of a run on its own pairs: the joint BPE, one piece per residue, or chosen by the data
TOKENIZERS = ("auto", "bpe", "amino-acid")
SELECT = ("chrf", "bleu", "exact", "loss")  # validation figures that can pick the weights kept


# The demo's training: a 10-minute budget, the rate decaying linearly to 0 at its end.
DEMO_TRAIN = TrainSettings(
    schedule="linear",
    lr=2e-3,
    warmup_steps=100,
    min_lr_ratio=0.0,
    beta2=0.98,
    eps=1e-9,
    max_minutes=10.0,
    eval_every=1000,
    snapshot_minutes=1.0,
    keep_snapshots=3,
)


@dataclass(frozen=True, kw_only=True)
class TranslationSettings:
    """Settings of ``qkv train translation``: ``model`` (a :class:`TransformerConfig`; its
    vocabulary is the joint BPE's, set at run time), ``train`` (:class:`TrainSettings`), and the
    data fields: ``src_lang``/``tgt_lang``, ``vocab_size`` (joint BPE pieces),
    ``max_train_tokens`` (longer training pairs are dropped), ``train_limit``/``val_limit``
    (first N pairs; smoke runs), ``label_smoothing`` (§5.4), ``max_tokens`` (padded tokens per
    micro-batch), ``val_bleu`` (decode the validation set greedily at each validation: BLEU,
    chrF and exact match; else only the loss), ``select`` (the validation figure that picks
    ``best.safetensors`` and the final weights among last, best and averaged: ``chrf``,
    ``bleu``, ``exact`` or ``loss``; ties go to the lower validation loss; default ``chrf``, or
    ``loss`` when ``val_bleu`` is off: chrF counts character n-grams, so it ranks one-word and
    one-chain targets, where corpus BLEU finds no 2- to 4-grams and scores every candidate 0),
    the test decoding's ``beam_size`` and length penalty ``alpha`` (§6.1), and ``test``
    (score the test split at the end; ``false`` for sweeps, which choose on validation only).

    A user's own pairs instead of Multi30k (:mod:`qkv.data.parallel`): ``data`` (a TSV,
    ``source<TAB>target`` per line, or two named ``columns`` of a TSV with a header, e.g.
    ``columns=heavy,light``); ``val_data``/``test_data`` (files of the same form), else
    ``val_fraction``/``test_fraction`` of ``data`` held out, drawn by ``train.seed``, pairs
    sharing a source kept together; ``tokenizer``: ``bpe`` (the joint BPE), ``amino-acid`` (one
    piece per residue) or ``auto`` (amino-acid when every source and target is a protein
    sequence, else bpe). ``src_lang``/``tgt_lang`` are Multi30k's and ignored then.

    The defaults are the demo (``make demo``): a model and schedule chosen for a 10-minute
    budget on 2 CPU cores by sweeps on validation BLEU (``benchmarks/demo_sweep.py``, then
    ``benchmarks/multi30k_sweep.py``; tables in ``benchmarks/HISTORY.md``). It is small (d_model
    192, 3 + 3 pre-LN layers) so that it sees the training set a few times in small batches
    (many updates), and decays the learning rate linearly to 0 at the end of the time budget,
    whatever the machine's speed. In so few passes nothing overfits, so the demo drops the
    regularisers of §5.4 (dropout and label smoothing 0): each step is faster (no dropout masks,
    one softmax in the loss) and learns more. Its positions are rotary (RoFormer, Su et al.
    2021) instead of §3.5's added sinusoids: attention then sees only how far apart two tokens
    are, which §3.5 hoped the sinusoids would let it learn, and in the same steps it scored ~2.5
    validation BLEU more (issue 47's sweep). It validates every 1,000 steps: the clock runs
    through validation, and each greedy pass over the validation set costs steps.
    ``configs/multi30k_de_en.json`` is the same model given 1 hour, its regularisation back;
    the paper's recipe (post-LN, Eq. 3 schedule, sinusoids, d_model 384) is
    ``configs/paper_base.json``.
    """

    model: TransformerConfig = TransformerConfig(
        d_model=192,
        n_heads=4,
        d_ff=768,
        n_encoder_layers=3,
        n_decoder_layers=3,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        norm_first=True,
        share_embeddings=True,
        positional="rotary",
        max_len=256,
    )
    train: TrainSettings = DEMO_TRAIN
    src_lang: str = "de"
    tgt_lang: str = "en"
    vocab_size: int = 8000
    max_train_tokens: int = 100
    train_limit: int | None = None
    val_limit: int | None = None
    label_smoothing: float = 0.0
    max_tokens: int = 1024
    val_bleu: bool = True
    select: str | None = None
    beam_size: int = 4
    # chosen on validation BLEU of the demo's weights (issue 47): α 0.6 (§6.1) 40.01, 0.8 40.23,
    # 1.0 40.35, 1.2 40.51, 1.5 39.93; beam 6 or 8 added nothing at α 1.0
    alpha: float = 1.2
    test: bool = True
    data: str | None = None
    columns: str | None = None
    val_data: str | None = None
    test_data: str | None = None
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    tokenizer: str = "auto"

    name: ClassVar[str] = "translation"  # the recipe's name in the run directory
    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "src_lang",
        "tgt_lang",
        "data",
        "columns",
        "val_data",
        "test_data",
        "val_fraction",
        "test_fraction",
        "tokenizer",
        "vocab_size",
        "max_train_tokens",
        "train_limit",
    )
    # of those, what pairs.json compares by content (the same files moved resume)
    BY_CONTENT: ClassVar[tuple[str, ...]] = ("data", "val_data", "test_data")

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ConfigError(f"vocab_size ({self.vocab_size}) must be >= 8")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")
        require_at_least_one(self, "max_tokens", "beam_size", "max_train_tokens", "train_limit", "val_limit")
        if self.model.max_len < 2:
            raise ConfigError(f"model.max_len ({self.model.max_len}) must leave room for a token and eos")
        if self.select not in (None, *SELECT):
            raise ConfigError(f"select={self.select!r}: choose one of {', '.join(SELECT)}")
        if self.select not in (None, "loss") and not self.val_bleu:
            raise ConfigError(f"select={self.select} needs val_bleu=true (the validation set decoded)")
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"tokenizer={self.tokenizer!r}: choose one of {', '.join(TOKENIZERS)}")
        for name in ("val_fraction", "test_fraction"):
            if not 0.0 <= getattr(self, name) < 0.5:
                raise ConfigError(f"{name} ({getattr(self, name)}) must be in [0, 0.5)")
        if self.data is None:
            given = [k for k in ("columns", "val_data", "test_data") if getattr(self, k) is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} go with data=PAIRS.tsv (a file of your own pairs)")
            if self.tokenizer == "amino-acid":
                raise ConfigError("tokenizer=amino-acid reads protein pairs: give them as data=PAIRS.tsv")

    @property
    def selected(self) -> str:
        """The validation figure that picks the weights: ``select``, else ``chrf`` when the
        validation set is decoded (``val_bleu``) and ``loss`` when it is not."""
        return self.select or ("chrf" if self.val_bleu else "loss")

    def model_config(self, tok: SubwordTokenizer) -> TransformerConfig | RNNConfig:
        """``model`` with the joint vocabulary and the tokenizer's special ids."""
        return replace(
            self.model,
            src_vocab_size=tok.vocab_size,
            tgt_vocab_size=tok.vocab_size,
            pad_id=tok.pad_id,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
        )


@dataclass(frozen=True, kw_only=True)
class RNNTranslationSettings(TranslationSettings):
    """Settings of ``qkv train translation-rnn``: :class:`TranslationSettings`'s, around a
    recurrent model (``model``: an :class:`~qkv.models.config.RNNConfig`; ``model.attention``
    ``"additive"`` or ``"none"``, the bottleneck). The defaults are the attention GRU chosen for
    the same 10-minute budget as the demo by a sweep on validation BLEU
    (``benchmarks/why_attention.py sweep``; table in ``benchmarks/HISTORY.md``): d_model 256 and
    a peak learning rate of 1e-2 decaying linearly to 0 at the end of the budget (the bottleneck
    variant's best too). A short budget wants a high rate: 1e-3 reached a fifth of the BLEU.
    """

    model: RNNConfig = RNNConfig(d_model=256, dropout=0.2, share_embeddings=True)  # type: ignore[assignment]
    # the demo's budget and schedule; its own peak rate, and Adam's default epsilon
    train: TrainSettings = replace(DEMO_TRAIN, lr=1e-2, eps=1e-8)
    label_smoothing: float = 0.1  # as swept (issue 29), before the demo dropped it

    name: ClassVar[str] = "translation-rnn"


def _teacher_forced_nll(model: Transformer | RNNSeq2Seq, batches, pad_id: int) -> tuple[float, int]:
    """Summed NLL (nats) and target-token count of ``model`` over ``batches``."""
    device = next(model.parameters()).device
    nll, n = 0.0, 0
    for batch in batches:
        logits = model(batch.src.to(device), batch.tgt_in.to(device)).logits
        nll += float(label_smoothed_nll(logits, batch.tgt_out.to(device), 0.0, pad_id)[1])
        n += batch.n_tgt_tokens
    return nll, n


class TranslationRun(TrainingRun):
    """``qkv train translation`` and ``translation-rnn``: Multi30k pairs, the joint BPE, batches
    of similar-length pairs, the label-smoothed loss (§5.4); validation loss and greedy BLEU;
    the final weights chosen on validation among the last, best and averaged (§6.1); test2016
    scored with beam search."""

    def __init__(self, settings: TranslationSettings, *args, **kwargs) -> None:
        super().__init__(settings, *args, **kwargs)
        self.name = settings.name
        self.score_key = f"val_{settings.selected}"
        self.higher_is_better = settings.selected != "loss"

    def setup(self) -> TransformerConfig | RNNConfig:
        s = self.settings
        if s.data is None:
            train_src, train_tgt = load_multi30k("train", s.src_lang, s.tgt_lang)
            val_src, val_tgt = load_multi30k("val", s.src_lang, s.tgt_lang)
            kind, source = "bpe", f"Multi30k {s.src_lang}->{s.tgt_lang}"
        else:
            train, val = self.own
            kind = self.record["tokenizer"]
            train_src, train_tgt, val_src, val_tgt = train.src, train.tgt, val.src, val.tgt
            source = f"{train.path.name} ({len(self.record['test'])} test pairs held out)"
        if s.train_limit:
            train_src, train_tgt = train_src[: s.train_limit], train_tgt[: s.train_limit]
        if s.val_limit:
            val_src, val_tgt = val_src[: s.val_limit], val_tgt[: s.val_limit]
        tok_path = self.run_dir / TOKENIZER
        if self.resume and tok_path.is_file():
            self.tokenizer = SubwordTokenizer.load(tok_path)
        elif kind == "amino-acid":
            self.tokenizer = SubwordTokenizer.residues()
        else:
            self.tokenizer = SubwordTokenizer.train(train_src + train_tgt, s.vocab_size)
        tok = self.tokenizer
        config = s.model_config(tok)
        # a pair fits the model when each side plus eos (source) or bos (target) is within max_len
        longest = min(s.max_train_tokens, config.max_len - 1)
        encoded = encode_pairs(tok, train_src, train_tgt)
        self.pairs = [(a, b) for a, b in encoded if 0 < len(a) <= longest and 0 < len(b) <= longest]
        if not self.pairs:
            most = max(max(len(a), len(b)) for a, b in encoded)
            raise QkvError(
                f"no training pair has at most {longest} tokens a side (the longest has {most}): "
                "raise max_train_tokens and model.max_len"
            )
        if len(self.pairs) < 0.9 * len(encoded):
            logger.warning(
                f"{len(encoded) - len(self.pairs)} of {len(encoded)} training pairs are longer than "
                f"{longest} tokens a side and are left out (max_train_tokens, model.max_len)"
            )
        val_pairs = fitting_pairs(encode_pairs(tok, val_src, val_tgt), config.max_len)
        self.lengths = [(len(a), len(b)) for a, b in self.pairs]
        vocabulary = "one piece per residue" if kind == "amino-acid" else "joint BPE vocabulary"
        logger.info(
            f"{source}: {len(self.pairs)} training pairs, {len(val_pairs)} validation pairs, "
            f"{vocabulary} {tok.vocab_size}"
        )
        self.val_batches, self.val_src, self.val_tgt = eval_batches(tok, val_pairs), val_src, val_tgt
        return config

    def before_start(self) -> None:
        if self.settings.data is not None:  # checked before the run starts logging
            self.own = self._own_pairs()

    def _own_pairs(self) -> tuple[ParallelData, ParallelData]:
        """``data=``'s training and validation pairs; the vocabulary's kind, the held-out pairs
        and the files' checksums in :attr:`record` (``pairs.json``). Every file is read and
        checked before anything is written; a resumed run's files must be the ones it started
        on (:func:`~qkv.runs.record.refuse_other_data`)."""
        s = self.settings
        data = read_pairs(s.data, s.columns)
        given = {k: read_pairs(f, s.columns) for k in ("val", "test") if (f := getattr(s, f"{k}_data"))}
        fractions = [0.0 if k in given else getattr(s, f"{k}_fraction") for k in ("val", "test")]
        train, val, test = split_pairs(data, fractions[0], fractions[1], s.train.seed)
        val, test = given.get("val", val), given.get("test", test)
        if not len(val):
            raise ConfigError("no validation pairs: set val_fraction above 0 or give val_data=")
        kind = s.tokenizer
        held = [part for part in (train, val, test) if len(part)]
        if kind == "auto":
            kind = "amino-acid" if all(part.are_residues() for part in held) else "bpe"
        elif kind == "amino-acid":
            for part in held:
                part.check_residues()
        self.record = {
            "files": {
                k: file_record(part.path)
                for k, part in (("data", data), *((f"{k}_data", v) for k, v in given.items()))
            },
            "columns": s.columns,
            "tokenizer": kind,
            "train_pairs": len(train),
            "val": [list(p) for p in zip(val.src, val.tgt, strict=True)],
            "test": [list(p) for p in zip(test.src, test.tgt, strict=True)],
        }
        if self.resume:
            refuse_other_data(
                self.run_dir,
                PAIRS_FILE,
                self.record,
                {k: getattr(s, k) for k in ("data", "val_data", "test_data")},
            )
        return train, val

    def new_run_files(self) -> dict[str, dict]:
        return {PAIRS_FILE: self.record} if self.settings.data is not None else {}

    def build_model(self, config: TransformerConfig | RNNConfig) -> torch.nn.Module:
        random.seed(self.settings.train.seed)
        model = cast(Transformer | RNNSeq2Seq, for_config(config).model(config)).to(self.device)
        logger.info(f"model: {model.num_parameters() / 1e6:.2f} M parameters on {self.device}")
        return model

    def batches(self, epoch: int) -> list:
        tok, seed = self.tokenizer, self.settings.train.seed * 1000 + epoch
        order = token_batches(self.lengths, self.settings.max_tokens, shuffle=True, seed=seed)
        return [
            make_batch([self.pairs[i] for i in idx], idx, tok.pad_id, tok.bos_id, tok.eos_id) for idx in order
        ]

    def loss(self, model, batch) -> tuple[torch.Tensor, int]:
        logits = model(batch.src.to(self.device), batch.tgt_in.to(self.device)).logits
        loss, _ = label_smoothed_nll(
            logits, batch.tgt_out.to(self.device), self.settings.label_smoothing, self.tokenizer.pad_id
        )
        return loss, batch.n_tgt_tokens

    def validate(self, model) -> dict:
        """NLL / ppl on teacher-forced batches, and greedy BLEU if asked."""
        nll, n = _teacher_forced_nll(model, self.val_batches, self.tokenizer.pad_id)
        out = {"val_loss": nll / n, "val_ppl": math.exp(nll / n)}
        if self.settings.val_bleu:
            decoder = Translator(model, self.tokenizer, beam_size=1, batch_size=128, cpu=self.context.cpu)
            hyps = decoder.translate(self.val_src)
            scores = translation_scores(hyps, self.val_tgt)
            out |= {f"val_{k}": scores[k] for k in ("bleu", "chrf", "exact")}
        return out

    def final_weights(self, model, state: LoopState) -> int:
        """The last, the best-on-validation, and the average of the last snapshots (§6.1): the
        one with the best validation figure (``select``) wins, ties going to the lower validation
        loss. Test data is not looked at."""
        run_dir = self.run_dir
        candidates = {"last": run_dir / LAST, "best": run_dir / BEST}
        if len(state.snapshots) > 1:
            average_weights([run_file(run_dir, p) for p in state.snapshots], run_dir / AVERAGED)
            candidates["averaged"] = run_dir / AVERAGED
        choice = {}
        for name, path in candidates.items():
            if path.is_file():
                load_weights(model, path)
                model.eval()
                with torch.no_grad():
                    choice[name] = self.validate(model)
                logger.info(
                    f"validation with {name} weights: "
                    + ", ".join(f"{k} {v:.4g}" for k, v in choice[name].items())
                )
        sign = -1.0 if self.higher_is_better else 1.0
        pick = min(choice, key=lambda n: (sign * choice[n][self.score_key], choice[n]["val_loss"]))
        load_weights(model, candidates[pick])
        save_weights(model, run_dir / WEIGHTS)
        self.selected = {"selected_weights": pick, "validation": choice[pick]}
        return model.num_parameters()

    def summarize(self, model, state: LoopState) -> dict:
        s = self.settings
        summary = dict(self.selected)
        split = "test2016" if s.data is None else "test"
        if s.test and (s.data is None or self.record["test"]):
            summary[split] = evaluate_run(
                self.run_dir, split, device=self.device, beam_size=s.beam_size, alpha=s.alpha
            )
        return summary


def evaluate_run(
    run_dir: str | Path,
    split: str = "test2016",
    device: torch.device | str = "cpu",
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    limit: int | None = None,
) -> dict:
    """Score a run on a split of its data: sacreBLEU (cased, lowercased), chrF, loss, ppl, n;
    between proteins also the residues recovered (:func:`~qkv.evaluate.bleu.residue_recovery`).

    ``split``: ``test`` (a Multi30k run's ``test2016``, an own-data run's held-out test pairs),
    ``val``, and for Multi30k runs ``test2016`` and ``train``. ``beam_size``/``alpha``: the
    beam search's (§6.1); ``None``: the run's own settings (its summary's test decoding), else
    4 and 0.6.

    Raises:
        QkvError: a split the run's data does not have, or an unreadable run.
    """
    run_dir = Path(run_dir)
    model, tok = load_run(run_dir, device=device, family=SEQ2SEQ_RECIPES)
    meta = run_settings(run_dir)
    split, src, ref, residues = _evaluation_pairs(run_dir, meta, split)
    beam_size, alpha = run_decoding_of(meta, beam_size, alpha)
    if limit:
        src, ref = src[:limit], ref[:limit]
    t0 = time.perf_counter()
    hyps = Translator(model, tok, beam_size=beam_size, alpha=alpha).translate(src)
    decode_s = time.perf_counter() - t0
    with torch.no_grad():
        pairs = fitting_pairs(encode_pairs(tok, src, ref), model.config.max_len)
        nll, n = _teacher_forced_nll(model, eval_batches(tok, pairs), tok.pad_id)
    scores = translation_scores(hyps, ref)
    if residues:
        scores["recovery"] = residue_recovery(hyps, ref)
    return {
        "split": split,
        **scores,
        "loss": nll / n,
        "ppl": math.exp(nll / n),
        "n": len(src),
        "beam_size": beam_size,
        "alpha": alpha,
        "decode_seconds": round(decode_s, 1),
        "examples": [
            {"src": s, "ref": r, "hyp": h} for s, r, h in list(zip(src, ref, hyps, strict=True))[:5]
        ],
    }


def run_decoding(
    run_dir: str | Path, beam_size: int | None = None, alpha: float | None = None
) -> tuple[int, float]:
    """``(beam_size, alpha)``: the ones given, else the beam search a translation run's test
    was decoded with (its settings; 4 and 0.6, §6.1, for a run that names none)."""
    return run_decoding_of(run_settings(run_dir), beam_size, alpha)


def _evaluation_pairs(run_dir: Path, meta: dict, split: str) -> tuple[str, list[str], list[str], bool]:
    """``(split name, sources, references, proteins?)`` of a run's split (:func:`evaluate_run`)."""
    if meta.get("data") is None:
        split = "test2016" if split == "test" else split
        return split, *load_multi30k(split, meta.get("src_lang", "de"), meta.get("tgt_lang", "en")), False
    if split not in ("val", "test"):
        raise QkvError(
            f"{run_dir} was trained on {meta['data']}: its splits are val and test ({split} is Multi30k's)"
        )
    record = read_json(run_dir / PAIRS_FILE)
    if not record[split]:
        raise QkvError(f"{run_dir} holds no {split} pairs ({split}_fraction was 0)")
    src, ref = (list(side) for side in zip(*record[split], strict=True))
    return split, src, ref, record["tokenizer"] == "amino-acid"


def _chrf_exact(scores: dict, prefix: str = "") -> str:
    """``", chrF 56.63, exact match 2.1 %"``, of what the scores have (a summary written before
    exact match was measured has none)."""
    chrf, exact = scores.get(f"{prefix}chrf"), scores.get(f"{prefix}exact")
    return ("" if chrf is None else f", chrF {chrf:.2f}") + (
        "" if exact is None else f", exact match {exact:.1f} %"
    )


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train translation`` shows at the end: three test translations, the test
    scores, the wall time and what to run next."""
    run = Path(run_dir).resolve()
    split = next((k for k in ("test2016", "test") if k in summary), None)
    if split is None:  # test=false
        valid = summary["validation"]
        score = (
            f"BLEU {valid['val_bleu']:.2f}{_chrf_exact(valid, 'val_')}"
            if "val_bleu" in valid
            else f"perplexity {valid['val_ppl']:.2f}"
        )
        return (
            f"validation {score} after {trained_for(summary, of_training=True)} "
            f"(no test split scored); {run_directory(run)}"
        )
    test = summary[split]
    source = "DE: " if split == "test2016" else "SRC:"
    lines = [f"example translations ({split}, beam {test['beam_size']}):"]
    lines += [
        f"  {source} {ex['src']}\n  REF: {ex['ref']}\n  QKV: {ex['hyp']}" for ex in test["examples"][:3]
    ]
    example = "Ein Hund rennt über die Wiese." if split == "test2016" else test["examples"][0]["src"]
    if "recovery" in test:  # proteins: BLEU counts words, and a chain is one
        scores = f"residues recovered {test['recovery']:.3f}, perplexity {test['ppl']:.2f}{_chrf_exact(test)}"
    else:
        scores = (
            f"BLEU {test['bleu']:.2f} (sacreBLEU, cased; lowercased {test['bleu_lowercase']:.2f}"
            f"{_chrf_exact(test)})"
        )
    lines += [
        f"\n{split} {scores} after {trained_for(summary, of_training=True)}; "
        f"{summary['total_minutes']:.1f} min in all; {run_directory(run)}",
        f'next:\n  qkv translate {run} "{example}"\n'
        f"  qkv explain {run} --serve        # attention of every layer and head, in the browser",
    ]
    if split == "test2016":
        lines[-1] += (
            "\n  qkv train translation --config configs/multi30k_de_en.json --out runs/full"
            "   # the 1-hour recipe (see README)"
        )
    return "\n".join(lines)


RECIPE = Recipe(
    name=TranslationSettings.name,
    settings=TranslationSettings,
    train=TranslationRun.train,
    evaluate=evaluate_run,
    # "test": test2016 for a Multi30k run, the held-out pairs of a run on its own pairs
    splits=("test", *SPLITS),
    evaluate_options=("beam_size", "alpha", "limit"),
    summary=summary_text,
    model_type=TRANSFORMER,
    explainer=TranslationExplainer,
    inputs="text",
)

RNN_RECIPE = replace(
    RECIPE,
    name=RNNTranslationSettings.name,
    settings=RNNTranslationSettings,
    model_type=RNN_SEQ2SEQ,
    explainer=RNNTranslationExplainer,
)
