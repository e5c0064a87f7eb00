"""One explainer per text family (:class:`~qkv.explain.explainer.Explainer` subclasses): the
translator (and the RNN baseline), the LMs, the protein encoders and the sentence encoders. Each
says how its model reads an input, decodes it and which attention kinds it has; what an explainer
answers is the base class's (:mod:`qkv.explain.explainer`).
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from .. import runs
from ..data.parallel import PAIRS_FILE
from ..errors import QkvError
from ..files import read_json
from ..inference.lm import TextGenerator
from ..inference.search import beam_search, greedy_decode
from ..inference.translator import SEQ2SEQ_RECIPES, run_decoding_of
from .explainer import (
    DEFAULT_MAX_CHARS,
    Explainer,
    _gathered,
    _Pass,
    split_pair,
)
from .labels import piece_labels, vocabulary_label, wordpiece_as_marked


class TranslationExplainer(Explainer[str]):
    """Encoder-decoder runs (``qkv train translation``): the source is translated with beam
    search, then the model is rerun teacher-forced on its own translation to read the encoder,
    decoder and cross-attention of the output it produced."""

    family, subword = "translation", True
    kinds: tuple[str, ...] = ("encoder", "decoder", "cross")

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        model, self.tokenizer = runs.load_run(run_dir, device=device, family=SEQ2SEQ_RECIPES)
        super().__init__(model, run_dir, max_chars)
        meta = runs.run_settings(run_dir)
        self.beam_size, self.alpha = run_decoding_of(meta)  # as qkv translate decodes the run
        src, tgt = meta.get("src_lang", "de"), meta.get("tgt_lang", "en")
        self.input_label = f"sentence to translate ({src} → {tgt})"
        self.example = {
            "de": "Ein Mann fährt mit dem Fahrrad durch den Park.",
            "fr": "Un homme fait du vélo dans le parc.",
            "cs": "Muž jede na kole parkem.",
        }.get(src, "")
        if meta.get("data") and (Path(run_dir) / PAIRS_FILE).is_file():  # the user's own pairs
            held = read_json(Path(run_dir) / PAIRS_FILE)
            self.input_label = f"source to translate ({Path(meta['data']).name})"
            self.example = (held["val"] or held["test"] or [[""]])[0][0]
            self.subword = held.get("tokenizer") != "amino-acid"  # residues are not word pieces

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.encoder.layers if kind == "encoder" else self.model.decoder.layers

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text)) + 1  # + <eos>

    def _prepare(self, text, options):
        cfg, tok = self.config, self.tokenizer
        ids = tok.encode(text)
        self._check_tokens(len(ids) + 1, cfg.max_len)
        device = next(self.model.parameters()).device
        src = torch.tensor([ids + [cfg.eos_id]], device=device)
        beam = options.beam_size or self.beam_size
        alpha = self.alpha if options.alpha is None else options.alpha
        hyp = (greedy_decode(self.model, src) if beam <= 1 else beam_search(self.model, src, beam, alpha))[0]
        tgt_in = torch.tensor([[cfg.bos_id] + hyp[: cfg.max_len - 1]], device=device)

        def forward(need_weights):
            out = self.model(src, tgt_in, need_weights=need_weights)
            return {
                "encoder": out.encoder_attentions,
                "decoder": out.decoder_self_attentions,
                "cross": out.cross_attentions,
            }

        src_pieces = [tok.id_to_token(i) for i in ids] + ["<eos>"]
        tgt_in_pieces = ["<bos>"] + [tok.id_to_token(i) for i in tgt_in[0, 1:].tolist()]
        produced = tgt_in_pieces[1:] + ["<eos>"]
        tgt_out = torch.cat([tgt_in[0, 1:], tgt_in.new_tensor([cfg.eos_id])])  # (T,): what each row produced

        def score() -> torch.Tensor:
            return _gathered(self.model(src, tgt_in).logits[0], tgt_out)

        return _Pass(
            forward,
            {
                "encoder": (src_pieces, src_pieces),
                "decoder": (tgt_in_pieces, tgt_in_pieces),
                "cross": (produced, src_pieces),
            },
            {
                "text": tok.decode(hyp),
                "next_tokens": [],
                "classes": [],
                "residues": None,
                "decoding": "greedy decoding" if beam <= 1 else f"beam search, beam size {beam}",
                # named on the page as `qkv translate` warns of them (the RNN's tokenizer has none)
                "unknown_characters": getattr(tok, "unknown_characters", lambda _: [])(text),
            },
            score=(piece_labels(produced, self.subword), score),
        )


class RNNTranslationExplainer(TranslationExplainer):
    """Recurrent baselines (``qkv train translation-rnn``) with additive attention: the alignment
    ``α`` of Bahdanau et al. 2015 (§3.1) is shown as the cross-attention of one layer and one
    head. It is not Eq. 1 (a small network scores each pair, no scaled dot product), so there
    is no step-through. A bottleneck model (``attention="none"``) has no attention to show."""

    kinds = ("cross",)
    step_through = False

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        super().__init__(run_dir, device, max_chars)
        if self.model.attention is None:
            raise QkvError(
                f"{run_dir} is a bottleneck RNN (model.attention none): its decoder reads only the "
                "encoder's final states, so there is no attention to explain"
            )
        self._layers = nn.ModuleList([_AlignmentLayer(self.model.attention)])

    def layers(self, kind: str) -> nn.ModuleList:
        return self._layers

    def steps(self, text, kind, layer, head, options=None) -> dict:
        raise QkvError(
            "additive attention (Bahdanau et al. 2015) scores with a small network, not Eq. 1's "
            "scaled dot products: there are no steps to show"
        )

    def intervene(self, text, intervention, options=None) -> dict:
        raise QkvError(
            "a recurrent model has no attention heads, FFN neurons or residual stream between "
            "layers: there is nothing to ablate or patch"
        )


class _AlignmentLayer(nn.Module):
    """Holds an RNN's attention where the explainer looks for a layer's ``cross_attn``."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.cross_attn = attention


