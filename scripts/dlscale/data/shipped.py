"""The shipped real data: scikit-learn's bundled handwritten digits, written in every format.

``sklearn.datasets.load_digits()`` ships 1,797 real 8x8 greyscale scans of handwritten digits
(values 0..16, 10 classes; the UCI "Optical Recognition of Handwritten Digits" test set)
inside the scikit-learn wheel, so the embedded default trains on real data with no download.
Each image is brought to the CIFAR shape so one CIFAR-size model (``cnn_small``) trains on
every format, the CIFAR binary one included:

* values 0..16 scaled to 0..255 (``round(v * 255 / 16)``),
* upscaled 8x8 -> 32x32 by repeating each pixel 4x4 (nearest neighbour, no new values),
* the grey channel repeated into R, G and B.

Split: stratified 80/20, fixed: within each class (in the dataset's order) a permutation drawn
from ``numpy.random.default_rng(SPLIT_SEED)`` puts ``round(0.2 * class count)`` samples in
``val`` (359 in all) and the rest in ``train`` (1,438); each split keeps the dataset's order.
Written losslessly (PNG, raw CIFAR records), so every format holds the identical pixels.

scikit-learn's two bundled sample photos (``load_sample_images``: ``china.jpg``,
``flower.jpg``, 427x640 RGB JPEGs) go through the JPEG decoding path: :func:`write_photos`
writes the original JPEG bytes as an image_folder or webdataset of two classes.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dlscale.data import FORMATS
from dlscale.data.writers import write_cifar_binary, write_image_folder, write_webdataset

__all__ = [
    "SPLIT_SEED",
    "VAL_FRACTION",
    "digits_splits",
    "write_digits",
    "write_digits_checked",
    "write_photos",
]

SPLIT_SEED = 0
VAL_FRACTION = 0.2
#: Pixel repeat of the 8x8 digits to the CIFAR size.
UPSCALE = 4
#: Samples per webdataset shard of the digits: 6 train shards (the last shorter), 2 val.
SAMPLES_PER_SHARD = 256
DIGIT_CLASSES = tuple(str(d) for d in range(10))


def digits_splits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images, labels), "val": (...)}``: uint8 (N, 32, 32, 3) and int64 (N,)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    grey = np.rint(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8), 0..16 -> 0..255
    big = grey.repeat(UPSCALE, axis=1).repeat(UPSCALE, axis=2)
    images = np.repeat(big[..., None], 3, axis=3)
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    val = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        val[rng.permutation(members)[: round(VAL_FRACTION * len(members))]] = True
    return {"train": (images[~val], labels[~val]), "val": (images[val], labels[val])}


def write_digits(out_dir: str | os.PathLike, format: str) -> Path:
    """Write the shipped digits into ``out_dir`` in ``format`` (one of
    :data:`dlscale.data.FORMATS`); returns ``out_dir``."""
    splits = digits_splits()
    if format == "cifar_binary":
        return write_cifar_binary(out_dir, splits, DIGIT_CLASSES)
    if format == "image_folder":
        return write_image_folder(out_dir, splits, DIGIT_CLASSES)
    if format == "webdataset":
        return write_webdataset(out_dir, splits, DIGIT_CLASSES, SAMPLES_PER_SHARD)
    raise ValueError(f"unknown format {format!r}; allowed: {', '.join(FORMATS)}")


def sample_photos() -> tuple[list[str], list[np.ndarray], list[bytes]]:
    """scikit-learn's sample photos: names, the arrays scikit-learn decodes, the JPEG bytes."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images()
    names = [Path(f).stem for f in photos.filenames]
    return names, list(photos.images), [Path(f).read_bytes() for f in photos.filenames]


def write_photos(out_dir: str | os.PathLike, format: str) -> Path:
    """The two sample JPEGs as a two-class dataset (class = photo name, label 0 and 1), the
    same file in ``train`` and ``val``, kept as the original JPEG bytes; ``format``:
    ``image_folder`` or ``webdataset``."""
    names, images, jpegs = sample_photos()
    labels = np.arange(len(names))
    splits = {s: (np.stack(images), labels) for s in ("train", "val")}
    encoded = {s: [(data, ".jpg") for data in jpegs] for s in splits}
    if format == "image_folder":
        return write_image_folder(out_dir, splits, names, encoded)
    if format == "webdataset":
        return write_webdataset(out_dir, splits, names, encoded=encoded)
    raise ValueError(f"the photos are JPEGs: image_folder or webdataset, not {format!r}")


def write_digits_checked(out_dir: str | os.PathLike, format: str, log: str | os.PathLike) -> Path:
    """write_digits, then read back with inspect_dataset (rule shipped_digits): its
    description goes to `log`."""
    from dlscale.data import inspect_dataset

    write_digits(out_dir, format)
    info = inspect_dataset(out_dir, format)
    Path(log).write_text(f"wrote {info}\n")
    return Path(out_dir)
