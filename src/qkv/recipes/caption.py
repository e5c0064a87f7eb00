"""Recipe: image captioning (``qkv train caption --task scenes|emoji``).

Flow: the task's captioned images (:mod:`qkv.data.scenes`: scenes of Fashion-MNIST garments
with captions from a small grammar; :mod:`qkv.data.emoji`: the same emoji drawn by three
artists, named by CLDR) → a BPE tokenizer over the training captions → shuffled mini-batches,
teacher forcing → :class:`~qkv.models.caption.CaptionModel` → cross-entropy over the caption
tokens → :func:`qkv.train.loop.train_loop`, keeping the weights with the best validation exact
match → test figures: exact match, BLEU, for scenes the meaning's slots and the pointing game,
beside nearest-neighbour caption retrieval on pixels.

``init=RUN`` starts the image encoder from a ``qkv train vit`` run (:func:`~qkv.models.caption.
encoder_weights_from_vit`); ``freeze=true`` keeps it fixed: the lecture's "this projection can be
fixed from a pre-trained model, or trained jointly with downstream task".

Splits: scenes: ``train`` from Fashion-MNIST training images, ``val``/``val_novel`` from images
held out of them, ``test``/``test_novel`` from its test images only; the ``*_novel`` splits hold
compositions (class pairs in relations) no training scene has. Emoji: train on two artists,
``test`` is every emoji by ``test_artist``. Test splits are scored once, by the final model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from ..data.batching import pad_sequences
from ..data.images import ImageBatch, to_model_input
from ..data.tokenizers import SubwordTokenizer
from ..errors import ConfigError, QkvError
from ..evaluate.captioning import caption_bleu, exact_match, nearest_captions, pointing_hit
from ..inference.caption import Captioner
from ..models.caption import CaptionModel, encoder_weights_from_vit
from ..models.config import CaptionConfig
from ..models.model_types import CAPTION
from ..runs import RunInfo
from ..runs.layout import CONFIG, SUMMARY, TASK, TOKENIZER, WEIGHTS
from ..train.loop import LoopState
from ..train.run import TrainingRun
from ..train.train_settings import TrainSettings
from .common import run_directory, trained_for
from .recipe import Recipe

logger = logging.getLogger(__name__)

TASKS = ("scenes", "emoji")
# scenes; emoji has test and val. The shifted splits are scored at the end only (not at each validation)
SPLITS = ("test", "test_novel", "test_shifted", "val", "val_novel", "val_shifted")
PHRASINGS = ("random", "canonical")


@dataclass(frozen=True, kw_only=True)
class CaptionSettings:
    """Settings of ``qkv train caption``: ``model`` (a :class:`CaptionConfig`; the image size
    and channels of scenes are set from the data, ``vocab_size`` from the tokenizer), ``train``
    (:class:`TrainSettings`: 15 minutes, cosine decay over them) and the task fields.

    ``task``: ``scenes`` or ``emoji``. ``test_artist``: emoji's held-out artist (``google``,
    ``twitter`` or ``openmoji``). ``train_scenes``/``eval_scenes``: scenes drawn for training
    and for each evaluation split. ``batch_size``: images per step. ``label_smoothing``: of the
    cross-entropy. ``phrasing``: which of a scene's phrasings it trains on: the one drawn for it
    (``random``) or always the ``canonical`` one (the top row first, ``above``; the left garment
    first, ``to the left of``; the default: on validation it doubles the exact match, because a
    random phrasing makes the decoder choose which garment to name first and stay consistent
    with it); every phrasing is a reference for BLEU either way.
    ``shift``: scenes only, move each training garment inside its cell by 0 to ``shift`` pixels
    in each direction, drawn anew for every batch (:func:`qkv.data.scenes.shift_garments`); the
    ``*_shifted`` splits score the same scenes with every garment moved 1 to 3 pixels.
    ``bpe_vocab``: the caption tokenizer's largest vocabulary. ``beam_size``:
    decoding for validation and test (1: greedy). ``init``: a ``qkv train vit`` run whose
    encoder starts the image side; ``freeze``: keep it fixed (needs ``init``). ``baseline``:
    also score nearest-neighbour caption retrieval on pixels. ``val_fraction``, ``split_seed``:
    the held-out images and the scenes' draw.
    """

    model: CaptionConfig = CaptionConfig()
    train: TrainSettings = TrainSettings(
        lr=1e-3,
        weight_decay=0.05,
        beta2=0.999,
        warmup_steps=300,
        min_lr_ratio=0.0,
        max_minutes=15.0,
        eval_every=1000,
        snapshot_minutes=5.0,
        keep_snapshots=1,
    )
    task: str = "scenes"
    test_artist: str = "openmoji"
    train_scenes: int = 100_000
    eval_scenes: int = 1_000
    batch_size: int = 64
    label_smoothing: float = 0.0
    phrasing: str = "canonical"
    shift: int = 0
    bpe_vocab: int = 2000
    beam_size: int = 1
    init: str | None = None
    freeze: bool = False
    baseline: bool = True
    val_fraction: float = 0.1
    split_seed: int = 0

    # what defines the run's data, vocabulary and trained weights: a resume keeps them
    # (qkv.runs.record.refuse_changed_settings; the model is compared whole, config.json)
    FIXED_ON_RESUME: ClassVar[tuple[str, ...]] = (
        "task",
        "test_artist",
        "train_scenes",
        "phrasing",
        "bpe_vocab",
        "val_fraction",
        "split_seed",
        "init",
        "freeze",
    )

    def __post_init__(self) -> None:
        problems = []
        if self.task not in TASKS:
            problems.append(f"task must be one of {', '.join(TASKS)} (got {self.task!r})")
        for name in ("train_scenes", "eval_scenes", "batch_size", "beam_size", "bpe_vocab"):
            if getattr(self, name) < 1:
                problems.append(f"{name} ({getattr(self, name)}) must be >= 1")
        if self.phrasing not in PHRASINGS:
            problems.append(f"phrasing must be one of {', '.join(PHRASINGS)} (got {self.phrasing!r})")
        if not 0.0 <= self.label_smoothing < 1.0:
            problems.append(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")
        if not 0.0 < self.val_fraction < 0.5:
            problems.append(f"val_fraction ({self.val_fraction}) must be in (0, 0.5)")
        if not 0 <= self.shift <= 8 or (self.shift and self.task != "scenes"):
            problems.append(f"shift ({self.shift}) must be 0 to 8 pixels, and is for task=scenes only")
        if self.freeze and not self.init:
            problems.append("freeze=true (a fixed image encoder) needs init=RUN_DIR, a qkv train vit run")
        if problems:
            raise ConfigError("; ".join(problems))

    @property
    def mode(self) -> str:
        """``"frozen-vit"``, ``"vit-init"`` or ``"joint"`` (from scratch)."""
        return "frozen-vit" if self.freeze else "vit-init" if self.init else "joint"


@dataclass
class CaptionData:
    """One split of a caption task: uint8 images ``(N, H, W, C)``, the caption trained on,
    every reference, and for scenes their meanings and garments (``None`` for emoji)."""

    images: np.ndarray
    captions: list[str]
    references: list[list[str]]
    meanings: list | None = None
    garments: list | None = None


def load_splits(
    settings: CaptionSettings, only: tuple[str, ...] | None = None
) -> tuple[dict[str, CaptionData], dict]:
    """The task's splits (scenes: ``only`` these) and its ``task.json`` facts (name, citation,
    background).

    Raises:
        QkvError: the data cannot be read.
    """
    if settings.task == "scenes":
        from ..data.scenes import SCENE_CITATION, SCENE_SPLITS, SHIFTED_SPLITS, load_scene_task

        scenes = load_scene_task(
            settings.train_scenes,
            settings.eval_scenes,
            settings.split_seed,
            settings.val_fraction,
            only or (*SCENE_SPLITS, *SHIFTED_SPLITS),
        )
        splits = {
            name: CaptionData(
                s.images,
                [canonical(r) for r in s.references] if settings.phrasing == "canonical" else s.captions,
                s.references,
                s.meanings,
                s.garments,
            )
            for name, s in scenes.items()
        }
        return splits, {"task": "scenes", "citation": SCENE_CITATION, "background": "black"}
    from ..data.emoji import EMOJI_CITATION, load_emoji_task

    size = settings.model.image_size
    emoji = load_emoji_task(settings.test_artist, size, settings.val_fraction, settings.split_seed)
    splits = {name: CaptionData(e.images, e.captions, [[c] for c in e.captions]) for name, e in emoji.items()}
    info = {"task": "emoji", "test_artist": settings.test_artist, "citation": EMOJI_CITATION}
    return splits, {**info, "background": "white"}


def canonical(references: list[str]) -> str:
    """A scene's canonical phrasing among its ``references``: the top row first (``above``,
    never ``below``), a row's left garment first (``to the left of``, never ``to the right of``);
    every meaning of the grammar has exactly one."""
    return next(r for r in references if " below " not in r and " right of " not in r)


def model_config(settings: CaptionSettings, train: CaptionData, vocab_size: int) -> CaptionConfig:
    """The recipe's captioner with the data's image size and channels and the tokenizer's
    vocabulary (with ``init``: the ViT's widths and encoder depth)."""
    _, h, _, c = train.images.shape
    cfg = replace(settings.model, image_size=h, channels=c, vocab_size=vocab_size)
    if settings.init:
        vit = runs_config(settings.init)
        cfg = replace(
            cfg,
            d_model=vit.d_model,
            n_heads=vit.n_heads,
            d_ff=vit.d_ff,
            n_encoder_layers=vit.n_layers,
            patch_size=vit.patch_size,
            activation=vit.activation,
            norm_first=vit.norm_first,
            norm=vit.norm,
            bias=vit.bias,
            image_positional=vit.positional,
        )
    return cfg


def runs_config(run_dir: str) -> Any:
    """The model config of a ``qkv train vit`` run (``init``).

    Raises:
        QkvError: not a ViT run directory.
    """
    from ..runs import model_type_of

    if model_type_of(run_dir).name != "vit":
        raise QkvError(f"init={run_dir} is not a qkv train vit run (a captioner's encoder starts from a ViT)")
    from ..models.config import ViTConfig

    return ViTConfig.load(Path(run_dir) / CONFIG)


def caption_scores(predicted: list[str], data: CaptionData) -> dict:
    """Exact match, BLEU and (scenes) the meaning's slots of ``predicted`` captions of ``data``;
    ``n`` images."""
    out: dict[str, Any] = {"n": len(predicted)}
    if data.meanings is not None:
        from ..data.scenes import scene_scores

        out.update(scene_scores(predicted, data.meanings))
    else:
        out["exact_match"] = exact_match(predicted, data.references)
    out["bleu"] = caption_bleu(predicted, data.references)
    return out


def pointing_scores(
    captioner: Captioner, data: CaptionData, predicted: list[list[int]], limit: int = 500
) -> dict:
    """The pointing game (Zhang et al. 2016) on scenes: for each garment word of a generated
    caption whose garment is in the scene, whether the peak of the word's cross-attention
    falls in one of that class's boxes; scored for every decoder layer and head and for each
    layer's mean over heads, on the first ``limit`` images.

    Returns:
        ``{"layer L head H" | "layer L mean": hit rate}`` and ``words`` (the words scored).
    """
    from ..data.scenes import boxes_for, garment_words

    assert data.garments is not None
    nouns = garment_words()
    cfg = captioner.config
    hits: dict[str, list[bool]] = {}
    words_scored = 0
    for i in range(min(limit, len(predicted))):
        words, maps = captioner.word_maps(data.images[i], predicted[i])  # (W, L, H, g, g)
        for w, m in zip(words, maps, strict=True):
            label = nouns.get(w.text)
            boxes = boxes_for(data.garments[i], label) if label is not None else []
            if not boxes:
                continue
            words_scored += 1
            flat = m.reshape(m.shape[0], m.shape[1], -1)  # (L, H, N)
            for layer in range(flat.shape[0]):
                key = f"layer {layer} mean"
                hits.setdefault(key, []).append(
                    pointing_hit(flat[layer].mean(0), boxes, cfg.grid_size, cfg.image_size)
                )
                for head in range(flat.shape[1]):
                    key = f"layer {layer} head {head}"
                    hits.setdefault(key, []).append(
                        pointing_hit(flat[layer, head], boxes, cfg.grid_size, cfg.image_size)
                    )
    return {"words": words_scored, **{k: float(np.mean(v)) for k, v in hits.items()}}


class CaptionRun(TrainingRun):
    """``qkv train caption``: teacher-forced cross-entropy over BPE caption tokens; validation
    exact match picks the weights kept; test exact match, BLEU, per-slot accuracy and the
    pointing score (scenes), beside nearest-neighbour retrieval. Writes ``task.json``."""

    name, score_key, higher_is_better = "caption", "val_exact_match", True
    extras = ("probe",)  # scikit-learn: the nearest-neighbour retrieval baseline

    def before_start(self) -> None:
        self.splits, self.task_info = load_splits(self.settings)

    def setup(self) -> CaptionConfig:
        s, train = self.settings, self.splits["train"]
        if self.resume:
            self.tokenizer = SubwordTokenizer.load(self.run_dir / TOKENIZER)
        else:
            self.tokenizer = SubwordTokenizer.train(train.captions, vocab_size=s.bpe_vocab, min_frequency=1)
        sizes = ", ".join(f"{len(d.captions):,} {name}" for name, d in self.splits.items())
        logger.info(
            f"{s.task}: {sizes} images of {train.images.shape[1:]}; {s.mode}. {self.task_info['citation']}"
        )
        ids = self.tokenizer.encode_batch(train.captions)
        cfg = model_config(s, train, self.tokenizer.vocab_size)
        too_long = sum(len(x) + 1 > cfg.max_len for x in ids)
        if too_long:
            raise QkvError(
                f"{too_long} training captions are longer than model.max_len={cfg.max_len} tokens; raise it"
            )
        self.caption_ids = ids
        return cfg

    def new_run_files(self) -> dict[str, dict]:
        return {TASK: {**self.task_info, "input": "pixel / 127.5 - 1, see qkv.data.images.read_image"}}

    def build_model(self, config: CaptionConfig) -> CaptionModel:
        s = self.settings
        model = CaptionModel(config)
        if s.init:
            from ..files import read_safetensors

            state = encoder_weights_from_vit(read_safetensors(Path(s.init) / WEIGHTS), config)
            own = model.state_dict()
            bad = sorted(k for k, v in state.items() if k not in own or own[k].shape != v.shape)
            if bad:
                raise QkvError(f"init={s.init}: weights that do not fit the captioner: {', '.join(bad[:3])}")
            model.load_state_dict(state, strict=False)
            if s.freeze:
                for name, p in model.named_parameters():
                    p.requires_grad_(not (name in state or name.startswith("encoder.")))
        model.to(self.device)
        logger.info(f"captioner: {model.num_parameters():,} parameters ({s.mode}, memory={config.memory})")
        self.captioner = Captioner(
            model, self.tokenizer, self.task_info["background"], self.device, s.beam_size
        )
        return model

    def _per_epoch(self) -> int:
        return max(len(self.caption_ids) // self.settings.batch_size, 1)

    def batches(self, epoch: int) -> list[ImageBatch]:
        size, seed = self.settings.batch_size, self.settings.train.seed * 1000 + epoch
        order = torch.randperm(len(self.caption_ids), generator=torch.Generator().manual_seed(seed))
        return [ImageBatch(epoch, i, order[i * size : (i + 1) * size]) for i in range(self._per_epoch())]

    def loss(self, model, batch: ImageBatch) -> tuple[torch.Tensor, int]:
        cfg, rows = self.captioner.config, batch.rows.tolist()  # model may be wrapped (torchrun's DDP)
        pixels = self.splits["train"].images[rows]
        if self.settings.shift:  # drawn from the batch's place in the run: a resume draws the same
            from ..data.scenes import shift_garments

            rng = np.random.default_rng((self.settings.train.seed, batch.epoch, batch.number, batch.part))
            pixels = shift_garments(pixels, rng, 0, self.settings.shift)
        images = to_model_input(pixels).to(self.device)
        tgt_in = pad_sequences([[cfg.bos_id, *self.caption_ids[i]] for i in rows], cfg.pad_id).to(self.device)
        tgt_out = pad_sequences([[*self.caption_ids[i], cfg.eos_id] for i in rows], cfg.pad_id).to(
            self.device
        )
        logits = model(images, tgt_in).logits
        loss = F.cross_entropy(
            logits.float().flatten(0, 1),
            tgt_out.flatten(),
            ignore_index=cfg.pad_id,
            reduction="sum",
            label_smoothing=self.settings.label_smoothing,
        )
        return loss, int((tgt_out != cfg.pad_id).sum())

    def validate(self, model) -> dict:
        out = {}
        for name in [n for n in ("val", "val_novel") if n in self.splits]:
            data = self.splits[name]
            scores = caption_scores(self.captioner.caption(data.images), data)
            out.update({f"{name}_exact_match": scores["exact_match"], f"{name}_bleu": scores["bleu"]})
        return out

    def summarize(self, model, state: LoopState) -> dict:
        s = self.settings
        summary: dict[str, Any] = {"task": s.task, "mode": s.mode, "memory": model.config.memory}
        if s.task == "emoji":
            summary["test_artist"] = s.test_artist
        evaluated = evaluate_splits(self.captioner, self.splits)
        summary.update(evaluated)
        if s.baseline:
            summary["baseline_nearest"] = nearest_baseline(self.splits)
        return summary


def evaluate_splits(captioner: Captioner, splits: dict[str, CaptionData], only: str | None = None) -> dict:
    """Every evaluation split's scores (``only``: that split), and for scenes the pointing game:
    the layer/head (or layer mean) chosen on ``val`` by its hit rate, then scored on each split
    with that choice (``pointing`` and ``pointing_choice``)."""
    names = [n for n in SPLITS if n in splits and (only is None or n == only)]
    pointing = splits["val"].meanings is not None and captioner.config.memory == "patches"  # scenes
    out: dict[str, Any] = {}
    points: dict[str, dict] = {}  # each split captioned and pointed once; val's picks the choice
    for name in dict.fromkeys([*names, "val"] if pointing else names):
        data = splits[name]
        ids = captioner.caption_ids(data.images)
        out[name] = caption_scores(captioner.tokenizer.decode_batch(ids), data)
        if pointing:
            points[name] = pointing_scores(captioner, data, ids)
    candidates = {k: v for k, v in points.get("val", {}).items() if k.startswith("layer")}
    if candidates:  # none when no validation caption names a garment
        choice = max(candidates, key=lambda k: candidates[k])
        for name in names:
            out[name]["pointing"] = points[name].get(choice, 0.0)
            out[name]["pointing_words"] = points[name]["words"]
            out[name]["pointing_choice"] = f"{choice} (chosen on val)"
    return {name: out[name] for name in names}


def nearest_baseline(splits: dict[str, CaptionData]) -> dict:
    """Nearest-neighbour caption retrieval on pixels, scored on every evaluation split."""
    train = splits["train"]
    return {
        name: caption_scores(
            nearest_captions(train.images, train.captions, splits[name].images), splits[name]
        )
        for name in SPLITS
        if name in splits
    }


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    device: torch.device | str = "cpu",
    *,
    beam_size: int | None = None,
) -> dict:
    """Scores of a finished ``qkv train caption`` run on ``split`` of its own task (as recorded
    in ``train_config.json``): exact match, BLEU, for scenes the slots and the pointing game.
    ``beam_size``: ``None`` decodes as the run validated (its own ``beam_size``).

    Raises:
        QkvError: a bad run directory, or a split this task does not have.
        ConfigError: a beam size outside 1..vocabulary size.
    """
    from ..settings import resolve

    run_dir = Path(run_dir)
    saved = RunInfo.read(run_dir).settings
    keys = ("task", "test_artist", "train_scenes", "eval_scenes", "val_fraction", "split_seed")
    settings = resolve(CaptionSettings, overrides=[f"{k}={saved[k]}" for k in keys if k in saved])
    captioner = Captioner.from_run(run_dir, device, beam_size)  # None: the run's own beam_size
    have = SPLITS if settings.task == "scenes" else ("test", "val")
    if split not in have:
        raise QkvError(f"split must be one of {', '.join(have)} for a {settings.task} run (got {split!r})")
    settings = replace(settings, model=replace(settings.model, image_size=captioner.config.image_size))
    splits, _ = load_splits(settings, only=(split, "val"))  # val: where the pointing game's choice is made
    return {"task": settings.task, "split": split, **evaluate_splits(captioner, splits, only=split)[split]}


def summary_text(summary: dict, run_dir: Path) -> str:
    """What ``qkv train caption`` shows at the end: test exact match and BLEU (scenes: on seen
    and novel compositions, and the pointing score), the baseline's, and what to run next."""
    run = Path(run_dir).resolve()
    lines = []
    for name in ("test", "test_novel", "test_shifted"):
        t = summary.get(name)
        if t:
            line = f"{summary['task']} {name}: exact match {t['exact_match']:.4f}, BLEU {t['bleu']:.2f}"
            if "garment_accuracy" in t:
                line += (
                    f", garments {t['garment_accuracy']:.4f}, counts {t['count_accuracy']:.4f}, "
                    f"relations {t['relation_accuracy']:.4f}"
                )
            if "pointing" in t:
                line += f", pointing {t['pointing']:.3f}"
            lines.append(line)
    base = summary.get("baseline_nearest", {}).get("test")
    if base:
        lines.append(
            f"baseline (nearest training image's caption): test exact match {base['exact_match']:.4f}"
        )
    lines.append(f"{trained_for(summary, of_training=True)}; {summary['total_minutes']:.1f} min in all")
    return (
        "\n".join(lines) + f"\n{run_directory(run, SUMMARY)}\nnext:\n"
        f"  qkv caption {run} IMAGE.png ...\n"
        f"  qkv explain {run} --input IMAGE.png --html page.html   # where each word looks"
    )


def _explainer(run_dir: str | Path, device: torch.device | str = "cpu", **kwargs: Any) -> Any:
    from ..explain.caption import CaptionExplainer

    return CaptionExplainer(run_dir, device=device, **kwargs)


RECIPE = Recipe(
    name="caption",
    settings=CaptionSettings,
    train=CaptionRun.train,
    evaluate=evaluate_run,
    splits=SPLITS,
    evaluate_options=("beam_size",),
    summary=summary_text,
    model_type=CAPTION,
    explainer=_explainer,
    inputs="image",
)
