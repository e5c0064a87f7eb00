"""The recurrent network the lecture starts from, and the attention that first fixed it.

- :func:`elman_step`: one step of the lecture's recurrence, ``h_i = tanh(W_hhᵀ h_{i−1} +
  W_xhᵀ x_i)``, ``ŷ_i = W_hyᵀ h_i`` (Elman 1990), written out so it can be read and checked
  against ``torch.nn.RNN``.
- :func:`gru_step`: one step of the gated recurrent unit (Cho et al. 2014, §2.3) in
  ``torch.nn.GRU``'s form, what qkv's recurrent models run (through the fused ``nn.GRU``).
- :class:`AdditiveAttention`: Bahdanau, Cho & Bengio 2015, §3.1 and Appendix A.1.2:
  ``e_ij = v_aᵀ tanh(W_a s_{i−1} + U_a h_j)``, ``α_ij = softmax_j(e_ij)``, ``c_i = Σ_j α_ij h_j``.

The lecture's case against recurrence (poor long-term memory, an encoding bottleneck, no
parallelism over positions) is measured in ``benchmarks/why_attention.py``.
"""

from __future__ import annotations

import torch
from torch import nn


def elman_step(
    x: torch.Tensor,
    h: torch.Tensor,
    w_xh: torch.Tensor,
    w_hh: torch.Tensor,
    w_hy: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One step of the lecture's recurrent network: ``h_i = tanh(W_hhᵀ h_{i−1} + W_xhᵀ x_i
    (+ b))`` and ``ŷ_i = W_hyᵀ h_i`` (Elman 1990; the lecture writes it without biases).

    Shapes: ``x (B, D_in)``, ``h (B, H)`` the previous state, ``w_xh (D_in, H)``, ``w_hh
    (H, H)``, ``w_hy (H, D_out)``, ``bias (H,)``; the matrices are stored as the lecture writes
    them (``x @ W_xh`` is ``W_xhᵀ x`` for a row vector). ``torch.nn.RNN`` keeps the transposes:
    ``weight_ih_l0`` is ``W_xhᵀ`` and ``weight_hh_l0`` is ``W_hhᵀ``, with two biases whose sum
    is ``bias``.

    Returns:
        ``(h_i (B, H), ŷ_i (B, D_out) or None without w_hy)``, in the inputs' dtype.
    """
    pre = x @ w_xh + h @ w_hh
    if bias is not None:
        pre = pre + bias
    h_next = torch.tanh(pre)
    return h_next, (h_next @ w_hy if w_hy is not None else None)


def gru_step(
    x: torch.Tensor,
    h: torch.Tensor,
    weight_ih: torch.Tensor,
    weight_hh: torch.Tensor,
    bias_ih: torch.Tensor,
    bias_hh: torch.Tensor,
) -> torch.Tensor:
    """One step of a GRU (Cho et al. 2014, §2.3), in the form ``torch.nn.GRU`` computes::

        r = σ(W_ir x + b_ir + W_hr h + b_hr)          reset gate
        z = σ(W_iz x + b_iz + W_hz h + b_hz)          update gate
        n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))  candidate state
        h' = (1 − z) ⊙ n + z ⊙ h

    (Cho et al. reset the state before its matrix, ``U(r ⊙ h)``; the fused kernels reset
    after it, ``r ⊙ (U h)``, which is what qkv trains with.) The gates are what the lecture's
    tanh recurrence lacks: ``z`` near 1 carries ``h`` across many steps unchanged, the remedy
    for its "poor long-term memory".

    Shapes: ``x (B, D_in)``, ``h (B, H)``; ``weight_ih (3H, D_in)``, ``weight_hh (3H, H)``,
    ``bias_ih``/``bias_hh (3H,)``, rows in the order r, z, n (``nn.GRU``'s ``weight_ih_l0``
    and friends). Returns ``h' (B, H)``.
    """
    xr, xz, xn = (x @ weight_ih.T + bias_ih).chunk(3, dim=-1)
    hr, hz, hn = (h @ weight_hh.T + bias_hh).chunk(3, dim=-1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1 - z) * n + z * h


class AdditiveAttention(nn.Module):
    """Additive ("concat") attention of Bahdanau et al. 2015 (§3.1, Appendix A.1.2): a
    one-hidden-layer network scores each source state against the decoder's previous state.

    ``e_ij = v_aᵀ tanh(W_a s_{i−1} + U_a h_j)``, ``α_ij = exp(e_ij) / Σ_k exp(e_ik)`` over the
    source positions that are not padding, ``c_i = Σ_j α_ij h_j``. Unlike Eq. 1 of Vaswani et
    al. there is no dot product and no scaling, and one "head".

    Args:
        d_query: width of the decoder state ``s``. d_key: width of the source states ``h``
            (2 × the encoder's width when it is bidirectional). d_attention: the hidden layer's
            width (``n`` in Bahdanau et al.'s appendix).

    Attributes ``n_heads`` (1) and ``d_k`` (``d_attention``) describe it as the explainer
    describes multi-head attention.
    """

    n_heads = 1

    def __init__(self, d_query: int, d_key: int, d_attention: int) -> None:
        super().__init__()
        self.d_k = d_attention
        self.w_query = nn.Linear(d_query, d_attention, bias=False)  # W_a
        self.w_key = nn.Linear(d_key, d_attention, bias=True)  # U_a (its bias is the layer's)
        self.v = nn.Linear(d_attention, 1, bias=False)  # v_a

    def project_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """``U_a h_j`` for every source position, computed once per sentence:
        ``(B, S, d_key) → (B, S, d_attention)``."""
        return self.w_key(keys)

    def forward(
        self, query: torch.Tensor, projected_keys: torch.Tensor, values: torch.Tensor, attn_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder step's context.

        Shapes: ``query (B, d_query)`` (``s_{i−1}``), ``projected_keys (B, S, d_attention)``
        (from :meth:`project_keys`), ``values (B, S, d_key)`` (the source states ``h_j``),
        ``attn_mask (B, S)`` bool, True where a position may be attended (each row needs one).

        Returns:
            ``(context c_i (B, d_key), weights α_i (B, S))``; the weights of masked positions
            are exactly 0 and each row sums to 1.
        """
        scores = self.v(torch.tanh(self.w_query(query)[:, None, :] + projected_keys)).squeeze(-1)  # (B, S)
        weights = torch.softmax(scores.masked_fill(~attn_mask, float("-inf")), dim=-1)
        return torch.bmm(weights[:, None, :], values).squeeze(1), weights


__all__ = ["elman_step", "gru_step", "AdditiveAttention"]
