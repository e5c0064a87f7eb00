"""Speed of qkv's encoder-decoder Transformer against a torch.nn.Transformer reference (CPU).

What is compared
----------------
* ours: ``qkv.models.Transformer`` with d_model 512, 8 heads, 3 + 3 layers, d_ff 512,
  dropout 0.1 (also on attention weights and on the FFN activation, as ``nn.Transformer``'s
  single ``dropout`` does), post-LN, separate source/target embeddings and an untied output
  projection (``share_embeddings=False, tie_output=False``).
* reference: the PyTorch tutorial "Language translation with nn.Transformer and torchtext":
  ``nn.Transformer(batch_first=True)`` with the same sizes + token embeddings scaled by
  sqrt(d_model) + the tutorial's sinusoidal positional encoding + a ``Linear`` generator
  (with bias, as in the tutorial), Xavier-uniform init of every matrix.
  ``nn.Transformer`` also has a final LayerNorm after each stack, so the reference has
  2·2·d_model + V_tgt (generator bias) more parameters than ours; both counts are printed.
  Masks are converted only inside the reference wrapper: qkv builds bool "True = may attend"
  masks from pad ids itself; the reference gets ``src_key_padding_mask`` /
  ``memory_key_padding_mask`` (True = pad) and the causal ``tgt_mask`` of
  ``nn.Transformer.generate_square_subsequent_mask``. Like qkv, the reference gets no target
  key-padding mask (the causal mask suffices for right-padded targets whose pad positions the
  loss ignores); ``--ref-tgt-padding-mask`` adds it as the tutorial does.

Data: the Multi30k de→en training split (``qkv.data.load_multi30k``; files looked up in
``$QKV_DATA_DIR/multi30k``). One BPE per language (``SubwordTokenizer.train``, tutorial-like
separate vocabularies, ``--vocab-size`` each) is trained on the training split; then
``--batches`` batches of ``--batch-size`` randomly drawn sentence pairs (fixed seed, no length
bucketing, as the tutorial's DataLoader) are built once and used by both models, so sequence
lengths and padding are the real ones. Both models have the same vocabulary sizes.

What is measured (same process, ours and the reference alternate within every repeat — the
order flips each repeat — and the figures are medians over ``--repeats``):
  (a) training: forward, label-smoothed (0.1) cross-entropy ignoring pad
      (``qkv.train.losses.label_smoothed_nll``, the same function for both), backward and a
      ``torch.optim.Adam`` step (tutorial settings: lr 1e-4, betas (0.9, 0.98), eps 1e-9), over
      all batches; throughput = non-pad target tokens / second.
  (b) greedy decoding, eval mode, no grad, the same batches' sources: ours with
      ``qkv.inference.search.greedy_decode`` (encoder once, KV cache, one new token per step);
      the reference with the tutorial's greedy decode, batched (encoder once, the decoder re-run
      over the whole prefix every step, generator on the last position). Throughput =
      sentences / second. Equal work: both run exactly ``--decode-steps`` steps. Random
      weights would emit ``eos`` at random and let a decoder stop early, so before timing the
      ``eos`` row of both generators is set to zero (its logit is 0 while the largest of the
      other ~V random logits is clearly positive), making ``eos`` unreachable; the number of
      steps actually taken is checked for both.
Ratios are ours / reference (> 1: ours faster). Warm-up runs (one training step and one decode
per model) are not timed.

Sanity checks (before timing): the reference's per-token NLL at init must be ≈ ln(V_tgt)
(asserted; ours is printed too), and a reference model loaded with our initial weights must give
the same logits as ours (asserted) and mostly the same greedy outputs (printed), i.e. both
compute the same function, so the same work.

Run (from the repository root; the full run takes minutes and should have the CPU to itself):
    .venv/bin/python benchmarks/bench_translation.py                     # full settings
    .venv/bin/python benchmarks/bench_translation.py --threads 4 --append-results
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_translation.py --quick --threads 1
``--quick`` is a fast sanity run (small batches, few repeats): its figures are not results.
``--append-results`` appends the printed section to ``benchmarks/HISTORY.md`` (``--results``).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import random
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from common import alternate, machine, row  # noqa: E402  (benchmarks/common.py)
from torch import nn

from qkv.data.tokenizers import SubwordTokenizer
from qkv.data.translation import load_multi30k
from qkv.inference.search import greedy_decode
from qkv.models import Transformer
from qkv.models.config import TransformerConfig
from qkv.train.losses import label_smoothed_nll

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "HISTORY.md"  # the dated record; RESULTS.md holds the current figures
RESULTS_HEADER = """# Benchmark history

