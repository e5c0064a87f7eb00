"""A qkv LoRA run out as a Hugging Face PEFT adapter (``qkv convert --to peft RUN_DIR DIR``).

A LoRA run (``train.lora_rank``, :mod:`qkv.train.adapters`) keeps the merged weights
``W = W0 + (α/r)·B A`` in ``model.safetensors`` and the adapters ``A (r, d_in)``,
``B (d_out, r)`` in qkv's parameter names. :func:`export_peft` writes what PEFT users load
instead (the layout of PEFT's ``save_pretrained``):

- ``DIR/base/``: the pretrained model as an HF folder (:func:`qkv.hub.convert.export_hf`'s
  layout: ``config.json``, ``model.safetensors``, ``tokenizer.json``) holding the frozen
  weights ``W0``; a classifier's base is the bare encoder (``BertModel``, ``EsmModel``) with
  its labels in ``config.json``;
- ``DIR/adapter_config.json`` (PEFT's ``LoraConfig``: ``r``, ``lora_alpha``,
  ``lora_dropout``, ``target_modules`` in HF module names, ``fan_in_fan_out`` for GPT-2's
  ``Conv1D``, ``modules_to_save`` for the trained head, ``task_type``,
  ``base_model_name_or_path``: the absolute path of ``DIR/base``, as PEFT records a local
  base model) and ``DIR/adapter_model.safetensors`` (``base_model.model.<HF module>.lora_A
  .weight`` ...), so that ``PeftModel.from_pretrained(AutoModelFor...(DIR/base), DIR)``
  computes the run's logits.

``W0`` is exact where the checkpoint the run's weights were chosen from (``best.safetensors``,
else ``last.safetensors``, as :func:`qkv.runs.layout.select_weights` picks it) still holds the
frozen weights (PEFT's ``base_layer`` tensors) beside the same adapters, bit for bit;
otherwise it is ``W - (α/r)·B A``, computed as PEFT merges (within float32 rounding of ``W``).

Packed projections: qkv's ``w_qkv`` is one ``(3·H·d_k, D)`` Linear with one rank-r update
``B A``. BERT and ESM have separate query, key and value Linears; rows ``i`` of ``B A`` are
``B[i] A``, so the update is exactly three rank-r updates that share ``A``: ``lora_A`` is
copied to each and ``lora_B`` split by rows in the order the key map splits the weight
(:func:`qkv.hub.keymap.to_hf`). GPT-2's ``c_attn`` is the packed matrix itself, stored
transposed (``Conv1D``): the adapter maps as it is, with ``fan_in_fan_out=True`` (PEFT
transposes ``B A`` when it merges; its forward pass is the same). An adapter's input dropout
(``lora_dropout``) is then drawn for each of the three separately, which matters only when
training goes on.

Heads (Hu et al. 2021 train the task head with the adapters; PEFT saves it whole through
``modules_to_save``): ``protein-residue``'s per-residue head is ``*ForTokenClassification``'s
``classifier``; a sequence head is ``BertForSequenceClassification``'s ``classifier`` (after
BERT's frozen pooler, in the base) or ``EsmForSequenceClassification``'s ``classifier``
(``dense`` = the pooler, ``out_proj`` = the head) when it reads the ``<cls>`` state through a
pooler (``pooling=cls``); a mean-pooled head has no transformers counterpart and is refused.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .. import runs
from ..errors import QkvError
from ..files import atomic_write, read_json, read_safetensors, refuse_nonempty, write_json
from ..models.config import EncoderConfig, ModelConfig
from ..models.model_types import DECODER_LM, ENCODER, built_as
from ..runs.layout import TASK, select_weights
from ..train.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, peft_library
from . import keymap
from .convert import hf_state, layer_counts, write_hf
from .families import Family, family_for

logger = logging.getLogger(__name__)

# recipe → (PEFT task type, the transformers Auto class that builds the task model, qkv head)
TASKS = {
    "lm": ("CAUSAL_LM", "AutoModelForCausalLM", None),
    "text-cls": ("SEQ_CLS", "AutoModelForSequenceClassification", "sequence"),
    "protein-cls": ("SEQ_CLS", "AutoModelForSequenceClassification", "sequence"),
    "protein-residue": ("TOKEN_CLS", "AutoModelForTokenClassification", "residue"),
}
PEFT_PREFIX = "base_model.model."  # what PeftModel puts before the task model's module names


@dataclass(frozen=True)
class PeftExport:
    """What :func:`export_peft` wrote: the folder ``out``, the ``auto_class`` of transformers
    that loads ``out/base`` for the adapter, how ``W0`` was obtained (``base_weights``:
    ``"from best.safetensors"``, the checkpoint it was read from, or ``"= W - (α/r)·B A"``),
    PEFT's ``target_modules`` and ``modules_to_save``; what its model card says of it: the run's
    model ``config``, its ``parameters`` and ``peft_config`` (``adapter_config.json``)."""

    out: Path
    auto_class: str
    base_weights: str
    target_modules: list[str]
    modules_to_save: list[str]
    config: ModelConfig
    parameters: int
    peft_config: dict


def export_peft(run_dir: str | Path, out_dir: str | Path) -> PeftExport:
    """Write a LoRA run's adapters as a PEFT adapter beside its base model (module docstring).
    Everything is computed and checked before anything is written.

    Shapes: an adapted ``(d_out, d_in)`` projection has ``lora_A (r, d_in)`` and ``lora_B
    (d_out, r)``, float32 as trained; a packed ``(3·D, D)`` one becomes three ``lora_B
    (D, r)`` with the same ``lora_A``.

    Raises:
        QkvError: no run directory, a run without adapters (``qkv convert --to hf`` exports
            it), an ``out_dir`` that exists and is not empty, a recipe or head transformers has
            no class for (mean pooling), a model the HF family cannot express, no peft.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    task_type, auto_class, level = _task(run_dir, out_dir)
    settings, rank, alpha = _lora_settings(run_dir)
    adapters = _adapters(read_safetensors(run_dir / ADAPTER_WEIGHTS), run_dir)
    model, _ = runs.load_run(run_dir)
    if not (built_as(model, ENCODER) or built_as(model, DECODER_LM)):
        raise QkvError(
            f"{run_dir} holds a {type(model).__name__}; qkv exports the adapters of encoders and LMs"
        )
    family = family_for(model.config)

    # the frozen weights W0 back in the model: the base the adapters apply to
    params = dict(model.named_parameters())
    frozen, source = _frozen_weights(run_dir, params, adapters, alpha / rank)
    with torch.no_grad():
        for name, w0 in frozen.items():
            params[f"{name}.weight"].copy_(w0)
    hf_config, base_tensors = hf_state(model, run_dir, frozenset({"mlm"}) if level else frozenset())
    head = _head(model, family.name, level, run_dir)
    if level:
        classes = _classes(run_dir, head)
        hf_config["id2label"] = dict(enumerate(classes))
        hf_config["label2id"] = {c: i for i, c in enumerate(classes)}

    tensors, transposed, targets = _hf_adapters(adapters, model.config, family, run_dir, head)
    tensors.update({PEFT_PREFIX + k: v.detach().contiguous().clone() for k, v in head.items()})
    modules_to_save = sorted({k.split(".")[0] for k in head})
    peft_config = _peft_config(
        settings, rank, alpha, targets, transposed, modules_to_save, task_type, (out_dir / "base").resolve()
    )

    write_hf(run_dir, out_dir / "base", hf_config, base_tensors)
    atomic_write(out_dir / ADAPTER_WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_json(out_dir / ADAPTER_CONFIG, peft_config)
    logger.debug(f"exported the adapters of {run_dir} for PEFT into {out_dir} (W0: {source})")
    return PeftExport(
        out_dir,
        auto_class,
        source,
        targets,
        modules_to_save,
        config=model.config,
        parameters=model.num_parameters(),
        peft_config=peft_config,
    )


def _task(run_dir: Path, out_dir: Path) -> tuple[str, str, str | None]:
    """``TASKS``'s ``(task_type, auto_class, level)`` for the run's recipe, after checking that
    ``run_dir`` holds LoRA adapters and ``out_dir`` is free (raises :class:`QkvError`)."""
    if not run_dir.is_dir():
        raise QkvError(f"run directory not found: {run_dir}")
    if not (run_dir / ADAPTER_CONFIG).is_file() or not (run_dir / ADAPTER_WEIGHTS).is_file():
        raise QkvError(f"{run_dir} has no LoRA adapters; qkv convert --to hf exports it")
    refuse_nonempty(out_dir, "folder")
    recipe = runs.run_recipe(run_dir)
    if recipe not in TASKS:
        raise QkvError(f"{run_dir} is a {recipe!r} run; qkv exports the adapters of {', '.join(TASKS)} runs")
    return TASKS[recipe]


def _lora_settings(run_dir: Path) -> tuple[dict, int, float]:
    """``(settings, rank, alpha)`` of the run's LoRA settings file (raises :class:`QkvError`
    unless it is qkv's)."""
    settings = read_json(run_dir / ADAPTER_CONFIG)
    if settings.get("peft_type") != "LORA" or not all(
        isinstance(settings.get(k), (int, float)) for k in ("rank", "alpha")
    ):
        raise QkvError(f"{run_dir / ADAPTER_CONFIG} is not qkv's LoRA settings (peft_type LORA, rank, alpha)")
    return settings, int(settings["rank"]), float(settings["alpha"])


def _peft_config(
    settings: dict,
    rank: int,
    alpha: float,
    targets: list[str],
    transposed: bool,
    modules_to_save: list[str],
    task_type: str,
    base: Path,
) -> dict:
    """``adapter_config.json``'s contents: PEFT's own ``LoraConfig`` (so every key it expects
    is there), sets as sorted lists, ``target_modules`` in the order the weights are written."""
    config = peft_library().LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=float(settings.get("dropout", 0.0)),
        target_modules=targets,
        fan_in_fan_out=transposed,
        bias="none",
        modules_to_save=modules_to_save or None,
        task_type=task_type,
        base_model_name_or_path=str(base),
        inference_mode=True,
    )
    peft_config = {k: sorted(v) if isinstance(v, set) else v for k, v in config.to_dict().items()}
    peft_config["target_modules"] = targets  # in the order written (to_dict gives a set)
    return peft_config