class LMExplainer(Explainer[str]):
    """Decoder-only language models (``qkv train lm``): attention over the prompt, a sampled
    continuation and the next-token probabilities after the prompt."""

    family, kinds, input_label = "lm", ("decoder",), "prompt"

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        model, tokenizer = runs.load_run(run_dir, device=device, family="lm")
        self.generator = TextGenerator(model, tokenizer)
        super().__init__(self.generator.model, run_dir, max_chars)
        self.tokenizer, self.subword = tokenizer, tokenizer.kind == "bpe"
        self.example = "ROMEO:\nBut soft, what light" if tokenizer.kind == "char" else "The meaning of"

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def count_tokens(self, text: str) -> int:
        return len(self.generator.encode_prompt(text))

    def _prepare(self, text, options):
        gen, tok = self.generator, self.tokenizer
        ids = gen.encode_prompt(text)
        self._check_tokens(len(ids), self.config.max_len)
        tokens = torch.tensor([ids], device=next(self.model.parameters()).device)

        def forward(need_weights):
            return {"decoder": self.model(tokens, need_weights=need_weights).attentions}

        sample = options.temperature > 0
        continuation = gen.generate(
            [text],
            options.max_new_tokens,
            do_sample=sample,
            temperature=options.temperature if sample else 1.0,
            top_k=options.top_k,
            top_p=options.top_p,
            seed=options.seed,
        )[0]
        top = gen.next_token_probs(text, 10, options.temperature if sample else 1.0, options.top_p)
        pieces = [tok.id_to_token(i) for i in ids]
        next_tokens = [
            {"token": piece_labels([t], False)[0].replace("Ġ", "␣"), "prob": round(p, 5)} for t, p in top
        ]
        # the continuation's tokens (as far as the context holds them), re-read from its text
        new_ids = (gen.encode_prompt(continuation) if continuation else [])[: self.config.max_len - len(ids)]
        whole = torch.tensor([ids + new_ids], device=tokens.device)  # (1, T + N)

        def score() -> torch.Tensor:
            logits = self.model(whole).logits[0, len(ids) - 1 : -1]  # (N, V): the rows that predict them
            return _gathered(logits, whole[0, len(ids) :])

        labels = [piece_labels([str(tok.id_to_token(i))], False)[0].replace("Ġ", "␣") for i in new_ids]
        return _Pass(
            forward,
            {"decoder": (pieces, pieces)},
            {"text": continuation, "next_tokens": next_tokens, "classes": [], "residues": None},
            score=(labels, score),
        )


