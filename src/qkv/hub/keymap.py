"""Declarative key maps between an HF checkpoint's tensor names and qkv's parameter names.

A :class:`Rule` says which HF tensor(s) make one qkv tensor: ``"bert.encoder.layer.{}.attention.
self.query.weight"`` (with ``{}`` the layer index) and its two siblings stack into qkv's packed
``"layers.{}.self_attn.w_qkv.weight"``; GPT-2's ``Conv1D`` weights are stored transposed. The
same rules run both ways (:func:`to_qkv` on import, :func:`to_hf` on export), so the two
directions cannot drift apart. Every HF tensor is accounted for: mapped, skipped by name (buffers
that are not weights), kept aside (heads qkv does not model) or reported as unexpected.
"""

from __future__ import annotations

import re
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

import torch

from ..errors import QkvError


@dataclass(frozen=True)
class Rule:
    """HF name(s) → one qkv name. ``{}`` is the layer index (the rule is repeated per layer).

    Attributes:
        hf: one HF name, or several whose tensors are concatenated along dim 0 (Q, K, V into a
            packed projection) and split back into equal parts on export.
        qkv: the qkv parameter name.
        transpose: the HF tensor is stored ``(in, out)`` (GPT-2's ``Conv1D``).
        part: which part of the HF architecture the tensor belongs to: ``"base"`` (always
            there), or a head (``"pooler"``, ``"mlm"``, ``"lm_head"``) that a checkpoint may lack.
        stack: whose layer count ``{}`` runs over (``"layers"``; ``"encoder"``/``"decoder"``
            in an encoder-decoder).
        reshape: HF stores the same elements, in the same order, in another shape (Marian's
            ``final_logits_bias`` is ``(1, V)``, qkv's bias ``(V,)``; ViT's patch projection is
            a ``(D, C, P, P)`` convolution kernel, qkv's a ``(D, C·P·P)`` matrix). Import takes
            the qkv parameter's shape; export the shape the family's ``hf_shapes`` gives.
    """

    hf: str | tuple[str, ...]
    qkv: str
    transpose: bool = False
    part: str = "base"
    stack: str = "layers"
    reshape: bool = False

    @property
    def hf_names(self) -> tuple[str, ...]:
        return (self.hf,) if isinstance(self.hf, str) else self.hf

    def expand(self, n_layers: int) -> list[Rule]:
        """This rule with ``{}`` filled in for every layer (itself when it has no ``{}``)."""
        if "{}" not in self.qkv:
            return [self]
        return [
            replace(self, hf=tuple(h.format(i) for h in self.hf_names), qkv=self.qkv.format(i))
            for i in range(n_layers)
        ]


def expand(rules: tuple[Rule, ...], n_layers: int | dict[str, int], parts: set[str]) -> list[Rule]:
    """The per-layer rules of the ``parts`` a checkpoint has; ``n_layers``: one count, or one
    per ``Rule.stack``."""
    counts = n_layers if isinstance(n_layers, dict) else {"layers": n_layers}
    return [r for rule in rules if rule.part in parts for r in rule.expand(counts[rule.stack])]


def parts_present(rules: tuple[Rule, ...], hf_keys: set[str]) -> set[str]:
    """Which parts (``"base"``, heads) have at least one tensor in ``hf_keys``."""
    found = set()
    for r in rules:
        pattern = re.compile(re.escape(r.hf_names[0]).replace(r"\{\}", r"\d+"))
        if any(pattern.fullmatch(k) for k in hf_keys):
            found.add(r.part)
    return found