def _adapters(state: dict[str, torch.Tensor], run_dir: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """qkv's adapter file (``layers.0.self_attn.w_qkv.lora_A.weight`` ...) → ``{module: (A, B)}``."""
    modules = sorted({k.rsplit(".lora_", 1)[0] for k in state if ".lora_" in k})
    missing = [f"{m}.lora_{x}.weight" for m in modules for x in "AB" if f"{m}.lora_{x}.weight" not in state]
    if missing or not modules:
        raise QkvError(
            f"{run_dir / ADAPTER_WEIGHTS} is not a LoRA adapter file"
            + (f": no {', '.join(missing[:4])}" if missing else "")
        )
    return {m: (state[f"{m}.lora_A.weight"], state[f"{m}.lora_B.weight"]) for m in modules}


def _frozen_weights(
    run_dir: Path,
    params: Mapping[str, torch.Tensor],
    adapters: dict[str, tuple[torch.Tensor, torch.Tensor]],
    scaling: float,
) -> tuple[dict[str, torch.Tensor], str]:
    """``({module: W0}, where W0 came from)``: the frozen ``base_layer`` weights of the
    checkpoint the run's weights were chosen from, when its adapters are the saved ones bit for
    bit; else the merged weights minus ``scaling · B A`` (PEFT's ``get_delta_weight``).

    Raises:
        QkvError: an adapter whose module the model lacks, or whose shapes do not fit it.
    """
    for m, (a, b) in adapters.items():
        w = params.get(f"{m}.weight")
        if w is None:
            raise QkvError(f"{run_dir}: the adapter of {m} has no projection in the model")
        if (b.shape[0], a.shape[1]) != tuple(w.shape) or a.shape[0] != b.shape[1]:
            raise QkvError(
                f"{run_dir}: the adapter of {m} (A {tuple(a.shape)}, B {tuple(b.shape)}) does not fit "
                f"its weight {tuple(w.shape)}"
            )
    checkpoint = select_weights(run_dir)
    try:
        if checkpoint.is_file():
            with safe_open(checkpoint, "pt") as f:
                keys = set(f.keys())
                wanted = [f"{m}.{k}" for m in adapters for k in ("base_layer.weight", *_DEFAULT_AB)]
                if all(k in keys for k in wanted) and all(
                    torch.equal(f.get_tensor(f"{m}.lora_A.default.weight"), a)
                    and torch.equal(f.get_tensor(f"{m}.lora_B.default.weight"), b)
                    for m, (a, b) in adapters.items()
                ):
                    frozen = {m: f.get_tensor(f"{m}.base_layer.weight") for m in adapters}
                    return frozen, f"from {checkpoint.name}"
    except (SafetensorError, OSError) as exc:  # a damaged checkpoint: the subtraction needs none
        logger.warning(f"{checkpoint} unreadable ({exc}); W0 = W - (α/r)·B A")
    with torch.no_grad():
        frozen = {m: params[f"{m}.weight"] - (b @ a) * scaling for m, (a, b) in adapters.items()}
    return frozen, "= W - (α/r)·B A"


_DEFAULT_AB = ("lora_A.default.weight", "lora_B.default.weight")  # PEFT's names while training


def _head(model: torch.nn.Module, family: str, level: str | None, run_dir: Path) -> dict[str, torch.Tensor]:
    """The trained task head in the transformers task model's names (``classifier.weight``
    ...); ``{}`` for a language model.

    Raises:
        QkvError: a sequence head transformers does not compute (mean pooling, or the
            ``<cls>`` state without a pooler).
    """
    if level is None:
        return {}
    state = model.state_dict()
    if level == "residue":
        return {f"classifier.{k}": state[f"residue_head.{k}"] for k in ("weight", "bias")}
    config = cast(EncoderConfig, model.config)  # a task head: the model is an encoder
    if config.pooling != "cls" or not config.pooler:
        reads = "the mean of the tokens" if config.pooling == "mean" else "the <cls> state without a pooler"
        raise QkvError(
            f"{run_dir}: its sequence head reads {reads}, which transformers' "
            f"{'Esm' if family == 'esm' else 'Bert'}ForSequenceClassification does not compute "
            "(dense + tanh on the first token); train with pooling=cls from a checkpoint with a pooler"
        )
    if family == "esm":
        return {
            **{f"classifier.dense.{k}": state[f"pooler.0.{k}"] for k in ("weight", "bias")},
            **{f"classifier.out_proj.{k}": state[f"sequence_head.{k}"] for k in ("weight", "bias")},
        }
    return {f"classifier.{k}": state[f"sequence_head.{k}"] for k in ("weight", "bias")}


def _classes(run_dir: Path, head: dict[str, torch.Tensor]) -> list[str]:
    """The class names in ``task.json`` (``LABEL_i`` without one), as many as the head's rows."""
    n = next(v.shape[0] for k, v in head.items() if k.endswith("bias") and "dense" not in k)
    task = runs.run_json(run_dir, TASK, missing={})
    classes = [str(c) for c in task.get("classes", ())]
    return classes if len(classes) == n else [f"LABEL_{i}" for i in range(n)]


def _hf_adapters(
    adapters: dict[str, tuple[torch.Tensor, torch.Tensor]],
    config: ModelConfig,
    family: Family,
    run_dir: Path,
    head: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], bool, list[str]]:
    """``(PEFT tensors, fan_in_fan_out, target_modules)`` of qkv's adapters in the HF names of
    ``family``'s key map: packed projections split (shared ``A``, ``B`` by rows).

    ``target_modules`` are PEFT suffixes (``attention.self.query``, ``attn.c_attn``); where
    one would also match a projection without an adapter (BERT's ``output.dense`` is the end of
    ``attention.output.dense`` too), that projection's per-layer names
    (``encoder.layer.0.output.dense``) are listed instead.

    Raises:
        QkvError: an adapted projection the family's key map does not name, or a family whose
            adapted projections are partly ``Conv1D`` and partly Linear.
    """
    rules = keymap.expand(family.rules, layer_counts(config), {r.part for r in family.rules})
    by_qkv = {r.qkv: r for r in rules}
    tensors: dict[str, torch.Tensor] = {}
    transposed = set()
    adapted: dict[str, list[str]] = {}  # the layer-relative suffix → its full HF module names
    for m, (a, b) in adapters.items():
        rule = by_qkv.get(f"{m}.weight")
        if rule is None:
            raise QkvError(f"{run_dir}: the adapter of {m} has no {family.name} counterpart")
        names = [h.removesuffix(".weight") for h in rule.hf_names]
        for name, rows in zip(names, b.chunk(len(names), dim=0), strict=True):
            tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = a.contiguous().clone()
            tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = rows.contiguous().clone()
            layer = re.match(r"layers\.(\d+)\.", m)
            suffix = name.split(f".{layer.group(1)}.", 1)[1] if layer else name
            adapted.setdefault(suffix, []).append(name)
        transposed.add(rule.transpose)
    if len(transposed) > 1:
        raise QkvError(
            f"{run_dir}: PEFT's fan_in_fan_out is one setting, but these {family.name} projections differ"
        )
    every = {h.removesuffix(".weight") for r in rules for h in r.hf_names} | {
        k.rsplit(".", 1)[0] for k in head
    }
    targets: list[str] = []
    for suffix, names in sorted(adapted.items()):
        matched = {n for n in every if n == suffix or n.endswith(f".{suffix}")}
        if matched <= {n for ns in adapted.values() for n in ns}:
            targets.append(suffix)
        else:
            targets += sorted(n.removeprefix(family.prefix) for n in names)
    return tensors, transposed == {True}, targets
