"""The recurrent encoder-decoder that the Transformer replaced: the baseline of the lecture's
case for attention (its three limits of recurrence, measured in ``benchmarks/why_attention.py``).

- Encoder: embeddings, a bidirectional GRU (or LSTM) over the source (Bahdanau et al. 2015,
  §3.2): the state of position j is ``h_j = [→h_j; ←h_j]``, ``2 · d_model`` wide.
- Decoder, ``attention="none"``, the **bottleneck** (Cho et al. 2014, §2.2; Sutskever et al.
  2014): the source reaches the decoder only as ``c = [→h_S; ←h_1]``, the two directions'
  final states; ``s_0 = tanh(W_s c)`` and ``c`` enters every step and the output layer.
- Decoder, ``attention="additive"`` (Bahdanau et al. 2015, §3.1, Appendix A.2.2): at each step
  the previous state ``s_{i−1}`` attends over every ``h_j`` (:class:`~qkv.nn.recurrent.AdditiveAttention`)
  and the context ``c_i`` enters the recurrence and the output layer; ``s_0 = tanh(W_s ←h_1)``.
- Output: ``o_i = W_o [s_i; c_i; E y_{i−1}]`` (a linear "deep output", Bahdanau et al. A.2.2,
  without the maxout), logits ``E o_i`` with the target embeddings ``E`` tied (``tie_output``).

The model speaks the Transformer's interface (``encode``, ``decode`` with caches, ``forward``
→ :class:`~qkv.models.outputs.Seq2SeqOutput`), so qkv's batching, training loop, beam search,
``qkv translate``/``evaluate`` and the explainer (the alignment ``α`` as cross-attention) take it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..nn.masks import padding_mask
from ..nn.recurrent import AdditiveAttention
from .config import RNNConfig
from .outputs import Seq2SeqOutput

State = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # GRU: h; LSTM: (h, c), each (L, B, D)


class RecurrentState:
    """What incremental decoding carries between steps: the decoder's recurrent state
    (``value``), or what the decoder reads of the source (``source``: the projected keys
    ``U_a h_j`` with attention, the final states ``c`` in the bottleneck), computed at the first
    step and unchanged after it. :meth:`reorder` follows beam search's choice of rows, as
    :class:`~qkv.nn.attention.KVCache`."""

    def __init__(self) -> None:
        self.value: State | None = None
        self.source: torch.Tensor | None = None

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep the rows ``rows`` (long, ``(B',)``) of the batch, in that order."""
        if isinstance(self.value, tuple):
            self.value = (self.value[0].index_select(1, rows), self.value[1].index_select(1, rows))
        elif self.value is not None:
            self.value = self.value.index_select(1, rows)


def _recurrent(cfg: RNNConfig, d_in: int, n_layers: int, bidirectional: bool) -> nn.GRU | nn.LSTM:
    cls = nn.GRU if cfg.cell == "gru" else nn.LSTM
    return cls(
        d_in,
        cfg.d_model,
        n_layers,
        batch_first=True,
        bidirectional=bidirectional,
        dropout=cfg.dropout if n_layers > 1 else 0.0,
    )


def _embedding(vocab: int, d_model: int, pad_id: int) -> nn.Embedding:
    emb = nn.Embedding(vocab, d_model, padding_idx=pad_id)
    # N(0, 1/d_model): tied to the output layer, unit-variance rows would start it saturated
    nn.init.normal_(emb.weight, std=d_model**-0.5)
    with torch.no_grad():
        emb.weight[pad_id].zero_()
    return emb