Each section is one run of a script in `benchmarks/`, with its command, machine and date.
Ours and a reference do the same work in the same process, alternately; figures are medians over
repeats and ratios are ours / reference (> 1 means ours is faster).

`bench_translation.py`: qkv's encoder-decoder `Transformer` vs the PyTorch tutorial's
`nn.Transformer` translation model (d_model 512, 8 heads, 3 + 3 layers, d_ff 512, dropout 0.1,
separate de/en BPE vocabularies) on batches of real Multi30k de→en training pairs:
(a) training steps (forward, label-smoothed CE, backward, Adam), target tokens/s;
(b) greedy decoding for a fixed number of steps (ours: KV cache; reference: the tutorial's
re-decode of the whole prefix each step), sentences/s. See the script's docstring for details.
"""

# The tutorial's model size.
D_MODEL, N_HEADS, N_LAYERS, D_FF, DROPOUT = 512, 8, 3, 512, 0.1
LABEL_SMOOTHING = 0.1


# --------------------------------------------------------------------------------------------
# The reference: "Language translation with nn.Transformer and torchtext" (PyTorch tutorials),
# batch-first.
# --------------------------------------------------------------------------------------------
class PositionalEncoding(nn.Module):
    """The tutorial's sinusoidal encoding, added to the embeddings, then dropout. ``(B, T, D)``."""

    def __init__(self, emb_size: int, dropout: float, maxlen: int = 5000) -> None:
        super().__init__()
        den = torch.exp(-torch.arange(0, emb_size, 2) * math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", pos_embedding.unsqueeze(0))  # (1, L, D)

    def forward(self, token_embedding: torch.Tensor) -> torch.Tensor:
        return self.dropout(token_embedding + self.pos_embedding[:, : token_embedding.size(1)])


class TokenEmbedding(nn.Module):
    """The tutorial's embedding: ``nn.Embedding(tokens) * sqrt(emb_size)``."""

    def __init__(self, vocab_size: int, emb_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class ReferenceSeq2Seq(nn.Module):
    """The tutorial's ``Seq2SeqTransformer`` (batch-first). Takes right-padded id tensors and
    converts pad ids into ``nn.Transformer``'s masks itself (True = pad / -inf = masked)."""

    def __init__(
        self, src_vocab_size: int, tgt_vocab_size: int, pad_id: int, tgt_padding_mask: bool = False
    ) -> None:
        super().__init__()
        self.transformer = nn.Transformer(
            d_model=D_MODEL,
            nhead=N_HEADS,
            num_encoder_layers=N_LAYERS,
            num_decoder_layers=N_LAYERS,
            dim_feedforward=D_FF,
            dropout=DROPOUT,
            batch_first=True,
        )
        self.generator = nn.Linear(D_MODEL, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, D_MODEL)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, D_MODEL)
        self.positional_encoding = PositionalEncoding(D_MODEL, dropout=DROPOUT)
        self.pad_id, self.tgt_padding_mask = pad_id, tgt_padding_mask
        for p in self.parameters():  # the tutorial's initialisation
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """``src (B, S)``, ``tgt (B, T)`` → logits ``(B, T, V_tgt)``."""
        src_padding_mask = src == self.pad_id  # (B, S), True = pad
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device)
        tgt_padding_mask = (tgt == self.pad_id) if self.tgt_padding_mask else None
        outs = self.transformer(
            self.positional_encoding(self.src_tok_emb(src)),
            self.positional_encoding(self.tgt_tok_emb(tgt)),
            tgt_mask=tgt_mask,
            src_key_padding_mask=src_padding_mask,
            tgt_key_padding_mask=tgt_padding_mask,
            memory_key_padding_mask=src_padding_mask,
        )
        return self.generator(outs)

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        src_padding_mask = src == self.pad_id
        memory = self.transformer.encoder(
            self.positional_encoding(self.src_tok_emb(src)), src_key_padding_mask=src_padding_mask
        )
        return memory, src_padding_mask

    def decode(
        self, tgt: torch.Tensor, memory: torch.Tensor, tgt_mask: torch.Tensor, src_padding_mask: torch.Tensor
    ) -> torch.Tensor:
        return self.transformer.decoder(
            self.positional_encoding(self.tgt_tok_emb(tgt)),
            memory,
            tgt_mask,
            memory_key_padding_mask=src_padding_mask,
        )


