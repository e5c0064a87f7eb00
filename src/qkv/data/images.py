"""Image data sets: Fashion-MNIST, scikit-learn's 8 × 8 digits, and a folder of the user's
images (one sub-folder per class), read safely with Pillow, plus the input rule and the
augmentations of ``qkv train vit``.

Arrays are ``uint8`` ``(N, H, W, C)`` (what files hold); :func:`to_model_input` turns them into
the model's ``float32 (N, C, H, W)`` in [-1, 1].
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import QkvError
from ..extras import require
from .sources import READ_ERRORS, find_data_file, unreadable_because

logger = logging.getLogger(__name__)

# Larger images are refused before their pixels are decoded (Pillow's own guard only warns
# below 2 × 89 M pixels): 16 M pixels is a 4096 × 4096 photo, far more than any ViT here needs.
MAX_PIXELS = 16_000_000
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")

FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MNIST_FILES = {  # name → sha256 (as in ../shared/data/SHA256SUMS)
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
FASHION_MNIST_CITATION = "Fashion-MNIST: Xiao, Rasul & Vollgraf 2017, arXiv:1708.07747 (MIT)"


@dataclass
class ImageSet:
    """Images with integer labels: ``images`` uint8 ``(N, H, W, C)``, ``labels`` int64 ``(N,)``
    (indices into ``classes``), ``ids`` one name per image (file path or ``split/index``)."""

    images: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]
    ids: list[str]

    def subset(self, index: np.ndarray) -> ImageSet:
        return ImageSet(self.images[index], self.labels[index], self.classes, [self.ids[i] for i in index])


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format; gzipped or not) as a uint8 array.

    Raises:
        QkvError: not an unsigned-byte IDX file, or its size disagrees with its header.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except READ_ERRORS as exc:
        raise QkvError(f"cannot read {path}: {unreadable_because(exc)}") from None
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise QkvError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).copy()  # writable
    if body.size != int(np.prod(shape)):
        raise QkvError(f"{path}: header says {shape} ({int(np.prod(shape))} bytes), file holds {body.size}")
    return body.reshape(shape)


def load_fashion_mnist(split: str) -> ImageSet:
    """Fashion-MNIST ``"train"`` (60,000) or ``"test"`` (10,000) 28 × 28 grey images, from
    ``$QKV_DATA_DIR/fashion-mnist/``, the cache, else downloaded (checksums verified)."""
    prefix = {"train": "train", "test": "t10k"}[split]
    arrays = []
    for kind in ("images-idx3-ubyte.gz", "labels-idx1-ubyte.gz"):
        name = f"{prefix}-{kind}"
        arrays.append(
            read_idx(
                find_data_file("fashion-mnist", name, FASHION_MNIST_URL + name, FASHION_MNIST_FILES[name])
            )
        )
    images, labels = arrays
    return ImageSet(
        images[..., None],
        labels.astype(np.int64),
        FASHION_MNIST_CLASSES,
        [f"{split}/{i}" for i in range(len(labels))],
    )


def load_digits() -> ImageSet:
    """scikit-learn's bundled 8 × 8 digits (1,797 images, 10 classes; grey levels 0..16 scaled
    to 0..255): a tiny offline fixture.

    Raises:
        MissingExtra: scikit-learn is not installed (``pip install 'qkv[probe]'``).
    """
    require("probe", "the digits data set")
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    images = np.round(d.images * (255 / 16)).astype(np.uint8)[..., None]
    return ImageSet(
        images,
        d.target.astype(np.int64),
        tuple(str(c) for c in d.target_names),
        [f"digits/{i}" for i in range(len(d.target))],
    )


def read_image(
    path: str | Path | BinaryIO,
    size: int,
    channels: int,
    background: Literal["black", "white"] = "black",
    least: int = 1,
) -> np.ndarray:
    """One image file as the model sees it: ``uint8 (size, size, channels)``.

    ``path`` is a file name or an open binary file object (``io.BytesIO(data)`` for bytes
    received over the network); errors name the file, or the object's ``name`` attribute if
    it has one, else say "image data".

    The rule: decode with Pillow (PNG, JPEG, ...; the first frame of an animation), convert to
    grey (``channels=1``, Pillow's ITU-R 601-2 luma) or RGB (``channels=3``; transparency over
    ``background``: black, as Fashion-MNIST's garments, or white, as emoji are drawn), then
    resize to ``size × size`` with bilinear filtering (the aspect ratio is not kept). ``least``:
    the fewest pixels a side may have (a captioner's patches per row: scaled up from fewer, its
    patches would hold interpolation rather than the image).
    Nothing else is changed: a Fashion-MNIST model expects a light object on a dark background,
    as in its training data.

    Raises:
        QkvError: not a readable image, truncated or corrupt data, more than
            :data:`MAX_PIXELS` pixels (checked from the header, before decoding), a side of
            fewer than ``least`` pixels, or a channel count other than 1 or 3.
    """
    from PIL import Image, UnidentifiedImageError

    if channels not in (1, 3):
        raise QkvError(f"images with {channels} channels are not supported (1 or 3)")
    name = path if isinstance(path, (str, Path)) else getattr(path, "name", "image data")
    try:
        with Image.open(path) as img:
            w, h = img.size
            if w * h > MAX_PIXELS:
                raise QkvError(
                    f"{name}: {w} x {h} pixels is more than the {MAX_PIXELS:,} accepted "
                    "(decompression-bomb guard)"
                )
            if min(w, h) < least:
                raise QkvError(f"{name}: {w}x{h} pixels is too small (at least {least}x{least})")
            img.load()
            if img.mode in ("RGBA", "LA", "P"):
                img = img.convert("RGBA")
                level = 255 if background == "white" else 0
                img = Image.alpha_composite(Image.new("RGBA", img.size, (level, level, level, 255)), img)
            img = img.convert("L" if channels == 1 else "RGB")
            img = img.resize((size, size), Image.Resampling.BILINEAR)
            arr = np.array(img, dtype=np.uint8)  # a writable copy (torch warns on read-only arrays)
    except QkvError:
        raise
    except UnidentifiedImageError:
        raise QkvError(f"{name}: not an image file Pillow can read") from None
    except Image.DecompressionBombError as exc:
        raise QkvError(
            f"{name}: more than the {MAX_PIXELS:,} pixels accepted (decompression-bomb guard; Pillow: {exc})"
        ) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise QkvError(f"{name}: truncated or corrupt image ({exc})") from None
    return arr.reshape(size, size, channels)


def load_image_folder(root: str | Path, size: int, channels: int) -> ImageSet:
    """The user's images in torchvision's ``ImageFolder`` layout: ``root/<class>/<image>``,
    classes in sorted order, each image read with :func:`read_image`.

    Raises:
        QkvError: no such folder, fewer than two class folders, a class folder without
            images, or an image that cannot be read (named).
    """
    root = Path(root)
    if not root.is_dir():
        raise QkvError(f"image folder {root} does not exist")
    class_dirs = sorted(d for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not class_dirs:
        raise QkvError(f"image folder {root} has no class sub-folders (expected {root}/<class>/<image>)")
    if len(class_dirs) < 2:
        raise QkvError(
            f"image folder {root} has one class ({class_dirs[0].name}); a classifier "
            "needs at least two class sub-folders"
        )
    images, labels, ids = [], [], []
    for label, d in enumerate(class_dirs):
        files = sorted(f for f in d.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise QkvError(f"class folder {d} holds no images ({', '.join(IMAGE_SUFFIXES)})")
        for f in files:
            images.append(read_image(f, size, channels))
            labels.append(label)
            ids.append(str(f))
    return ImageSet(
        np.stack(images), np.array(labels, dtype=np.int64), tuple(d.name for d in class_dirs), ids
    )


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(rest, held_out)``: ``fraction`` of each class (at least one image) held out,
    chosen by ``seed``."""
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        held.append(rng.permutation(idx)[: max(1, round(fraction * len(idx)))])
    held_out = np.sort(np.concatenate(held))
    return np.setdiff1d(np.arange(len(labels)), held_out), held_out


@dataclass
class ImageTask:
    """The three splits of one image task, its name and whom to cite."""

    name: str
    train: ImageSet
    val: ImageSet
    test: ImageSet
    citation: str

    @property
    def classes(self) -> tuple[str, ...]:
        return self.train.classes

    def split(self, name: str) -> ImageSet:
        """``"train"``, ``"val"`` or ``"test"``; raises :class:`QkvError` for another name."""
        if name not in ("train", "val", "test"):
            raise QkvError(f"split must be train, val or test (got {name!r})")
        return getattr(self, name)


def _three_way(data: ImageSet, fraction: float, seed: int) -> tuple[ImageSet, ImageSet, ImageSet]:
    rest, test = stratified_split(data.labels, fraction, seed)
    train, val = stratified_split(data.labels[rest], fraction / (1 - fraction), seed + 1)
    return data.subset(rest[train]), data.subset(rest[val]), data.subset(test)


def load_image_task(
    task: str, image_size: int, channels: int, val_fraction: float = 0.1, split_seed: int = 0
) -> ImageTask:
    """Train / val / test images of ``task``: ``"fashion-mnist"`` (its 60,000 training images
    lose ``val_fraction`` of each class to validation, chosen by ``split_seed``; its 10,000
    test images stay the test split), ``"digits"``, or a folder: ``DIR/train/<class>/...`` +
    ``DIR/test/<class>/...`` (validation taken from train as for Fashion-MNIST), else
    ``DIR/<class>/...`` split ``1 - 2·val_fraction`` / ``val_fraction`` / ``val_fraction``
    per class. Folder images are read at ``image_size`` and ``channels``
    (:func:`read_image`); the built-in sets keep their own size.

    Raises:
        QkvError: an unknown task name, or a folder that is not a usable image folder.
    """
    frac, seed = val_fraction, split_seed
    if task == "fashion-mnist":
        full, test = load_fashion_mnist("train"), load_fashion_mnist("test")
        train, val = stratified_split(full.labels, frac, seed)
        return ImageTask(task, full.subset(train), full.subset(val), test, FASHION_MNIST_CITATION)
    if task == "digits":
        return ImageTask(
            task,
            *_three_way(load_digits(), frac, seed),
            "scikit-learn digits (UCI optical recognition of handwritten digits)",
        )
    root = Path(task)
    if not root.is_dir():
        raise QkvError(
            f"unknown task {task!r}: use fashion-mnist, digits or an image folder (DIR/<class>/<image>)"
        )
    if (root / "train").is_dir() and (root / "test").is_dir():
        full = load_image_folder(root / "train", image_size, channels)
        test = load_image_folder(root / "test", image_size, channels)
        if test.classes != full.classes:
            raise QkvError(f"{root}/test has classes {test.classes}, {root}/train has {full.classes}")
        train, val = stratified_split(full.labels, frac, seed)
        return ImageTask(root.name, full.subset(train), full.subset(val), test, str(root))
    return ImageTask(
        root.name, *_three_way(load_image_folder(root, image_size, channels), frac, seed), str(root)
    )


@dataclass(frozen=True)
class ImageBatch:
    """One training micro-batch: the ``number``-th of ``epoch``, image ``rows`` (indices into the
    training split); ``part`` > 0 is one process's share of it under torchrun (its augmentation
    draws from a stream of its own)."""

    epoch: int
    number: int
    rows: torch.Tensor
    part: int = 0

    def __len__(self) -> int:
        return len(self.rows)

    def shard(self, rank: int, world_size: int) -> ImageBatch:
        return replace(self, rows=self.rows[rank::world_size], part=rank + 1)


def check_images(images: np.ndarray, size: int, channels: int) -> None:
    """Refuse anything but uint8 ``(N, size, size, channels)`` images (what a model reads).

    Raises:
        QkvError: another rank, size, channel count or dtype, named.
    """
    want = (size, size, channels)
    if images.ndim != 4 or images.shape[1:] != want or images.dtype != np.uint8:
        raise QkvError(
            f"images must be uint8 (N, {size}, {size}, {channels}), got {images.dtype} {images.shape}"
        )


def to_model_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` → float32 ``(N, C, H, W)``, ``pixel / 127.5 - 1`` (in [-1, 1])."""
    x = torch.as_tensor(images)
    return x.permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)


def augment(images: torch.Tensor, crop_padding: int, hflip: bool, generator: torch.Generator) -> torch.Tensor:
    """Random crop after zero-padding (``crop_padding`` pixels each side; padding is the
    darkest value, -1) and random horizontal flip, each image on its own draw.

    Shape: ``images (B, C, H, W)`` float in [-1, 1] → same shape.
    """
    b, _, h, w = images.shape
    if crop_padding:
        p = crop_padding
        padded = F.pad(images, (p, p, p, p), value=-1.0)  # (B, C, H + 2p, W + 2p)
        dy = torch.randint(0, 2 * p + 1, (b,), generator=generator)
        dx = torch.randint(0, 2 * p + 1, (b,), generator=generator)
        rows = (dy[:, None] + torch.arange(h))[:, None, :, None]  # (B, 1, H, 1)
        cols = (dx[:, None] + torch.arange(w))[:, None, None, :]  # (B, 1, 1, W)
        batch = torch.arange(b)[:, None, None, None]
        chan = torch.arange(images.size(1))[None, :, None, None]
        images = padded[batch, chan, rows, cols]
    if hflip:
        flip = torch.rand(b, generator=generator) < 0.5
        images = torch.where(flip[:, None, None, None], images.flip(-1), images)
    return images