def final_states(memory: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
    """``c = [→h_S; ←h_1]``: the forward direction's state at each source's last real
    position and the backward direction's at its first, what a bidirectional encoder has read
    when it is done (Cho et al. 2014's summary vector). ``memory (B, S, 2D)``, ``src_mask
    (B, 1, 1, S)`` bool → ``(B, 2D)``. No other position of ``memory`` is read."""
    d = memory.size(-1) // 2
    last = (src_mask[:, 0, 0, :].sum(-1) - 1).clamp(min=0)  # (B,)
    forward_last = memory[torch.arange(memory.size(0), device=memory.device), last, :d]
    return torch.cat([forward_last, memory[:, 0, d:]], dim=-1)


class RNNSeq2Seq(nn.Module):
    """Recurrent encoder-decoder, with additive attention or the bottleneck (see the module).

    Args:
        config: an :class:`~qkv.models.config.RNNConfig` with its vocabulary sizes set.

    Shape (forward):
        src: ``(B, S)`` long source ids (right-padded with ``pad_id``; each row ends in eos).
        tgt: ``(B, T)`` long decoder input ids (``bos`` + target, right-padded).
        returns :class:`Seq2SeqOutput` with ``logits (B, T, V_tgt)``; with
        ``need_weights=True`` and additive attention, ``cross_attentions`` holds one
        ``(B, 1, T, S)`` tensor: the alignment ``α`` of every target step.

    Raises:
        ConfigError: vocabulary sizes unset.
    """

    def __init__(self, config: RNNConfig) -> None:
        super().__init__()
        config.require("src_vocab_size", "tgt_vocab_size")
        self.config = cfg = config
        assert cfg.src_vocab_size is not None and cfg.tgt_vocab_size is not None  # require() checked
        d = cfg.d_model
        self.src_embed = _embedding(cfg.src_vocab_size, d, cfg.pad_id)
        self.tgt_embed = (
            self.src_embed if cfg.share_embeddings else _embedding(cfg.tgt_vocab_size, d, cfg.pad_id)
        )
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = _recurrent(cfg, d, cfg.n_encoder_layers, bidirectional=True)
        self.attention = AdditiveAttention(d, 2 * d, d) if cfg.attention == "additive" else None
        # the bottleneck's source summary is both directions' final states; attention's
        # initial state is the backward direction's (Bahdanau et al. A.2.2)
        self.init_state = nn.Linear(2 * d if self.attention is None else d, d)
        self.decoder = _recurrent(cfg, d + 2 * d, cfg.n_decoder_layers, bidirectional=False)
        self.output = nn.Linear(d + 2 * d + d, d)  # W_o [s_i; c_i; E y_{i-1}]
        self.generator = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output or cfg.share_embeddings:
            self.generator.weight = self.tgt_embed.weight

    # ---------- encoder

    def encode(
        self, src: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, tuple]:
        """``src (B, S)`` → ``(memory (B, S, 2·d_model), src_mask (B, 1, 1, S), ())``: the
        bidirectional states ``h_j`` (zeros at padding) and which positions are real."""
        src_mask = padding_mask(src, self.config.pad_id)
        lengths = src_mask[:, 0, 0, :].sum(-1).clamp(min=1).cpu()
        x = self.dropout(self.src_embed(src))
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.encoder(packed)
        memory, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        return memory, src_mask, ()

    # ---------- decoder

    def initial_state(self, summary: torch.Tensor) -> State:
        """``s_0`` of every decoder layer, ``(n_decoder_layers, B, d_model)`` (LSTM: with zero
        cells), from the encoder's final states ``summary (B, 2·d_model)`` (:func:`final_states`)."""
        if self.attention is not None:
            summary = summary[:, self.config.d_model :]  # ←h_1
        s0 = torch.tanh(self.init_state(summary))[None].repeat(self.config.n_decoder_layers, 1, 1)
        return (s0, torch.zeros_like(s0)) if self.config.cell == "lstm" else s0

    def _logits(self, states: torch.Tensor, contexts: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        out = self.output(torch.cat([states, contexts, embedded], dim=-1))
        return self.generator(self.dropout(out))

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        caches: list[tuple[RecurrentState, RecurrentState]] | None = None,
        start_pos: int = 0,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, tuple, tuple]:
        """Run the decoder over ``tgt`` and the output layer.

        Shape: ``tgt (B, T)``, ``memory (B, S, 2·d_model)``, ``src_mask (B, 1, 1, S)`` →
        ``(logits (B, T, V), (), cross weights)``: one ``(B, 1, T, S)`` tensor of ``α`` with
        ``need_weights`` and attention, else ``()``. With ``caches`` (from :meth:`new_caches`)
        ``tgt`` holds only the new tokens, and the state carries over between calls
        (``start_pos`` is accepted for the Transformer's signature; a recurrence counts by
        itself). Raises ``ValueError`` past ``max_len`` positions.
        """
        if start_pos + tgt.size(1) > self.config.max_len:
            raise ValueError(
                f"sequence of {start_pos + tgt.size(1)} tokens exceeds the model's "
                f"max_len ({self.config.max_len})"
            )
        cache, source = caches[0] if caches is not None else (RecurrentState(), RecurrentState())
        if source.source is None:  # the first step: what the decoder reads of the source, once
            summary = final_states(memory, src_mask)
            source.source = summary if self.attention is None else self.attention.project_keys(memory)
            cache.value = self.initial_state(summary)
        state = cache.value
        assert state is not None  # set at the first step, with source
        embedded = self.dropout(self.tgt_embed(tgt))  # (B, T, D)
        if self.attention is None:
            # the bottleneck: every step sees the same summary, so the recurrence runs fused
            summary = source.source[:, None, :].expand(-1, tgt.size(1), -1)
            states, cache.value = self.decoder(torch.cat([embedded, summary], dim=-1), state)
            return self._logits(states, summary, embedded), (), ()
        attn_mask = src_mask[:, 0, 0, :]  # (B, S): additive attention's key mask
        outs, contexts, alphas = [], [], []
        for t in range(tgt.size(1)):  # the context of step t needs the state of step t-1
            query = (state[0] if isinstance(state, tuple) else state)[-1]  # top layer's s_{i-1}
            context, alpha = self.attention(query, source.source, memory, attn_mask)
            out, state = self.decoder(torch.cat([embedded[:, t], context], dim=-1)[:, None], state)
            outs.append(out[:, 0])
            contexts.append(context)
            alphas.append(alpha)
        cache.value = state
        logits = self._logits(torch.stack(outs, 1), torch.stack(contexts, 1), embedded)
        return logits, (), ((torch.stack(alphas, 1)[:, None],) if need_weights else ())

    def new_caches(self) -> list[tuple[RecurrentState, RecurrentState]]:
        """An empty (state, source) pair for incremental decoding (beam search reorders
        the first, as it does a Transformer's self-attention cache)."""
        return [(RecurrentState(), RecurrentState())]

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, need_weights: bool = False) -> Seq2SeqOutput:
        memory, src_mask, _ = self.encode(src)
        logits, _, cross = self.decode(tgt, memory, src_mask, need_weights=need_weights)
        return Seq2SeqOutput(logits, cross_attentions=cross)

    def num_parameters(self) -> int:
        """Number of distinct trainable parameters (tied matrices counted once)."""
        return sum(p.numel() for p in self.parameters())