@torch.no_grad()
def reference_greedy_decode(
    model: ReferenceSeq2Seq, src: torch.Tensor, steps: int, bos_id: int, eos_id: int
) -> torch.Tensor:
    """The tutorial's ``greedy_decode``, batched: encode once, then at every step re-run the
    decoder over the whole prefix and pick the argmax of the last position. Stops when every
    sentence has produced ``eos`` (as ``greedy_decode`` does) or after ``steps`` steps.
    Returns the ids ``(B, 1 + n_steps)`` including the leading ``bos``."""
    memory, src_padding_mask = model.encode(src)
    ys = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    for _ in range(steps):
        tgt_mask = nn.Transformer.generate_square_subsequent_mask(ys.size(1), device=src.device).bool()
        out = model.decode(ys, memory, tgt_mask, src_padding_mask)
        next_word = model.generator(out[:, -1]).argmax(-1)  # (B,)
        next_word = next_word.masked_fill(done, model.pad_id)
        done |= next_word == eos_id
        ys = torch.cat([ys, next_word[:, None]], dim=1)
        if bool(done.all()):
            break
    return ys


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------
def make_batches(n_batches: int, batch_size: int, vocab_size: int, seed: int):
    """Train a BPE per language on Multi30k train and draw ``n_batches`` random batches.

    Returns ``(batches, src_tok, tgt_tok)``; each batch is ``(src, tgt_in, tgt_out, n_tgt)``:
    ``src`` = ids + eos, ``tgt_in`` = bos + ids, ``tgt_out`` = ids + eos, right-padded.
    """
    src_texts, tgt_texts = load_multi30k("train", "de", "en")
    pairs = [(s, t) for s, t in zip(src_texts, tgt_texts, strict=True) if s.strip() and t.strip()]
    src_tok = SubwordTokenizer.train((s for s, _ in pairs), vocab_size=vocab_size)
    tgt_tok = SubwordTokenizer.train((t for _, t in pairs), vocab_size=vocab_size)
    rng = random.Random(seed)
    chosen = rng.sample(range(len(pairs)), n_batches * batch_size)
    pad, bos, eos = tgt_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id
    assert (src_tok.pad_id, src_tok.bos_id, src_tok.eos_id) == (pad, bos, eos)

    def padded(seqs):
        out = torch.full((len(seqs), max(map(len, seqs))), pad, dtype=torch.long)
        for i, s in enumerate(seqs):
            out[i, : len(s)] = torch.tensor(s)
        return out

    batches = []
    for b in range(n_batches):
        idx = chosen[b * batch_size : (b + 1) * batch_size]
        src_ids = src_tok.encode_batch([pairs[i][0] for i in idx])
        tgt_ids = tgt_tok.encode_batch([pairs[i][1] for i in idx])
        src = padded([s + [eos] for s in src_ids])
        tgt_in = padded([[bos] + t for t in tgt_ids])
        tgt_out = padded([t + [eos] for t in tgt_ids])
        batches.append((src, tgt_in, tgt_out, int((tgt_out != pad).sum())))
    return batches, src_tok, tgt_tok


