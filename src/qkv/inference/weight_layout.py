"""Weight memory layout for fast CPU decoding, chosen once when a model is loaded for inference.

Decoding one token multiplies a vector by every weight matrix, so on a CPU it is limited by
how fast the weights stream from memory (``benchmarks/limits.py`` measures that bound and how
close decoding gets to it). The kernel that streams a weight fastest depends on its dtype
(measurements: ``benchmarks/RESULTS.md``, "Weight layouts for CPU decoding"):

- float32: PyTorch's own kernel with ``W`` stored ``(in_features, out_features)``, which on
  some CPUs (AVX2) streams faster than the default ``(out, in)`` storage and on others is no
  slower.
- bfloat16, on a CPU with native bfloat16 (AVX512_BF16/AMX): oneDNN's inference kernel on a
  weight it has reordered once into its blocked layout (:class:`PackedLinear`), which streams
  bfloat16 weights faster than ``F.linear`` (that converts them as it goes). The FFN's
  activation is fused into its first product.
- bfloat16 elsewhere (AVX2: emulated): ``F.linear`` on contiguous weights.

Batched inference (encoding many sentences or proteins at once, ``batch_rows``) is bound by
FLOPs instead, and a separate pass of the FFN's activation over the ``(tokens, d_ff)`` inner
layer costs about as much as the product before it. There every CPU linear goes to oneDNN, in
float32 too, with the activation fused into the product.

Decoding in bfloat16 is also made batch-invariant (``batch_invariant``): a kernel may sum a
row's products in another order when it computes one row than when it computes many, and one
bfloat16 rounding (2^-8) is enough to flip a greedy token at a near-tie, so cached decoding
would not always reproduce a full forward over the same text. Attention then runs one query
per call (the ``"invariant"`` backend, :func:`qkv.nn.attention.per_query_attention`), and a product whose
one-row kernel sums differently runs a single row as two.

The layout is set by giving each weight a *new* ``nn.Parameter`` (same values and shape, other
strides) or by wrapping an ``nn.Linear`` in a :class:`PackedLinear` that keeps its Parameter,
so nothing rewrites ``.data`` behind autograd's or an optimizer's back, tied weights stay tied,
and the state dict is the same whatever the layout (safetensors saves contiguous copies).
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from ..device import cpu_has_native_bf16
from ..nn.attention import MultiHeadAttention
from ..nn.feedforward import PositionwiseFeedForward

_M = TypeVar("_M", bound=nn.Module)

# oneDNN's post-op names for the FFN activations: (attribute, algorithm); "none" = exact GELU.
_POST_OPS = {
    None: ("none", ""),
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
}


def onednn_available() -> bool:
    """Whether PyTorch was built with oneDNN (float32 :class:`PackedLinear`). Never raises."""
    try:
        return bool(torch.backends.mkldnn.is_available())
    except (AttributeError, RuntimeError):
        return False


def onednn_bf16_available() -> bool:
    """Whether :class:`PackedLinear` can run bfloat16 here: PyTorch built with oneDNN, on a CPU
    that computes bfloat16 natively. Never raises."""
    try:
        return (
            onednn_available()
            and cpu_has_native_bf16()
            and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        )
    except (AttributeError, RuntimeError):  # a torch build without these ops
        return False


class FrozenLinear(nn.Module):
    """Base of the inference-only stand-ins for an ``nn.Linear`` (:class:`PackedLinear`,
    :class:`~qkv.inference.quantize.Int8Linear`): it keeps the wrapped module's own ``weight`` and
    ``bias`` Parameters (the state dict, tied embeddings and read-outs stay as they were) while a
    subclass computes from a derived copy made once (a snapshot, not saved), in :meth:`compute`.

    Raises:
        RuntimeError: ``forward`` in training mode (the copy would not follow the weight).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.train(linear.training)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            raise RuntimeError(
                f"{type(self).__name__} is for inference (its weight is a snapshot): "
                "call model.eval() before preparing the model"
            )
        return self.compute(x)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


class PackedLinear(FrozenLinear):
    """Inference-only stand-in for a CPU ``nn.Linear``: ``y = act(x Wᵀ + b)`` with ``W``
    reordered once by oneDNN into the blocked layout its matrix-vector kernel streams fastest,
    and the activation (``None``, ``"relu"``, ``"gelu"`` or ``"gelu_tanh"``) fused into the same kernel.

    ``weight`` and ``bias`` are the wrapped module's own Parameters (so the state dict, tied
    embeddings and attention read-outs are unchanged); the reordered copy is a plain attribute
    (not saved, not moved by ``.to()``), a snapshot of ``weight`` when it was made. Prepare a
    model after moving and casting it, and not for training: ``forward`` in training mode raises.

    Shape: ``x (..., in_features)`` → ``(..., out_features)``, the weight's dtype (bfloat16).

    ``batch_invariant=True``: a row's output must not depend on how many rows share the call
    (cached decoding then reproduces full recomputation bit for bit). oneDNN's many-row
    kernels agree row for row, but for some shapes its one-row kernel sums in another order
    (some rows then differ in the last bit). Which shapes is measured here, once, on 64 random
    rows; where they differ, a single row is run as two
    (``one_row_as_two``), which costs that product little: it streams the same weights.

    Raises:
        RuntimeError: in training mode, or where oneDNN cannot run (see
            :func:`onednn_bf16_available`).
        ValueError: an activation other than ``None``, ``"relu"``, ``"gelu"``, ``"gelu_tanh"``.
    """

    def __init__(
        self,
        linear: nn.Linear,
        activation: str | None = None,
        batch_rows: int = 1,
        batch_invariant: bool = False,
    ) -> None:
        if activation not in _POST_OPS:
            raise ValueError(f"unknown fused activation {activation!r}; choose one of {list(_POST_OPS)}")
        super().__init__(linear)
        self.activation = activation
        self.post_op, self.algorithm = _POST_OPS[activation]
        # The batch-size hint picks oneDNN's layout: 1 for decoding's one-row products (larger
        # batches, prefill and batched generation, run on it too), the rows of a batch for
        # batched encoding.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous(), batch_rows)
        self.one_row_as_two = batch_invariant and not self._one_row_kernel_agrees()

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, self.post_op, [], self.algorithm)

    @torch.no_grad()
    def _one_row_kernel_agrees(self, rows: int = 64) -> bool:
        x = torch.randn(rows, self.in_features, generator=torch.Generator().manual_seed(0))
        x = x.to(self.weight.dtype)
        return torch.equal(self._product(x), torch.cat([self._product(r[None]) for r in x]))

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        if self.one_row_as_two and x.numel() == self.in_features:
            return self._product(x.reshape(1, -1).expand(2, -1))[:1].reshape(*x.shape[:-1], -1)
        return self._product(x)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation}" + (
            ", one_row_as_two=True" if self.one_row_as_two else ""
        )


