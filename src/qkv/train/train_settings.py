"""The ``train`` section every recipe shares: loop, optimiser, schedule, precision, budgets,
device and threads (one declaration; each recipe only chooses its defaults).

Sources: Vaswani et al. 2017, §5.3 (Adam, β1 0.9, β2 0.98, ε 1e-9, and the warm-up schedule of
Eq. 3, ``schedule="noam"``); Loshchilov & Hutter 2017/2019 (AdamW, cosine decay,
``schedule="cosine"``, as GPT-2 / nanoGPT); §6.1 (averaging the last checkpoints: snapshots).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigError
from ..settings import check
from .adapters import LoraSettings
from .optim import budget_lr, noam_lr, warmup_cosine_lr
from .trackers import tracker_names


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Settings of :func:`qkv.train.loop.train_loop` and the optimiser (``None`` budgets are
    unlimited; training stops at the first budget reached).

    Budgets: ``max_steps`` optimizer steps, ``max_minutes`` of training (wall clock),
    ``max_epochs`` passes over the training data.
    Steps: ``accum_steps`` micro-batches make one optimizer step; gradients are clipped to
    ``clip_norm`` (``None``: no clipping).
    Optimiser: AdamW (``beta1``, ``beta2``, ``eps``); ``weight_decay`` applies to matrices only.
    Schedule: ``"noam"`` is Eq. 3 times ``lr_factor`` with ``warmup_steps``; ``"cosine"`` and
    ``"linear"`` warm up linearly to ``lr`` over ``warmup_steps``, then decay to
    ``lr * min_lr_ratio`` at ``lr_decay_steps`` (default: the run's total steps,
    ``max_steps``); with no step count but ``max_minutes``, they decay over the time budget
    (the end of the budget is the end of the decay, whatever the machine's speed). ``lr=None``
    lets the recipe choose (protein tasks: by mode).
    Evaluation and checkpoints: validation every ``eval_every`` steps; a snapshot for averaging
    every ``snapshot_minutes`` (0: at every step), the newest ``keep_snapshots`` kept.
    Hardware: ``precision`` (``"auto"``: bfloat16 autocast on CUDA and on CPUs with AMX
    bfloat16 units, fp32 elsewhere, see :func:`qkv.device.resolve_precision`; ``"bf16"``, ``"fp32"``),
    ``device`` (``"auto"``: CUDA, then MPS, then CPU), ``threads`` (torch CPU threads;
    ``None``: torch's choice), ``compile`` (``torch.compile`` the training forward/backward).
    ``seed``: every random choice of the run (init, batches, dropout).
    Faults: a non-finite loss or gradient norm stops the run naming the step, unless
    ``skip_nonfinite`` allows that many such steps to be skipped (their update discarded).
    Adapters (recipes that start from a pretrained ``init``): ``lora_rank`` > 0 freezes the
    pretrained weights and trains LoRA updates of rank ``lora_rank`` (Hu et al. 2021) of the
    projections ``lora_modules`` names (``qkv``, ``o``, ``ffn``, comma-separated), scaled by
    ``lora_alpha / lora_rank``, with ``lora_dropout`` on their input
    (:mod:`qkv.train.adapters`); the task head trains fully. 0: no adapters.
    Tracking: ``log_to`` names the experiment trackers a recipe's run streams its
    ``metrics.jsonl`` rows, settings and summary to (``tensorboard``, ``wandb``, ``mlflow``,
    comma-separated; ``""``: none), each through its own library (:mod:`qkv.train.trackers`);
    a tracker whose library is missing is refused before the run starts.

    Keys of earlier versions (``amp_bf16``) are still read from settings files and overrides,
    with a deprecation warning (:data:`qkv.compat.RENAMED_KEYS`).

    Raises:
        ConfigError: (a ``ValueError``) on construction, naming every bad value.
    """

    max_steps: int | None = None
    max_minutes: float | None = None
    max_epochs: int | None = None
    accum_steps: int = 1
    clip_norm: float | None = 1.0
    schedule: Literal["noam", "cosine", "linear"] = "cosine"
    lr: float | None = 1e-3
    lr_factor: float = 1.0
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    lr_decay_steps: int | None = None
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.0
    eval_every: int = 500
    snapshot_minutes: float = 5.0
    keep_snapshots: int = 5
    seed: int = 1
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    device: str = "auto"
    threads: int | None = None
    compile: bool = False
    skip_nonfinite: int = 0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_modules: str = "qkv,o"
    log_to: str = ""

    def __post_init__(self) -> None:
        check(self)

    def problems(self) -> list[str]:
        """Every out-of-range value, naming the field."""
        out = []
        if not 0 <= self.seed < 2**32:  # NumPy's seeds, and every RNG qkv seeds from it
            out.append(f"seed ({self.seed}) must be in [0, 2**32)")
        at_least_one = (
            "max_steps",
            "max_epochs",
            "accum_steps",
            "eval_every",
            "keep_snapshots",
            "threads",
            "lr_decay_steps",
        )
        for name in at_least_one:
            value = getattr(self, name)
            if value is not None and value < 1:
                out.append(f"{name} ({value}) must be >= 1")
        for name in ("max_minutes", "clip_norm", "lr", "lr_factor", "eps"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                out.append(f"{name} ({value}) must be > 0")
        for name in ("warmup_steps", "weight_decay", "snapshot_minutes", "skip_nonfinite"):
            if not getattr(self, name) >= 0:  # NaN too
                out.append(f"{name} ({getattr(self, name)}) must be >= 0")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                out.append(f"{name} ({getattr(self, name)}) must be in [0, 1)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            out.append(f"min_lr_ratio ({self.min_lr_ratio}) must be in [0, 1]")
        if self.lora_rank < 0:
            out.append(f"lora_rank ({self.lora_rank}) must be >= 0 (0: no adapters)")
        if not self.lora_alpha > 0:
            out.append(f"lora_alpha ({self.lora_alpha}) must be > 0")
        if not 0.0 <= self.lora_dropout < 1.0:
            out.append(f"lora_dropout ({self.lora_dropout}) must be in [0, 1)")
        if self.lora is not None:
            try:
                self.lora.targets()
            except ConfigError as exc:
                out.append(str(exc).removeprefix("train."))
        try:
            tracker_names(self.log_to)
        except ConfigError as exc:
            out.append(str(exc).removeprefix("train."))
        return out

    @property
    def trackers(self) -> list[str]:
        """The trackers ``log_to`` names, in order, each once (``[]``: none)."""
        return tracker_names(self.log_to)

    @property
    def lora(self) -> LoraSettings | None:
        """The LoRA settings, ``None`` when ``lora_rank`` is 0."""
        if not self.lora_rank:
            return None
        return LoraSettings(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_modules)

    def lr_schedule(
        self, d_model: int, total_steps: int | None = None, peak_lr: float | None = None
    ) -> Callable[[int, float], float]:
        """(optimizer step from 1, fraction of the budget used 0..1) → learning rate.

        Args:
            d_model: the model width (Eq. 3 scales by d_model^-0.5).
            total_steps: where the decay ends when ``lr_decay_steps`` is unset (default
                ``max_steps``; with neither, ``max_minutes``). peak_lr: the recipe's choice
                when ``lr`` is ``None``.

        Raises:
            ConfigError: a decaying schedule with no end (training by epochs only needs
                ``lr_decay_steps``), or no peak learning rate.
        """
        if self.schedule == "noam":

            def noam(step: int, used: float = 0.0) -> float:
                return noam_lr(step, d_model, self.warmup_steps, self.lr_factor)

            return noam
        decay = self.lr_decay_steps or total_steps or self.max_steps
        if decay is None and self.max_minutes is None:
            raise ConfigError(
                f"train.schedule={self.schedule} needs an end: set train.max_steps, "
                "train.max_minutes or train.lr_decay_steps"
            )
        peak = self.lr if self.lr is not None else peak_lr
        if peak is None:
            raise ConfigError("train.lr is not set")
        low = peak * self.min_lr_ratio
        if decay is None:

            def budgeted(step: int, used: float = 0.0) -> float:
                return budget_lr(step, used, peak, low, self.warmup_steps, self.schedule)

            return budgeted

        def decaying(step: int, used: float = 0.0) -> float:
            return warmup_cosine_lr(step, peak, low, self.warmup_steps, decay, self.schedule)

        return decaying
