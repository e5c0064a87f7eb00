"""Vision Transformer runs in the explainer: an image in; class probabilities, the class
token's attention over the patches, attention rollout and Eq. 1 with patches as tokens out.

The tokens of a ViT (Dosovitskiy et al. 2021, §3.1) are the class token (``CLS``, token 0)
and the ``N = grid²`` patches in reading order (token ``1 + i`` is patch ``i``, row
``i // grid``, column ``i % grid``), labelled ``r<row>c<column>`` from 1. Everything else
(:meth:`~qkv.explain.explainer.Explainer.explain`'s attention maps, the Eq. 1
step-through) is the machinery of the text families, with these tokens.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import nn

from ..data.images import ImageSet, load_fashion_mnist, load_image_task, read_image, to_model_input
from ..errors import QkvError
from ..inference.vision import ImageClassifier
from ..models.config import CaptionConfig, ViTConfig
from ..runs import run_settings
from .block import rounded
from .explainer import DEFAULT_MAX_CHARS, DecodingOptions, Explainer, Explanation, _Pass
from .rollout import attention_rollout

ImageInput = str | Path | bytes | int | np.ndarray
"""An image file's path, an image file's contents (bytes), the index of an image of the run's
test split (an ``int``, or the string ``test:INDEX`` where no such file exists) or the model's
input pixels, uint8 ``(image_size, image_size, channels)``."""

TEST_PICK = re.compile(r"test:(\d+)")
UPLOAD_NAME = "uploaded image"


def read_pixels(
    image: ImageInput,
    cfg: ViTConfig | CaptionConfig,
    test_image: Callable[[int], tuple[np.ndarray, str]],
    model: str,
    background: Literal["black", "white"] = "black",
) -> tuple[np.ndarray, str]:
    """The model's input pixels, uint8 ``(image_size, image_size, channels)``, and a caption,
    for any :data:`ImageInput` an image explainer takes: a test index (``test_image`` reads it)
    or ``"test:INDEX"``, pixels, uploaded bytes, a file (files and bytes by the rule of
    :func:`qkv.data.images.read_image`, over ``background`` where transparent; a captioner's
    image needs a side of at least its patch grid).

    Raises:
        QkvError: a missing file, empty bytes, an undecodable, truncated or too large image
            (one line, from ``read_image``), pixels of the wrong shape or dtype, a test index out
            of range, or an input of another type (``model`` names what takes images).
    """
    least = cfg.least_image_side
    if isinstance(image, int) and not isinstance(image, bool):
        return test_image(image)
    if isinstance(image, np.ndarray):
        want = (cfg.image_size, cfg.image_size, cfg.channels)
        if image.shape != want or image.dtype != np.uint8:
            raise QkvError(f"pixels must be uint8 {want}, got {image.dtype} {image.shape}")
        return image, "image array"
    if isinstance(image, bytes):
        if not image:
            raise QkvError("empty upload: choose an image file")
        data = io.BytesIO(image)
        data.name = UPLOAD_NAME
        pixels = read_image(data, cfg.image_size, cfg.channels, background, least)
        return pixels, f"{UPLOAD_NAME} ({len(image):,} bytes)"
    if not isinstance(image, (str, Path)):
        raise QkvError(
            f"{model} takes an image (file path, bytes, test index or pixels), not a {type(image).__name__}"
        )
    path = Path(image)
    if not path.is_file():
        pick = TEST_PICK.fullmatch(str(image))
        if pick:
            return test_image(int(pick.group(1)))
        raise QkvError(f"image file not found: {image} (test:INDEX picks an image of the run's test set)")
    return read_image(path, cfg.image_size, cfg.channels, background, least), str(path)


def png_data_url(pixels: np.ndarray) -> str:
    """uint8 ``(H, W, 1 or 3)`` pixels as a ``data:image/png;base64,...`` URL (what the page
    draws; the page's Content-Security-Policy allows ``data:`` images)."""
    from PIL import Image

    img = Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def patch_labels(grid: int) -> list[str]:
    """``["r1c1", "r1c2", ...]``: the ``grid²`` patches in reading order, rows and columns from 1."""
    return [f"r{i // grid + 1}c{i % grid + 1}" for i in range(grid * grid)]


def patch_info(config: ViTConfig | CaptionConfig) -> dict:
    """The image and patch geometry the page needs (``image_size``, ``patch_size``,
    ``grid_size``, ``channels``)."""
    return {k: getattr(config, k) for k in ("image_size", "patch_size", "grid_size", "channels")}


class ImageExplainer(Explainer[ImageInput]):
    """``qkv train vit`` runs. The input is an image (see :data:`ImageInput`) instead of text;
    the output holds the class probabilities, the model's input as a PNG data URL, the patch
    geometry and the class token's row of :func:`~qkv.explain.rollout.attention_rollout`.

    Output keys (besides the text families' ``classes``): ``prediction`` (a class name),
    ``image`` (data URL of the ``image_size``² model input), ``image_size``, ``patch_size``,
    ``grid_size``, ``rollout`` (``grid × grid`` nested lists: the rollout from each patch to
    the class token, the class token's own share left out) and ``rollout_cls`` (that share).
    The probabilities are those of the one forward pass whose attention is shown: no mirror
    averaging, so they can differ slightly from ``qkv classify`` on a ``tta_hflip`` run.
    """

    family, kinds, input_kind, subword = "vit", ("encoder",), "image", False
    input_label = "image (PNG, JPEG, ...), or an image of the test set"

    def __init__(
        self, run_dir: str | Path, device: torch.device | str = "cpu", max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        self.classifier = ImageClassifier.from_run(run_dir, device)
        super().__init__(self.classifier.model, run_dir, max_chars)
        self.classes = self.classifier.classes
        self.train_config = run_settings(run_dir)
        self.task = self.train_config.get("task", "fashion-mnist")
        self._test: ImageSet | None = None

    def layers(self, kind: str) -> nn.ModuleList:
        return self.model.layers

    def output_label(self, index: int) -> str:
        return str(self.classes[index])

    def info(self) -> dict:
        return {**super().info(), **patch_info(self.config), "task": self.task}

    def token_labels(self) -> list[str]:
        """``["CLS", "r1c1", "r1c2", ...]``: ``1 + grid²`` labels, patches in reading order."""
        return ["CLS", *patch_labels(self.config.grid_size)]

    # ---------- inputs

    def test_images(self) -> ImageSet:
        """The test split of the run's task (loaded once): Fashion-MNIST's 10,000 test images,
        or the recipe's held-out split of the digits or of an image folder.

        Raises:
            QkvError: the data cannot be found (a folder that moved, no network for a
                download).
        """
        if self._test is None:
            if self.task == "fashion-mnist":
                self._test = load_fashion_mnist("test")
            else:
                keys = {
                    k: self.train_config[k] for k in ("val_fraction", "split_seed") if k in self.train_config
                }
                self._test = load_image_task(
                    self.task, self.config.image_size, self.config.channels, **keys
                ).test
        return self._test

    def test_image(self, index: int) -> tuple[np.ndarray, str]:
        """Test image ``index``: uint8 ``(image_size, image_size, channels)`` and a caption.

        Raises:
            QkvError: ``index`` out of range, or as :meth:`test_images`.
        """
        data = self.test_images()
        if not 0 <= index < len(data.labels):
            raise QkvError(
                f"test image {index} out of range: the test set has images 0..{len(data.labels) - 1}"
            )
        label = data.classes[data.labels[index]]
        return data.images[index].copy(), f"{self.task} test image {index} (true class: {label})"

    def examples(self, n: int = 10) -> list[dict]:
        """A few test images to pick from: the first of each class (class order), then the
        following ones, ``n`` in all: ``[{"index", "label", "image" (PNG data URL)}]``."""
        data = self.test_images()
        firsts = [int(np.flatnonzero(data.labels == c)[0]) for c in np.unique(data.labels)]
        picks = (firsts + [i for i in range(len(data.labels)) if i not in firsts])[:n]
        return [
            {"index": i, "label": data.classes[data.labels[i]], "image": png_data_url(data.images[i])}
            for i in picks
        ]

    def read(self, image: ImageInput) -> tuple[np.ndarray, str]:
        """The model's input pixels, uint8 ``(image_size, image_size, channels)``, and a caption
        for any :data:`ImageInput` (files and bytes by the rule of
        :func:`qkv.data.images.read_image`).

        Raises:
            QkvError: a missing file, empty bytes, an undecodable, truncated or too large
                image (one line, from ``read_image``), pixels of the wrong shape or dtype,
                or a test index out of range.
        """
        return read_pixels(image, self.config, self.test_image, "an image classifier")

    # ---------- the Explainer interface, with images for text

    def _prepared(self, image: ImageInput, options: DecodingOptions | None) -> _Pass:
        """:meth:`_prepare_pixels` of the decoded pixels, reused while the pixels are the same (the
        page asks for the steps of the image it just explained)."""
        pixels, caption = self.read(image)
        key = pixels.tobytes()
        prepared = (
            self._prepare_pixels(pixels, options)
            if self._last is None or self._last[0] != key
            else self._last[2]
        )
        self._last = (key, caption, prepared)  # the caption of this call, for explain()
        return prepared

    def _fresh(self, image: ImageInput, options: DecodingOptions) -> _Pass:
        return self._prepare_pixels(self.read(image)[0], options)

    def _prepare_pixels(self, pixels: np.ndarray, options: DecodingOptions | None) -> _Pass:
        cfg, model = self.config, self.model
        probs, weights = self.classifier.attentions(pixels)  # (num_labels,), L × (H, T, T)
        x = to_model_input(pixels[None]).to(self.classifier.device)  # (1, C, S, S)

        def forward(need_weights):
            return {"encoder": model(x, need_weights=need_weights).attentions}

        def score() -> torch.Tensor:  # every class's probability, from the one pass
            return torch.softmax(model(x).logits.float(), -1)[0]

        rollout = attention_rollout(weights)[0]  # (T,): what the class token holds of each token
        g = cfg.grid_size
        output = {
            "text": None,
            "next_tokens": [],
            "residues": None,
            "classes": [
                {"label": c, "prob": round(float(p), 5)} for c, p in zip(self.classes, probs, strict=True)
            ],
            "prediction": self.classes[int(probs.argmax())],
            "image": png_data_url(pixels),
            "image_size": cfg.image_size,
            "patch_size": cfg.patch_size,
            "grid_size": g,
            "rollout": rounded(rollout[1:].reshape(g, g), 5),
            "rollout_cls": round(float(rollout[0]), 5),
        }
        labels = self.token_labels()
        return _Pass(
            forward,
            {"encoder": (labels, labels)},
            output,
            {"encoder": [torch.from_numpy(w)[None] for w in weights]},  # L × (1, H, T, T)
            score=([str(c) for c in self.classes], score),
        )

    @torch.no_grad()
    def explain(
        self, image: ImageInput, options: DecodingOptions | None = None, merge_words: bool = True
    ) -> Explanation:
        """The class probabilities and every layer's and head's attention
        ``(n_layers, n_heads, 1 + N, 1 + N)`` for one image; ``input`` of the result is a
        caption (file name, "uploaded image", or the test image and its true class).

        Raises: as :meth:`read`.
        """
        result = super().explain(image, options, merge_words=False)
        assert self._last is not None  # set by _prepared, which super().explain just called
        result.text = self._last[1]
        return result