def to_qkv(
    hf_state: dict[str, torch.Tensor], rules: list[Rule], skip: tuple[str, ...], keep: tuple[str, ...]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Rename (and stack, transpose) an HF state dict into qkv names.

    Args:
        rules: expanded rules (:func:`expand`). skip: regular expressions of HF names that are
            not weights (dropped). keep: regular expressions of HF heads qkv does not model
            (returned aside, so an export can write them back).

    Returns:
        ``(qkv state dict, kept HF tensors)``.

    Raises:
        QkvError: a tensor a rule needs is missing, or the checkpoint holds tensors no rule,
            skip or keep pattern accounts for (all such names listed).
    """
    # Old TF-era names of LayerNorm parameters, which HF's own loader still renames (and
    # transformers 5 writes for some families): gamma is the weight, beta the bias.
    hf_state = {
        re.sub(
            r"(LayerNorm|layer_norm)\.gamma$",
            r"\1.weight",
            re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", k),
        ): v
        for k, v in hf_state.items()
    }
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    missing = [h for r in rules for h in r.hf_names if h not in hf_state]
    if missing:
        raise QkvError(
            f"checkpoint is missing {len(missing)} tensor(s): {', '.join(missing[:8])}"
            + (" ..." if len(missing) > 8 else "")
        )
    for r in rules:
        parts = [hf_state[h] for h in r.hf_names]
        t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        out[r.qkv] = t.t() if r.transpose else t
        used.update(r.hf_names)
    rest = [k for k in hf_state if k not in used and not any(re.fullmatch(p, k) for p in skip)]
    kept = {k: hf_state[k] for k in rest if any(re.fullmatch(p, k) for p in keep)}
    unexpected = [k for k in rest if k not in kept]
    if unexpected:
        raise QkvError(
            f"checkpoint has {len(unexpected)} unexpected tensor(s): "
            f"{', '.join(unexpected[:8])}" + (" ..." if len(unexpected) > 8 else "")
        )
    return out, kept


def to_hf(
    qkv_state: dict[str, torch.Tensor], rules: list[Rule], shapes: dict[str, tuple[int, ...]] | None = None
) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_qkv`: qkv names → HF names (packed tensors split into equal
    parts, ``Conv1D`` weights transposed back, ``reshape`` rules given their HF shape from
    ``shapes``). Tensors are contiguous copies."""
    out = {}
    for r in rules:
        t = qkv_state[r.qkv]
        t = t.t() if r.transpose else t
        if r.reshape:
            if shapes is None:
                raise ValueError(f"to_hf needs `shapes` for the reshape rule of {r.qkv}")
            t = t.reshape(shapes[r.hf_names[0]])
        chunks = t.chunk(len(r.hf_names), dim=0) if len(r.hf_names) > 1 else (t,)
        for name, chunk in zip(r.hf_names, chunks, strict=True):
            out[name] = chunk.contiguous().clone()
    return out


def load_into(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    may_lack: tuple[str, ...],
    reshaped: AbstractSet[str] = frozenset(),
) -> None:
    """Copy ``state`` into ``model``'s parameters, checking names and shapes.

    ``reshaped``: qkv names whose tensors only need the parameter's shape (same elements).
    ``may_lack``: prefixes of qkv parameters the checkpoint need not provide (task heads it
    does not have); they keep their initialisation. Tied parameters count as provided when
    any of their names is.

    Raises:
        QkvError: a tensor whose shape differs from the parameter's (both shapes named), a qkv
            name the model does not have, or a parameter nothing provides.
    """
    params = dict(model.state_dict(keep_vars=True))
    state = {
        n: t.reshape(params[n].shape)
        if n in reshaped and n in params and t.numel() == params[n].numel()
        else t
        for n, t in state.items()
    }
    for name, t in state.items():
        if name not in params:
            raise QkvError(f"converted tensor {name} has no place in the qkv model")
        if tuple(t.shape) != tuple(params[name].shape):
            raise QkvError(
                f"tensor {name}: checkpoint shape {tuple(t.shape)} != model shape {tuple(params[name].shape)}"
            )
    provided = {id(params[n]) for n in state}
    lacking = [n for n, p in params.items() if id(p) not in provided and not n.startswith(may_lack)]
    if lacking:
        raise QkvError(f"checkpoint provides no value for {', '.join(lacking[:8])}")
    with torch.no_grad():
        for name, t in state.items():
            params[name].copy_(t.to(params[name].dtype))


def fairseq_layer_names(layer: str, attention_norm: str, output_norm: str) -> tuple[tuple[str, str], ...]:
    """The renames of a fairseq ``TransformerSentenceEncoderLayer`` (fair-esm's ESM-2, fairseq's
    RoBERTa) to an HF family's names: ``(regular expression matched at the start of a fairseq
    name, replacement)``, the rest of the name (``weight``/``bias``) kept. ``layer`` is the HF
    prefix of layer ``\\1`` (e.g. ``"esm.encoder.layer.\\1."``); ``attention_norm`` and
    ``output_norm`` the HF names of the layer's two norms under it."""
    return (
        (r"layers\.(\d+)\.self_attn\.q_proj\.", layer + "attention.self.query."),
        (r"layers\.(\d+)\.self_attn\.k_proj\.", layer + "attention.self.key."),
        (r"layers\.(\d+)\.self_attn\.v_proj\.", layer + "attention.self.value."),
        (r"layers\.(\d+)\.self_attn\.out_proj\.", layer + "attention.output.dense."),
        (r"layers\.(\d+)\.self_attn_layer_norm\.", layer + attention_norm),
        (r"layers\.(\d+)\.fc1\.", layer + "intermediate.dense."),
        (r"layers\.(\d+)\.fc2\.", layer + "output.dense."),
        (r"layers\.(\d+)\.final_layer_norm\.", layer + output_norm),
    )


def rename_fairseq(
    state: dict[str, torch.Tensor], table: tuple[tuple[str, str], ...], prefix: re.Pattern, what: str
) -> dict[str, torch.Tensor]:
    """``state`` with each name stripped of ``prefix`` and renamed by the first entry of
    ``table`` (:func:`fairseq_layer_names` style) that matches it.

    Raises:
        QkvError: names no entry matches (the first ten listed), as not a ``what`` state dict.
    """
    out, unknown = {}, []
    for name, tensor in state.items():
        name = prefix.sub("", name)
        renamed = next((re.sub(f"^{p}", r, name) for p, r in table if re.match(p, name)), None)
        if renamed is None:
            unknown.append(name)
        else:
            out[renamed] = tensor
    if unknown:
        raise QkvError(f"not a {what} state dict: unknown tensor(s) {', '.join(sorted(unknown)[:10])}")
    return out