# --------------------------------------------------------------------------------------------
# Models, checks, timed work
# --------------------------------------------------------------------------------------------
def build_ours(src_vocab: int, tgt_vocab: int, pad: int, bos: int, eos: int) -> Transformer:
    cfg = TransformerConfig(
        src_vocab_size=src_vocab,
        tgt_vocab_size=tgt_vocab,
        d_model=D_MODEL,
        n_heads=N_HEADS,
        d_ff=D_FF,
        n_encoder_layers=N_LAYERS,
        n_decoder_layers=N_LAYERS,
        dropout=DROPOUT,
        attention_dropout=DROPOUT,
        activation_dropout=DROPOUT,
        share_embeddings=False,
        tie_output=False,
        pad_id=pad,
        bos_id=bos,
        eos_id=eos,
    )
    return Transformer(cfg)


def ours_logits(model: Transformer, src, tgt_in):
    return model(src, tgt_in).logits


def ref_logits(model: ReferenceSeq2Seq, src, tgt_in):
    return model(src, tgt_in)


def copy_ours_into_reference(ours: Transformer, ref: ReferenceSeq2Seq) -> None:
    """Load our weights into the reference (our packed q/k/v rows are ``in_proj``'s layout;
    the reference's extra final LayerNorms stay identity-like, its generator bias is zeroed)."""

    def mha(dst: nn.MultiheadAttention, src) -> None:
        if src.cross:  # queries from w_q, keys and values from w_kv
            dst.in_proj_weight.copy_(torch.cat([src.w_q.weight, src.w_kv.weight]))
            dst.in_proj_bias.copy_(torch.cat([src.w_q.bias, src.w_kv.bias]))
        else:
            dst.in_proj_weight.copy_(src.w_qkv.weight)
            dst.in_proj_bias.copy_(src.w_qkv.bias)
        dst.out_proj.weight.copy_(src.w_o.weight)
        dst.out_proj.bias.copy_(src.w_o.bias)

    def linear(dst: nn.Linear, src: nn.Linear) -> None:
        dst.weight.copy_(src.weight)
        dst.bias.copy_(src.bias)

    with torch.no_grad():
        ref.src_tok_emb.embedding.weight.copy_(ours.src_embed.weight)
        ref.tgt_tok_emb.embedding.weight.copy_(ours.tgt_embed.weight)
        for d, s in zip(ref.transformer.encoder.layers, ours.encoder.layers, strict=True):
            mha(d.self_attn, s.self_attn)
            linear(d.linear1, s.ffn.w_1), linear(d.linear2, s.ffn.w_2)
            linear(d.norm1, s.self_attn_block.norm), linear(d.norm2, s.ffn_block.norm)
        for d, s in zip(ref.transformer.decoder.layers, ours.decoder.layers, strict=True):
            mha(d.self_attn, s.self_attn)
            mha(d.multihead_attn, s.cross_attn)
            linear(d.linear1, s.ffn.w_1), linear(d.linear2, s.ffn.w_2)
            linear(d.norm1, s.self_attn_block.norm), linear(d.norm2, s.cross_attn_block.norm)
            linear(d.norm3, s.ffn_block.norm)
        ref.generator.weight.copy_(ours.generator.weight)
        ref.generator.bias.zero_()


def sanity_checks(
    ours: Transformer, ref: ReferenceSeq2Seq, batch, tgt_vocab: int, pad: int, bos: int, eos: int
) -> dict:
    """Loss at init ≈ ln(V) and 'same weights → same function' (see the module docstring)."""
    src, tgt_in, tgt_out, n = batch
    ours.eval(), ref.eval()
    with torch.no_grad():
        nll_ours = label_smoothed_nll(ours_logits(ours, src, tgt_in), tgt_out, LABEL_SMOOTHING, pad)[1] / n
        nll_ref = label_smoothed_nll(ref_logits(ref, src, tgt_in), tgt_out, LABEL_SMOOTHING, pad)[1] / n
    ln_v = math.log(tgt_vocab)
    assert abs(float(nll_ref) - ln_v) < 0.5, f"reference NLL at init {float(nll_ref):.3f} vs ln(V) {ln_v:.3f}"

    twin = ReferenceSeq2Seq(ours.config.src_vocab_size, tgt_vocab, pad)
    copy_ours_into_reference(ours, twin)
    twin.eval()
    sub = src[:16]
    with torch.no_grad():
        diff = (ours_logits(ours, sub, tgt_in[:16]) - ref_logits(twin, sub, tgt_in[:16])).abs().max().item()
    assert diff < 1e-3, f"same weights but logits differ by {diff:.2e}: not the same function"
    steps = 8
    ours_ids = greedy_decode(ours, sub, max_new_tokens=steps)
    twin_ids = [
        _strip(row[1:], eos, pad) for row in reference_greedy_decode(twin, sub, steps, bos, eos).tolist()
    ]
    same = sum(a == b for a, b in zip(ours_ids, twin_ids, strict=True)) / len(ours_ids)
    return {
        "nll_ours": float(nll_ours),
        "nll_ref": float(nll_ref),
        "ln_v": ln_v,
        "logit_diff": diff,
        "greedy_same": same,
    }