class ProteinExplainer(Explainer[str]):
    """Protein encoders (``protein-cls``, ``protein-residue``, ``protein-mlm`` runs): attention
    between residues and the predicted class probabilities (or per-residue labels)."""

    family, kinds, input_label = "protein", ("encoder",), "protein sequence (one-letter codes)"
    example = "GIGKFLHSAKKFGKAFVGEIMNS"  # magainin 2, an antimicrobial peptide

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        from ..inference.protein import ProteinEncoder

        self.encoder = ProteinEncoder.from_run(run_dir, device)
        super().__init__(self.encoder.model, run_dir, max_chars)
        self.classes, self.level = self.encoder.classes, self.encoder.level
        self.tokenizer = self.encoder.tok  # the logit lens's labels (its masked-token head)

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def _ids(self, text: str) -> list[int]:
        return self.encoder.tok.encode(
            "".join(text.split()), "input"
        )  # white space between residues is dropped

    def count_tokens(self, text: str) -> int:
        return len(self._ids(text))

    def _prepare(self, text, options):
        model = self.model
        tok, ids = self.encoder.tok, self._ids(text)
        self._check_tokens(len(ids), self.config.max_len)
        tokens = torch.tensor([ids], device=self.encoder.device)
        # the model itself (not .forward): its own hook records "logits"
        head = {"sequence": model.classify_sequence, "residue": model.classify_residues}.get(
            self.level, model
        )

        def forward(need_weights):
            return {"encoder": head(tokens, need_weights=need_weights).attentions}

        out = head(tokens, need_weights=True)  # the prediction and the weights in one pass
        output: dict[str, Any] = {"text": None, "next_tokens": [], "classes": [], "residues": None}
        if self.level in ("sequence", "residue"):
            probs = out.logits.float().softmax(-1)[0]
            if self.level == "sequence":
                output["classes"] = [
                    {"label": c, "prob": round(float(p), 5)} for c, p in zip(self.classes, probs, strict=True)
                ]
            else:
                output["residues"] = "".join(self.classes[k] for k in probs[1:-1].argmax(-1).tolist())
        # ids come from tok.encode, so each is in the vocabulary: id_to_token gives a str, never None
        pieces = cast(list[str], [tok.id_to_token(i) for i in ids])
        before = out.logits.argmax(-1)[0]  # the predicted class (of each residue)

        def score() -> torch.Tensor:
            logits = head(tokens).logits[0]
            if self.level == "sequence":  # every class
                return torch.softmax(logits.float(), -1)
            if self.level == "residue":  # each residue's predicted label
                return _gathered(logits[1:-1], before[1:-1])
            return _gathered(logits[1:-1], tokens[0, 1:-1])  # each residue, read unmasked

        labels = (
            list(self.classes)
            if self.level == "sequence"
            else [f"{r}{i + 1}" for i, r in enumerate(pieces[1:-1])]
        )
        return _Pass(
            forward, {"encoder": (pieces, pieces)}, output, {"encoder": out.attentions}, score=(labels, score)
        )