def _relaid(w: torch.Tensor) -> torch.Tensor:
    """float32 weights stored ``(in, out)`` (a transposed view keeps the ``(out, in)`` shape),
    other dtypes contiguous; the Parameter itself when it already is."""
    if w.dtype == torch.float32:
        data = w if w.t().is_contiguous() else w.t().contiguous().t()
    else:
        data = w.contiguous()
    return w if data is w else nn.Parameter(data, requires_grad=w.requires_grad)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


@torch.no_grad()
def prepare_for_inference(
    model: _M, batch_rows: int | None = None, batch_invariant: bool | None = None
) -> _M:
    """Give every CPU ``nn.Linear`` the weight layout that decodes fastest for its dtype (see the
    module docstring). Returns ``model`` (changed in place).

    ``batch_rows``: the model serves batched inference (encoders: about this many token rows
    per product) instead of decoding: every float32/bfloat16 CPU linear becomes a
    :class:`PackedLinear` (bfloat16 only where the CPU computes it natively), the FFN's
    activation fused. The model must be in eval mode (else nothing is done).

    bfloat16 linears on a CPU with native bfloat16 and oneDNN become :class:`PackedLinear`
    (an FFN's activation fused into ``w_1``; the model must be in eval mode and stays for
    inference). Other float32/bfloat16 weights get new Parameters in the chosen strides,
    assigned to every module that held the old one, so tied weights (an embedding shared with
    the output projection) stay one parameter. Values (up to the fused activation's rounding in
    bfloat16), shapes and the state dict are unchanged.

    ``batch_invariant`` (default: when decoding, i.e. without ``batch_rows``): make the
    bfloat16 CPU parts compute each row the same whatever the number of rows in the call,
    so greedy decoding with the key/value cache gives bit for bit the logits of a full
    forward over the sequence: attention modules take the ``"invariant"`` backend (one SDPA
    call per query, :func:`qkv.nn.attention.per_query_attention`) and packed products whose one-row kernel
    sums in another order run single rows as two (:class:`PackedLinear`). In float32 the
    kernels' order effects (~1e-7 relative, float32's rounding) stay far below greedy
    decoding's margins, and float32 is left as it is. (What this costs and gains on
    GPT-2-small: ``benchmarks/RESULTS.md``.) Call it last, on a model loaded for inference: an
    optimizer built earlier would still hold the old parameters. Nothing is done on other
    devices, where the fused kernels prefer the default layout. Safe to call twice.
    """
    packs = {
        torch.bfloat16: onednn_bf16_available() and not model.training,
        torch.float32: batch_rows is not None and onednn_available() and not model.training,
    }
    invariant = batch_rows is None if batch_invariant is None else batch_invariant
    relaid: dict[int, torch.Tensor] = {}
    for parent in model.modules():
        if (
            invariant
            and isinstance(parent, MultiHeadAttention)
            and parent.w_o.weight.dtype == torch.bfloat16
            and parent.w_o.weight.device.type == "cpu"
        ):
            parent.backend = "invariant"
        for name, child in parent.named_children():
            if type(child) is not nn.Linear or child.weight.device.type != "cpu":
                continue
            w = child.weight
            if packs.get(w.dtype, False):
                # The FFN whose activation fuses into this (its w_1) linear's kernel, if any.
                ffn = (
                    parent
                    if isinstance(parent, PositionwiseFeedForward)
                    and name == "w_1"
                    and parent.activation_name in _POST_OPS
                    else None
                )
                setattr(
                    parent,
                    name,
                    PackedLinear(
                        child,
                        ffn.activation_name if ffn is not None else None,
                        batch_rows or 1,
                        invariant and w.dtype == torch.bfloat16,
                    ),
                )
                if ffn is not None:  # the activation now runs inside w_1's kernel
                    ffn.activation = _identity
            elif id(w) not in relaid and batch_rows is None:
                relaid[id(w)] = _relaid(w)
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False, remove_duplicate=False)):
            if id(p) in relaid and relaid[id(p)] is not p:
                setattr(module, name, relaid[id(p)])
    return model