def _strip(ids: list[int], eos: int, pad: int) -> list[int]:
    if eos in ids:
        ids = ids[: ids.index(eos)]
    return [i for i in ids if i != pad]


def train_pass(model, logits_fn, opt, batches, pad: int) -> tuple[int, float]:
    """One training step per batch; returns (target tokens, seconds)."""
    model.train()
    tokens, start = 0, time.perf_counter()
    for src, tgt_in, tgt_out, n in batches:
        loss, _ = label_smoothed_nll(logits_fn(model, src, tgt_in), tgt_out, LABEL_SMOOTHING, pad)
        (loss / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += n
    return tokens, time.perf_counter() - start


def make_eos_unreachable(generator: nn.Linear, eos: int) -> None:
    with torch.no_grad():
        generator.weight[eos].zero_()
        if generator.bias is not None:
            generator.bias[eos] = 0.0


def decode_pass(decode_fn, batches) -> tuple[int, float]:
    """Greedy-decode every batch's sources; returns (sentences, seconds)."""
    sentences, start = 0, time.perf_counter()
    for src, *_ in batches:
        decode_fn(src)
        sentences += src.size(0)
    return sentences, time.perf_counter() - start


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def report(
    args,
    pad: int,
    n_params: tuple[int, int],
    vocab: tuple[int, int],
    batches,
    checks: dict,
    train: tuple[list, list],
    decode: tuple[list, list],
) -> str:
    env = " ".join(f"{k}={os.environ[k]}" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ)
    cmd = " ".join(filter(None, [env, "python", shlex.join(sys.argv)]))
    mean_src = statistics.mean(int((b[0] != pad).sum()) / b[0].size(0) for b in batches)
    mean_tgt = statistics.mean(b[3] / b[0].size(0) for b in batches)
    lines = [
        f"## bench_translation{' (--quick: sanity run, not a result)' if args.quick else ''} — "
        f"{datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        "",
        f"- command: `{cmd}`",
        f"- machine: {machine()}",
        f"- model: d_model {D_MODEL}, {N_HEADS} heads, {N_LAYERS}+{N_LAYERS} layers, d_ff {D_FF}, "
        f"dropout {DROPOUT}; vocab de {vocab[0]} / en {vocab[1]} (BPE on Multi30k train); parameters: "
        f"ours {n_params[0]:,}, reference {n_params[1]:,} (+{n_params[1] - n_params[0]:,}: final "
        f"LayerNorms + generator bias)",
        f"- data: {len(batches)} batches × {args.batch_size} Multi30k de→en train pairs, mean "
        f"{mean_src:.1f} source / {mean_tgt:.1f} target tokens per sentence (incl. eos); "
        f"{args.repeats} repeats: medians (min–max); ratio = ratio of the medians (min–max of the "
        f"per-repeat ratios); greedy decoding {args.decode_steps} steps",
        f"- checks: NLL/token at init ours {checks['nll_ours']:.3f}, reference {checks['nll_ref']:.3f} "
        f"(ln V = {checks['ln_v']:.3f}); same weights → max logit diff {checks['logit_diff']:.1e}, "
        f"greedy outputs identical for {checks['greedy_same']:.0%} of sentences",
        "",
        "| measure | ours (qkv) | reference (nn.Transformer) | ours / reference |",
        "|---|---|---|---|",
        row("training, target tokens/s", *train),
        row("greedy decoding, sentences/s", *decode),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measure (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="tiny settings for a sanity run: batch 16, 2 batches, 2 repeats, 10 decode steps",
    )
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=4, help="distinct batches, each used once per repeat")
    p.add_argument("--decode-steps", type=int, default=20, help="greedy decoding steps (forced, both models)")
    p.add_argument("--vocab-size", type=int, default=8000, help="BPE vocabulary size per language")
    p.add_argument(
        "--ref-tgt-padding-mask",
        action="store_true",
        help="also give the reference a target key-padding mask, as the tutorial does",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--append-results", action="store_true", help="append the section to --results")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size, args.batches, args.repeats, args.decode_steps = 16, 2, 2, 10
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))  # the BPE trainer's pool
    os.environ.setdefault("QKV_DATA_DIR", "/work/shared/data")
    # nn.TransformerEncoder's inference fast path (reference decoding) warns about nested tensors.
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
    torch.manual_seed(args.seed)

    t0 = time.perf_counter()
    batches, src_tok, tgt_tok = make_batches(args.batches, args.batch_size, args.vocab_size, args.seed)
    pad, bos, eos = tgt_tok.pad_id, tgt_tok.bos_id, tgt_tok.eos_id
    vocab = (src_tok.vocab_size, tgt_tok.vocab_size)
    print(
        f"data ready in {time.perf_counter() - t0:.1f}s: vocab de {vocab[0]}, en {vocab[1]}", file=sys.stderr
    )

    torch.manual_seed(args.seed)
    ours = build_ours(*vocab, pad, bos, eos)
    torch.manual_seed(args.seed)
    ref = ReferenceSeq2Seq(*vocab, pad, tgt_padding_mask=args.ref_tgt_padding_mask)
    n_params = (ours.num_parameters(), sum(p.numel() for p in ref.parameters()))
    checks = sanity_checks(ours, ref, batches[0], vocab[1], pad, bos, eos)
    print(f"checks: {checks}", file=sys.stderr)

    # (a) training
    adam = dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    opt_ours, opt_ref = (
        torch.optim.Adam(ours.parameters(), **adam),
        torch.optim.Adam(ref.parameters(), **adam),
    )
    train_pass(ours, ours_logits, opt_ours, batches[:1], pad)  # warm-up, not timed
    train_pass(ref, ref_logits, opt_ref, batches[:1], pad)
    train = alternate(
        args.repeats,
        lambda: train_pass(ours, ours_logits, opt_ours, batches, pad),
        lambda: train_pass(ref, ref_logits, opt_ref, batches, pad),
    )
    print(f"training done ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)

    # (b) greedy decoding, exactly decode_steps steps for both (eos made unreachable, checked)
    ours.eval(), ref.eval()
    make_eos_unreachable(ours.generator, eos)
    make_eos_unreachable(ref.generator, eos)
    ours_steps = []
    ours.generator.register_forward_hook(lambda *_: ours_steps.append(1))

    def decode_ours(src):
        ours_steps.clear()
        greedy_decode(ours, src, max_new_tokens=args.decode_steps)
        assert len(ours_steps) == args.decode_steps, f"ours stopped after {len(ours_steps)} steps"

    def decode_ref(src):
        ys = reference_greedy_decode(ref, src, args.decode_steps, bos, eos)
        assert ys.size(1) == 1 + args.decode_steps, f"reference stopped after {ys.size(1) - 1} steps"

    decode_pass(decode_ours, batches[:1])  # warm-up, not timed
    decode_pass(decode_ref, batches[:1])
    decode = alternate(
        args.repeats, lambda: decode_pass(decode_ours, batches), lambda: decode_pass(decode_ref, batches)
    )
    print(f"decoding done ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)

    section = report(args, pad, n_params, vocab, batches, checks, train, decode)
    print(section)
    if args.append_results:
        if not args.results.exists():
            args.results.write_text(RESULTS_HEADER, encoding="utf-8")
        with args.results.open("a", encoding="utf-8") as f:
            f.write("\n" + section)
        print(f"appended to {args.results}", file=sys.stderr)


if __name__ == "__main__":
    main()
