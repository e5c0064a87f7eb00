"""A trained Vision Transformer as an inference API: image files or arrays in, class
probabilities (and attention weights for :mod:`qkv.explain`) out. Beside
:class:`~qkv.inference.protein.ProteinEncoder` and :class:`~qkv.inference.translator.Translator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .. import runs
from ..data.images import check_images, read_image, to_model_input
from ..errors import QkvError
from ..models.vit import VisionTransformer
from ..runs.layout import TASK


class ImageClassifier:
    """A :class:`~qkv.models.vit.VisionTransformer` with its class names.

    Args:
        model: the network (eval mode). classes: class names in id order.
        device: where it runs. batch_size: images per forward pass.
        hflip_tta: test-time augmentation: the probabilities are the mean of those of the
            image and of its left-right mirror. Only for a model trained with random flips
            (``hflip``), to which a mirrored image is as familiar as the original.
    """

    def __init__(
        self,
        model: VisionTransformer,
        classes: Sequence[str],
        device: torch.device | str = "cpu",
        batch_size: int = 500,
        hflip_tta: bool = False,
    ) -> None:
        self.model, self.classes = model, tuple(classes)
        self.device, self.batch_size = torch.device(device), batch_size
        self.config, self.hflip_tta = model.config, hflip_tta

    @classmethod
    def from_run(cls, run_dir: str | Path, device: torch.device | str = "cpu") -> ImageClassifier:
        """Load a ``qkv train vit`` run directory; ``hflip_tta`` is on when its
        ``train_config.json`` has both ``hflip`` and ``tta_hflip`` (see
        :class:`~qkv.recipes.vit.ViTSettings`; off for runs that do not record it).

        Raises:
            QkvError: a missing or incomplete run directory, or a run of another kind.
        """
        model, _ = runs.load_run(run_dir, device=device, family="vit")
        task = runs.run_json(run_dir, TASK, missing={})
        classes = task["classes"] if task else [str(i) for i in range(model.config.num_labels)]
        saved = runs.run_settings(run_dir)
        tta = bool(saved.get("hflip") and saved.get("tta_hflip"))
        return cls(model, classes, device, hflip_tta=tta)

    def read(self, paths: list[str | Path]) -> np.ndarray:
        """Image files as the model's input: uint8 ``(N, image_size, image_size, channels)``
        (the rule of :func:`qkv.data.images.read_image`). Every file is read before anything
        is predicted, so a bad file fails the whole call with its name."""
        if not paths:
            raise QkvError("no image files given")
        return np.stack([read_image(p, self.config.image_size, self.config.channels) for p in paths])

    def _check(self, images: np.ndarray) -> None:
        check_images(images, self.config.image_size, self.config.channels)

    @torch.no_grad()
    def predict(self, images: np.ndarray) -> np.ndarray:
        """Class probabilities, float32 ``(N, num_labels)``, for uint8 ``(N, H, W, C)`` images
        (with ``hflip_tta``, the mean over each image and its mirror).

        Raises:
            QkvError: images of the wrong size, channel count or dtype.
        """
        self._check(images)
        out = []
        for i in range(0, len(images), self.batch_size):
            x = to_model_input(images[i : i + self.batch_size]).to(self.device)  # (B, C, H, W)
            probs = self.model(x).logits.float().softmax(-1)
            if self.hflip_tta:
                probs = (probs + self.model(x.flip(-1)).logits.float().softmax(-1)) / 2
            out.append(probs.cpu())
        return torch.cat(out).numpy() if out else np.zeros((0, len(self.classes)), np.float32)

    @torch.no_grad()
    def attentions(self, image: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Probabilities ``(num_labels,)`` and every layer's attention weights, one float32
        ``(H, 1 + N, 1 + N)`` array per layer (token 0 = the class token), for one uint8
        ``(H, W, C)`` image."""
        self._check(image[None])
        out = self.model(to_model_input(image[None]).to(self.device), need_weights=True)
        probs = out.logits.float().softmax(-1)[0].cpu().numpy()
        return probs, [w[0].float().cpu().numpy() for w in out.attentions]
