"""A trained captioner as an inference API: image files or arrays in, captions out, and for
each generated word its cross-attention over the image (what :mod:`qkv.explain.caption` draws).
Beside :class:`~qkv.inference.translator.Translator` (the same decoding: greedy or beam search
with the key/value caches, :mod:`qkv.inference.search`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from .. import runs
from ..data.images import check_images, read_image, to_model_input
from ..data.tokenizers import SubwordTokenizer
from ..errors import ConfigError, QkvError
from ..models.caption import CaptionModel
from ..runs.layout import TASK
from .search import beam_search, greedy_decode

logger = logging.getLogger(__name__)


@dataclass
class Word:
    """One generated word: its text and the slice ``[start, end)`` of the caption's token ids
    it spans (a word of several subword pieces, such as ``t-shirt``, spans several)."""

    text: str
    start: int
    end: int


def caption_words(tokenizer: SubwordTokenizer, ids: list[int]) -> list[Word]:
    """Group a caption's subword ids into words: a piece that starts with the word marker
    ``▁`` starts a word; pieces without it (``-``, ``shirt`` after ``▁t``) continue it."""
    words: list[Word] = []
    for i, token_id in enumerate(ids):
        piece = tokenizer.id_to_token(token_id) or ""
        if piece.startswith("▁") or not words:
            words.append(Word("", i, i + 1))
        else:
            words[-1].end = i + 1
    for w in words:
        w.text = tokenizer.decode(ids[w.start : w.end]).strip()
    return words


class Captioner:
    """A :class:`~qkv.models.caption.CaptionModel` with its tokenizer and input rule.

    Args:
        model: the network (eval mode). tokenizer: its caption tokenizer.
        background: what transparent pixels of a file become (``"black"`` for scenes of
            Fashion-MNIST garments, ``"white"`` for emoji: the training images' own).
        device: where it runs. beam_size: 1 = greedy decoding; alpha: the length penalty
            (Vaswani et al. 2017, §6.1). batch_size: images per decoding batch.

    Raises:
        ConfigError: a beam size outside 1..vocabulary size, or a negative ``alpha``.
    """

    def __init__(
        self,
        model: CaptionModel,
        tokenizer: SubwordTokenizer,
        background: Literal["black", "white"] = "black",
        device: torch.device | str = "cpu",
        beam_size: int = 1,
        alpha: float = 0.6,
        batch_size: int = 256,
    ) -> None:
        vocab = model.config.vocab_size
        assert vocab is not None  # CaptionModel.__init__ required it
        if not (isinstance(beam_size, int) and 1 <= beam_size <= vocab):
            raise ConfigError(
                f"beam size must be between 1 (greedy) and the vocabulary size {vocab} (got {beam_size})"
            )
        if not alpha >= 0:
            raise ConfigError(f"length penalty alpha must be a number >= 0 (got {alpha})")
        self.model, self.tokenizer, self.config = model, tokenizer, model.config
        self.background, self.device = background, torch.device(device)
        self.beam_size, self.alpha, self.batch_size = beam_size, alpha, batch_size

    @classmethod
    def from_run(
        cls,
        run_dir: str | Path,
        device: torch.device | str = "cpu",
        beam_size: int | None = None,
        alpha: float = 0.6,
    ) -> Captioner:
        """Load a ``qkv train caption`` run directory (its ``task.json`` gives the background).
        ``beam_size``: ``None`` decodes as the run validated (its ``beam_size`` setting, 1 =
        greedy, in ``train_config.json``).

        Raises:
            QkvError: a missing or incomplete run directory, or a run that is not a captioner.
            ConfigError: a beam size or ``alpha`` out of range.
        """
        model, tokenizer = runs.load_run(run_dir, device=device, family="caption")
        meta = runs.run_json(run_dir, TASK, missing={})
        if beam_size is None:
            beam_size = runs.run_settings(run_dir).get("beam_size", 1)
        return cls(model, tokenizer, meta.get("background", "black"), device, beam_size, alpha)

    def read(self, paths: list[str | Path]) -> np.ndarray:
        """Image files as the model's input, uint8 ``(N, image_size, image_size, channels)``
        (:func:`qkv.data.images.read_image` with this model's background). A file of another
        size is resized, and said so in the log once every file has been read. Every file is
        read and checked before anything is captioned, so a bad file fails the call with its
        name (and nothing else logged).

        A side of fewer pixels than the model has patches in a row (``image_size /
        patch_size``) is refused: scaled up, its patches would hold interpolation rather than
        the image (a 1 × 1 image has nothing to caption).

        Raises:
            QkvError: no files, a file that is not a readable image, has more than
                :data:`~qkv.data.images.MAX_PIXELS` pixels, or is too small (named).
        """
        from PIL import Image

        if not paths:
            raise QkvError("no image files given")
        size, channels, least = self.config.image_size, self.config.channels, self.config.grid_size
        images, notes = [], []
        for p in paths:
            images.append(read_image(p, size, channels, self.background, least))
            with Image.open(p) as img:  # read_image has checked it: the header only
                w, h = img.size
            if (w, h) != (size, size):
                notes.append(f"{p}: {w}x{h} pixels, resized to {size}x{size}")
        for note in notes:
            logger.warning(note)
        return np.stack(images)

    @torch.no_grad()
    def caption_ids(self, images: np.ndarray) -> list[list[int]]:
        """Caption token ids (no bos/eos) of uint8 ``(N, H, W, C)`` images.

        Raises:
            QkvError: images of the wrong size, channel count or dtype.
        """
        check_images(images, self.config.image_size, self.config.channels)
        out: list[list[int]] = []
        for i in range(0, len(images), self.batch_size):
            x = to_model_input(images[i : i + self.batch_size]).to(self.device)
            if self.beam_size == 1:
                out += greedy_decode(self.model, x)
            else:
                out += beam_search(self.model, x, self.beam_size, self.alpha)
        return out

    def caption(self, images: np.ndarray) -> list[str]:
        """Captions of uint8 ``(N, H, W, C)`` images (see :meth:`caption_ids`)."""
        return self.tokenizer.decode_batch(self.caption_ids(images))

    @torch.no_grad()
    def cross_attention(self, image: np.ndarray, ids: list[int]) -> np.ndarray:
        """Every decoder layer's cross-attention while the caption ``ids`` is written:
        float32 ``(n_decoder_layers, n_heads, len(ids), N)``, row ``t`` the weights over the
        ``N`` patches (reading order) of the position whose output predicted ``ids[t]``
        (teacher forcing over ``bos + ids``: the same numbers decoding computed).

        Raises:
            QkvError: an image of the wrong size, channel count or dtype.
        """
        check_images(image[None], self.config.image_size, self.config.channels)
        tgt = torch.tensor([[self.config.bos_id, *ids]], device=self.device)
        out = self.model(to_model_input(image[None]).to(self.device), tgt, need_weights=True)
        maps = torch.stack([w[0, :, : len(ids)] for w in out.cross_attentions])  # (L, H, T, N)
        return maps.float().cpu().numpy()

    def word_maps(self, image: np.ndarray, ids: list[int]) -> tuple[list[Word], np.ndarray]:
        """The caption's words and, for each, the cross-attention of its first piece: float32
        ``(n_words, n_decoder_layers, n_heads, grid, grid)``. The first piece is where the model
        chose the word; the pieces after it ("-", "shirt" of "▁t" "-" "shirt") follow from it
        and look elsewhere (the "-" at the top-left patch), so a mean over them moved a
        t-shirt's map onto another garment."""
        words = caption_words(self.tokenizer, ids)
        maps = self.cross_attention(image, ids)  # (L, H, T, N)
        g = self.config.grid_size if self.config.memory == "patches" else 1
        per_word = [maps[:, :, w.start] for w in words]  # each (L, H, N)
        shape = (len(words), *maps.shape[:2], g, g)
        return words, (np.stack(per_word).reshape(shape) if words else np.zeros(shape, np.float32))


__all__ = ["Word", "caption_words", "Captioner"]
