"""Captioning runs in the explainer: an image in; the generated caption and, for each of its
words, the decoder's cross-attention over the image's patches out.

The figure this draws is Show, Attend and Tell's (Xu et al. 2015, Figures 2 and 3): the image,
then one small panel per generated word, in caption order, with the word's attention over the
image laid on it. Here the attention is the Transformer's encoder-decoder attention (Vaswani et
al. 2017, §3.2.3): at every caption position each head of each decoder layer weighs the
``N = grid²`` patch states of the image encoder, so a word has one ``grid × grid`` map per
decoder layer and head. A word of several subword pieces (``t-shirt``) gets its first piece's
map, as :meth:`qkv.inference.caption.Captioner.word_maps` computes it: the numbers are
the model's own, from a teacher-forced pass over ``bos`` + the caption it generated (the same
weights decoding computed).

The page, the PNG pictures and :func:`qkv.show` draw these maps; the rest (the attention of
every kind, layer and head; the Eq. 1 step-through) is the machinery of the other
encoder-decoders, with the patches as the encoder's tokens: patch ``i`` is row ``i // grid``,
column ``i % grid`` (reading order), labelled ``r<row>c<column>`` from 1. There is no class
token: the encoder's self-attention is patches over patches.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..data.images import to_model_input
from ..errors import QkvError
from ..inference.caption import Captioner
from ..runs import run_settings
from .block import rounded
from .explainer import DEFAULT_MAX_CHARS, DecodingOptions, Explainer, Explanation, _gathered, _Pass
from .labels import piece_labels
from .vision import ImageInput, patch_info, patch_labels, png_data_url, read_pixels

logger = logging.getLogger(__name__)

MAP_DIGITS = 7
"""Decimals kept of each per-word weight in the explanation (the model's float32 weights to
within 5e-8)."""
POOLED_KEY = "<patch mean>"  # the one key of a memory="pooled" model (Show and Tell's baseline)


class CaptionExplainer(Explainer[ImageInput]):
    """``qkv train caption`` runs. The input is an image (:data:`~qkv.explain.vision.ImageInput`:
    a file's path or bytes, a test-set index or ``test:INDEX``, or uint8 pixels); the output
    is the caption the model writes for it (greedy decoding, or beam search with
    :class:`~qkv.explain.explainer.DecodingOptions`' ``beam_size`` and ``alpha``) and each
    word's cross-attention over the image.

    Attention kinds: ``encoder`` (patches over patches, ``(n_encoder_layers, H, N, N)``),
    ``decoder`` (masked, over ``<bos>`` and the caption's pieces) and ``cross`` (rows: the
    pieces produced, then ``<eos>``; columns: the ``N`` patches, or the one pooled vector of a
    ``memory="pooled"`` model).

    Output keys (besides ``text``, the caption): ``ids`` (its token ids, no bos/eos),
    ``decoding`` (``"greedy decoding"`` or ``"beam search, beam size K"``), ``image`` (PNG
    data URL of the model's input), ``image_size``, ``patch_size``, ``grid_size``,
    ``map_grid`` (the side ``G`` of a word's map: ``grid_size``, 1 for a pooled memory),
    ``memory``, ``n_decoder_layers``, ``n_heads`` and ``words``: one entry per word of the
    caption, in order, ``{"text", "pieces" (display labels), "start", "end" (its slice of
    ids), "maps"}``, ``maps`` nested lists ``(n_decoder_layers, n_heads, G, G)``: the
    cross-attention row of the word's first piece, patch ``(r, c)`` at ``[r][c]``,
    rounded to :data:`MAP_DIGITS` decimals.

    Args:
        run_dir: a ``qkv train caption`` run directory. device: where the model runs.
        max_chars: unused (an image has no characters); kept for the explainer signature.

    Raises:
        QkvError: a missing or incomplete run directory, or one that is not a captioner.
    """

    family, kinds, input_kind, subword = "caption", ("encoder", "decoder", "cross"), "image", True
    input_label = "image (PNG, JPEG, ...), or an image of the test set"

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        self.captioner = Captioner.from_run(run_dir, device)
        super().__init__(self.captioner.model, run_dir, max_chars)
        self.tokenizer = self.captioner.tokenizer
        self.train_config = run_settings(run_dir)
        self.task = self.train_config.get("task", "scenes")
        self._test: tuple[np.ndarray, list[list[str]]] | None = None

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.encoder.layers if kind == "encoder" else self.model.decoder.layers

    @property
    def map_grid(self) -> int:
        """The side of a word's map: the patch grid, or 1 for a ``memory="pooled"`` model."""
        return self.config.grid_size if self.config.memory == "patches" else 1

    def info(self) -> dict:
        extra = {"map_grid": self.map_grid, "memory": self.config.memory, "task": self.task}
        return {**super().info(), **patch_info(self.config), **extra}

    def token_labels(self) -> list[str]:
        """``["r1c1", "r1c2", ...]``: the ``grid²`` patches in reading order."""
        return patch_labels(self.config.grid_size)

    # ---------- inputs

    def test_images(self) -> tuple[np.ndarray, list[list[str]]]:
        """The test split of the run's task (built once) and its reference captions: scenes'
        ``test`` split as ``train_config.json`` drew it (``eval_scenes``, ``split_seed``,
        ``val_fraction``), or every emoji drawn by the run's ``test_artist``. Images are uint8
        ``(N, image_size, image_size, channels)``.

        Raises:
            QkvError: the data cannot be found (Fashion-MNIST, the emoji archives).
        """
        if self._test is None:
            tc = self.train_config
            if self.task == "emoji":
                from ..data.emoji import load_emoji

                emoji = load_emoji(tc.get("test_artist", "openmoji"), self.config.image_size)
                self._test = emoji.images, [[c] for c in emoji.captions]
            else:
                from ..data.scenes import load_scene_task

                n_eval, seed = tc.get("eval_scenes", 1000), tc.get("split_seed", 0)
                scenes = load_scene_task(1, n_eval, seed, tc.get("val_fraction", 0.1), only=("test",))["test"]
                self._test = scenes.images, scenes.references
        return self._test

    def test_image(self, index: int) -> tuple[np.ndarray, str]:
        """Test image ``index``: uint8 ``(image_size, image_size, channels)`` and a caption
        naming it and its first reference.

        Raises:
            QkvError: ``index`` out of range, or as :meth:`test_images`.
        """
        images, references = self.test_images()
        if not 0 <= index < len(images):
            raise QkvError(f"test image {index} out of range: the test set has images 0..{len(images) - 1}")
        return images[index].copy(), f"{self.task} test image {index} (reference: {references[index][0]})"

    def examples(self, n: int = 10) -> list[dict]:
        """The first ``n`` test images to pick from: ``[{"index", "label" (a reference
        caption), "image" (PNG data URL)}]``."""
        images, references = self.test_images()
        return [
            {"index": i, "label": references[i][0], "image": png_data_url(images[i])}
            for i in range(min(n, len(images)))
        ]

    def read(self, image: ImageInput) -> tuple[np.ndarray, str]:
        """The model's input pixels, uint8 ``(image_size, image_size, channels)``, and a caption,
        for any :data:`~qkv.explain.vision.ImageInput` (files and bytes as
        :func:`qkv.data.images.read_image` reads them, transparency over the run's background).

        Raises:
            QkvError: a missing file, empty bytes, a file that is not a readable image (one
                line, from ``read_image``), one with a side of fewer pixels than the model's
                patches in a row, pixels of the wrong shape or dtype, or a test index out of
                range.
        """
        return read_pixels(image, self.config, self.test_image, "a caption model", self.captioner.background)

    # ---------- the Explainer interface, with images for text

    def _prepared(self, image: ImageInput, options: DecodingOptions | None) -> _Pass:
        """:meth:`_prepare_pixels` of the decoded pixels, reused while the pixels and the
        decoding are the same (the page asks for the steps of the image it just explained)."""
        options = options or DecodingOptions()
        if options.beam_size is None:  # as the run decodes (qkv caption, its test figures)
            options = dataclasses.replace(options, beam_size=self.captioner.beam_size)
        pixels, caption = self.read(image)
        key = (pixels.tobytes(), options.beam_size, options.alpha)
        prepared = (
            self._prepare_pixels(pixels, options)
            if self._last is None or self._last[0] != key
            else self._last[2]
        )
        self._last = (key, caption, prepared)  # the caption of this call, for explain()
        return prepared

    def _fresh(self, image: ImageInput, options: DecodingOptions) -> _Pass:
        if options.beam_size is None:  # as _prepared
            options = dataclasses.replace(options, beam_size=self.captioner.beam_size)
        return self._prepare_pixels(self.read(image)[0], options)

    def _captioner(self, options: DecodingOptions) -> Captioner:
        """The run's captioner decoding as ``options`` say (beam size 1: greedy)."""
        c = self.captioner
        return Captioner(
            c.model,
            c.tokenizer,
            c.background,
            c.device,
            options.beam_size or c.beam_size,
            c.alpha if options.alpha is None else options.alpha,
        )

    def _prepare_pixels(self, pixels: np.ndarray, options: DecodingOptions) -> _Pass:
        cfg, model, tok = self.config, self.model, self.tokenizer
        captioner = self._captioner(options)
        ids = captioner.caption_ids(pixels[None])[0]  # no bos/eos; at most max_len - 1 ids
        words, maps = captioner.word_maps(pixels, ids)  # (n_words, L_dec, H, G, G)
        x = to_model_input(pixels[None]).to(captioner.device)  # (1, C, S, S)
        tgt = torch.tensor([[cfg.bos_id, *ids]], device=captioner.device)  # (1, 1 + T)

        def forward(need_weights):
            out = model(x, tgt, need_weights=need_weights)
            return {
                "encoder": out.encoder_attentions,  # L_enc × (1, H, N, N)
                "decoder": out.self_attentions,  # L_dec × (1, H, 1 + T, 1 + T)
                "cross": out.cross_attentions,  # L_dec × (1, H, 1 + T, N)
            }

        # Patches and the pooled key carry the word marker or "<": each is a word of its own.
        patches = ["▁" + label for label in self.token_labels()]
        keys = patches if cfg.memory == "patches" else [POOLED_KEY]
        pieces = [tok.id_to_token(i) or f"<{i}>" for i in ids]
        beam = options.beam_size or self.captioner.beam_size
        output: dict[str, Any] = {
            "text": tok.decode(ids),
            "next_tokens": [],
            "classes": [],
            "residues": None,
            "ids": ids,
            "decoding": "greedy decoding" if beam <= 1 else f"beam search, beam size {beam}",
            "image": png_data_url(pixels),
            "image_size": cfg.image_size,
            "patch_size": cfg.patch_size,
            "grid_size": cfg.grid_size,
            "map_grid": self.map_grid,
            "memory": cfg.memory,
            "n_decoder_layers": len(model.decoder.layers),
            "n_heads": int(maps.shape[2]),
            "words": [
                {
                    "text": w.text,
                    "pieces": piece_labels(pieces[w.start : w.end]),
                    "start": w.start,
                    "end": w.end,
                    "maps": rounded(torch.from_numpy(m), MAP_DIGITS),
                }
                for w, m in zip(words, maps, strict=True)
            ],
        }
        logger.debug("caption of %d words: %s (%s)", len(words), output["text"], output["decoding"])
        return _Pass(
            forward,
            {
                "encoder": (patches, patches),
                "decoder": (["<bos>", *pieces], ["<bos>", *pieces]),
                "cross": ([*pieces, "<eos>"], keys),
            },
            output,
            forward(True),
            score=(piece_labels([*pieces, "<eos>"]), self._score(x, tgt, ids)),
        )

    def _score(self, x: torch.Tensor, tgt: torch.Tensor, ids: list[int]) -> Callable[[], torch.Tensor]:
        """The probability ``(1 + T,)`` of each piece of the caption, then ``<eos>``, under a
        teacher-forced pass of image ``x (1, C, S, S)`` and decoder input ``tgt (1, 1 + T)``."""
        produced = torch.tensor([*ids, self.config.eos_id], device=x.device)
        return lambda: _gathered(self.model(x, tgt).logits[0], produced)

    @torch.no_grad()
    def explain(
        self, image: ImageInput, options: DecodingOptions | None = None, merge_words: bool = True
    ) -> Explanation:
        """The caption, each word's maps (see the class) and every layer's and head's
        attention of each kind for one image; ``input`` of the result is a caption of the
        input (file name, "uploaded image", or the test image and a reference).

        Raises: as :meth:`read`; :class:`~qkv.errors.ConfigError` for a beam size outside 1 to
        the vocabulary size.
        """
        result = super().explain(image, options, merge_words)
        assert self._last is not None  # set by _prepared, which super().explain just called
        result.text = self._last[1]
        return result


__all__ = ["CaptionExplainer", "MAP_DIGITS"]