class TextExplainer(Explainer[str]):
    """Pretrained text encoders (a converted BERT such as MiniLM, or a ``text-cls`` run): the
    attention between the word pieces of a sentence, or of a sentence pair (``A ||| B``, with
    BERT's token types), and what the model makes of it.

    Output keys (besides ``classes``, the class probabilities of a trained head): for a pair,
    ``similarity`` = ``{"first", "second", "cosine"}``, the cosine similarity of the two
    sentences' embeddings (each encoded alone, mean-pooled and L2-normalised, as
    ``qkv similarity`` and sentence-transformers compute it); for one sentence, ``embedding``
    = ``{"dim", "norm", "closest_words": [{"word", "cosine"}]}``: the embedding's size, its
    norm before normalisation and the sentence's own words, each encoded alone, nearest to it
    (its nearest neighbours among its parts: the content words, usually).
    """

    family, kinds, subword = "text", ("encoder",), True
    input_label = "sentence (a pair: first ||| second)"
    example = "A man rides a bicycle through the park. ||| Someone is cycling outdoors."

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        from ..inference.text import TextEncoder

        self.encoder = TextEncoder.load(run_dir, device)
        super().__init__(self.encoder.model, run_dir, max_chars)
        self.classes = self.encoder.classes
        self.level = "sequence" if self.classes else "mlm"

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def output_label(self, index: int) -> str:
        return vocabulary_label(
            wordpiece_as_marked([self.encoder.tokenizer.id_to_token(index) or f"#{index}"])[0]
        )

    def _embedding(self, text: str, top: int = 5) -> dict:
        """What one sentence's embedding is near: its size, its norm before the L2
        normalisation, and the ``top`` words of the sentence (each encoded alone, punctuation
        stripped) whose embeddings are closest to it (cosine), best first."""
        words = [w for w in dict.fromkeys(w.strip(string.punctuation) for w in text.split()) if w]
        vectors = self.encoder.embed([text, *words], normalize=False)  # (1 + W, D) float32
        norms = np.linalg.norm(vectors, axis=1)
        cosines = (vectors[1:] @ vectors[0]) / np.maximum(norms[1:] * norms[0], 1e-12)  # (W,)
        best = np.argsort(-cosines, kind="stable")[:top]
        return {
            "dim": int(vectors.shape[1]),
            "norm": round(float(norms[0]), 4),
            "closest_words": [{"word": words[i], "cosine": round(float(cosines[i]), 4)} for i in best],
        }

    def _encode(self, text: str) -> tuple[list[int], list[int] | None]:
        """Token ids and (a pair) BERT's token types: 0 for the first sentence, 1 for the second."""
        pair = split_pair(text)
        if pair is None:
            return self.encoder.tokenizer.encode(text), None
        return self.encoder.tokenizer.encode_pair(*pair)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text)[0])

    def _prepare(self, text, options):
        tok = self.encoder.tokenizer
        ids, types = self._encode(text)
        self._check_tokens(len(ids), self.config.max_len)
        device = self.encoder.device
        tokens = torch.tensor([ids], device=device)
        token_types = None if types is None else torch.tensor([types], device=device)
        head = "sequence" if self.classes else "mlm"

        def forward(need_weights):
            return {
                "encoder": self.model(tokens, need_weights, head=head, token_types=token_types).attentions
            }

        out = self.model(tokens, True, head=head, token_types=token_types)
        output: dict[str, Any] = {"text": None, "next_tokens": [], "classes": [], "residues": None}
        if self.classes:
            probs = out.logits.float().softmax(-1)[0]
            output["classes"] = [
                {"label": c, "prob": round(float(p), 5)} for c, p in zip(self.classes, probs, strict=True)
            ]
        pieces = wordpiece_as_marked([tok.id_to_token(i) for i in ids])
        pair = split_pair(text)
        if pair is None:
            output["embedding"] = self._embedding(text)
        else:
            first, second = self.encoder.embed(list(pair))  # each sentence alone, as qkv similarity does
            output["similarity"] = {
                "first": pair[0],
                "second": pair[1],
                "cosine": round(float(first @ second), 5),
            }

        def score() -> torch.Tensor:
            return torch.softmax(self.model(tokens, head=head, token_types=token_types).logits.float(), -1)[0]

        return _Pass(
            forward,
            {"encoder": (pieces, pieces)},
            output,
            {"encoder": out.attentions},
            score=(list(self.classes), score) if self.classes else None,
        )
