"""LoRA adapters: fine-tune a pretrained model by training a low-rank update of some of its
projections, every pretrained weight frozen.

Source: Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models", §4.1: a frozen
weight ``W0 (d_out, d_in)`` gets a trainable update ``ΔW = B A`` with ``B (d_out, r)`` (zeros
at the start, so training starts from the pretrained model), ``A (r, d_in)`` and ``r ≪
min(d_in, d_out)``; the forward pass is ``h = W0 x + (α / r) · B A x``. Once trained, ``B A``
is merged into ``W0`` (§4.1, "No Additional Inference Latency"), so a LoRA run's
``model.safetensors`` is an ordinary model of the pretrained architecture.

The layers are PEFT's (``peft.inject_adapter_in_model``, Hugging Face's implementation). qkv
packs a self-attention's Q, K and V projections into one ``nn.Linear`` (``w_qkv``): an adapter
there is one rank-``r`` update of the packed ``(3·H·d_k, D)`` matrix, shared by the three (as
PEFT adapts GPT-2's packed ``c_attn``), not three updates of rank ``r``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..errors import ConfigError, QkvError
from ..files import atomic_write, write_json

# what ``train.lora_modules`` names → the qkv module names PEFT matches (suffixes of
# module paths): self-attention's packed Q/K/V, cross-attention's Q and packed K/V, the
# attention output W_O, the position-wise feed-forward W_1 and W_2 (§3.3).
MODULE_GROUPS = {"qkv": ("w_qkv", "w_q", "w_kv"), "o": ("w_o",), "ffn": ("w_1", "w_2")}

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA settings of a run (``train.lora_*``): ``rank`` r, ``alpha`` (the update is scaled
    by ``alpha / rank``), ``dropout`` on the adapter's input, ``modules``: comma-separated groups
    of :data:`MODULE_GROUPS` (``"qkv,o"``: every attention projection)."""

    rank: int
    alpha: float
    dropout: float
    modules: str

    def targets(self) -> list[str]:
        """The module names PEFT adapts. Raises :class:`ConfigError` on an unknown group."""
        groups = [g.strip() for g in self.modules.split(",") if g.strip()]
        unknown = [g for g in groups if g not in MODULE_GROUPS]
        if unknown or not groups:
            raise ConfigError(
                f"train.lora_modules={self.modules!r}: choose among {', '.join(MODULE_GROUPS)}, "
                "comma-separated (qkv,o,ffn)"
            )
        return [name for g in groups for name in MODULE_GROUPS[g]]


def peft_library():
    """The ``peft`` module. Raises :class:`QkvError` (how to install it) when it is missing."""
    try:
        import peft
    except ImportError:
        raise QkvError("LoRA (train.lora_rank) needs the peft library: pip install 'qkv[lora]'") from None
    return peft


def add_lora(model: torch.nn.Module, lora: LoraSettings, trainable: tuple[str, ...] = ()) -> torch.nn.Module:
    """Wrap ``model``'s projections named by ``lora.modules`` in LoRA layers, in place, and
    freeze everything but the adapters and the parameters whose names start with one of
    ``trainable`` (a task head: ``("sequence_head",)``).

    Each adapted ``nn.Linear(d_in, d_out)`` gains ``rank · (d_in + d_out)`` trainable
    parameters; ``B`` starts at zero, so the model's outputs are unchanged until it trains.

    Raises:
        ConfigError: unknown module groups, or none of them in this model.
        QkvError: peft is not installed.
    """
    peft = peft_library()
    targets = lora.targets()
    present = {name.rpartition(".")[2] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    adapted = sorted(present & set(targets))
    if not adapted:
        raise ConfigError(f"train.lora_modules={lora.modules!r} names no projection of this model")
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=adapted,
        bias="none",
    )
    peft.inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name or name.startswith(trainable))
    return model


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds LoRA layers (:func:`add_lora`)."""
    return any(_is_lora(m) for m in model.modules())


def _is_lora(module: torch.nn.Module) -> bool:
    return type(module).__module__.startswith("peft.") and hasattr(module, "get_base_layer")


def save_adapters(model: torch.nn.Module, run_dir: Path, lora: LoraSettings) -> None:
    """The adapters alone, in PEFT's file names: ``adapter_model.safetensors`` (the ``lora_A``
    and ``lora_B`` matrices) and ``adapter_config.json`` (rank, alpha, dropout, modules)."""
    from safetensors.torch import save_file

    state = {
        k: v.detach().contiguous()
        for k, v in peft_library().get_peft_model_state_dict(model, save_embedding_layers=False).items()
    }
    atomic_write(run_dir / ADAPTER_WEIGHTS, lambda tmp: save_file(state, tmp))
    adapted = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if _is_lora(m)})
    write_json(run_dir / ADAPTER_CONFIG, {"peft_type": "LORA", **asdict(lora), "target_modules": adapted})


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold every adapter into its frozen weight (``W0 + (α/r)·B A``, Hu et al. 2021 §4.1) and
    put the plain ``nn.Linear`` back, in place: the model has its pretrained architecture and
    parameter names again (the merged weights stay frozen, as they were while training)."""
    for name, module in list(model.named_modules()):
        if _is_lora(module):
            module.merge()
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, module.get_base_layer())
    return model
