"""Datasets on disk: their layouts, and the check that a configured path holds one.

A dataset root holds a training part and a validation part in one of :data:`FORMATS`:

``cifar_binary``
    The CIFAR-10 binary layout: ``data_batch_*.bin`` (training) and ``test_batch.bin``
    (validation), each a run of 3,073-byte records: 1 label byte, then the 32x32 image as
    1,024 red, 1,024 green and 1,024 blue bytes, each plane row-major. Optional
    ``batches.meta.txt``: one class name per line (its line count is the class count).
``image_folder``
    ImageNet style: ``train/<class>/<image>`` and ``val/<class>/<image>``, images
    ``.jpg``/``.jpeg``/``.png`` (any case). Labels are the class folders of ``train/`` in sorted
    order (0, 1, ...); ``val/`` may only use those classes.
``webdataset``
    Tar shards in the WebDataset layout: ``train-000000.tar``, ``train-000001.tar``, ... and
    ``val-*.tar``; a sample is the members sharing a key (the name up to its first dot):
    ``<key>.png`` / ``<key>.jpg`` / ``<key>.jpeg`` (the image) and ``<key>.cls`` (the label as
    ASCII digits). Optional ``classes.txt``: one class name per line.

This module is imported when the workflow is parsed: it needs only the standard library and
numpy (Pillow is imported inside :func:`inspect_dataset` to read one image header, never at
import). The readers are in :mod:`dlscale.data.readers`, the framework loaders in
``torch_data``, ``tf_data`` and ``mxnet_data`` (each importable in its own environment).
"""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlscale.registry.formats import FORMATS
from dlscale.study.errors import ConfigError

__all__ = [
    "FORMATS",
    "SPLITS",
    "DatasetInfo",
    "inspect_dataset",
    "cifar_files",
    "image_folder_files",
    "webdataset_shards",
]

#: The on-disk formats a study can point at (docs/pages/datasets.md): dlscale.registry.formats.
#: The two parts of every dataset root.
SPLITS = ("train", "val")

#: CIFAR-10 binary record: 1 label byte + 3 x 32 x 32 image bytes (channel planes, row-major).
CIFAR_SHAPE = (32, 32, 3)
CIFAR_RECORD_BYTES = 1 + 32 * 32 * 3
CIFAR_META = "batches.meta.txt"
#: Image file suffixes of image_folder and webdataset (compared in lower case).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
#: Optional class names of a webdataset root, one per line.
WEBDATASET_CLASSES = "classes.txt"
LABEL_SUFFIX = ".cls"

_BATCH = re.compile(r"^data_batch_(\d+)\.bin$")
_SHARD = {split: re.compile(rf"^{split}-(\d+)\.tar$") for split in SPLITS}


@dataclass(frozen=True)
class DatasetInfo:
    """A validated dataset root.

    Attributes:
        path: The root, absolute.
        format: One of :data:`FORMATS`.
        num_classes: Number of classes (labels are 0 .. num_classes - 1).
        train_samples: Samples in the training part.
        val_samples: Samples in the validation part.
        image_shape: ``(H, W, C)`` of the images the readers return: CIFAR's 32x32x3; for
            image_folder and webdataset that of the first training image (readers bring
            other sizes to it, see :mod:`dlscale.data.readers`), always 3 channels (RGB).
        class_names: One name per label where the dataset names them (image_folder's class
            folders, ``batches.meta.txt``, ``classes.txt``), else ``()``.
    """

    path: str
    format: str
    num_classes: int
    train_samples: int
    val_samples: int
    image_shape: tuple[int, int, int]
    class_names: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        """Plain JSON-able values (e.g. for a cell's JSON handed to its ranks)."""
        return {
            "path": self.path,
            "format": self.format,
            "num_classes": self.num_classes,
            "train_samples": self.train_samples,
            "val_samples": self.val_samples,
            "image_shape": list(self.image_shape),
            "class_names": list(self.class_names),
        }

    @classmethod
    def from_dict(cls, value: dict) -> DatasetInfo:
        """The inverse of :meth:`to_dict` (no file is read: inspect once, hand it on)."""
        return cls(
            str(value["path"]),
            str(value["format"]),
            int(value["num_classes"]),
            int(value["train_samples"]),
            int(value["val_samples"]),
            tuple(int(v) for v in value["image_shape"]),
            tuple(str(v) for v in value.get("class_names", ())),
        )

    def samples(self, split: str) -> int:
        """Samples in ``split`` (``train`` or ``val``)."""
        return {"train": self.train_samples, "val": self.val_samples}[_split(split)]


class _Problem(Exception):
    """One thing wrong with a dataset root (becomes a ConfigError naming key and path)."""


def _split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
    return split


# ----------------------------------------------------------------------------- file listings
def cifar_files(root: str | os.PathLike, split: str) -> list[Path]:
    """The record files of a cifar_binary split: ``data_batch_<n>.bin`` by n, or
    ``test_batch.bin``."""
    root = Path(root)
    if _split(split) == "val":
        return [root / "test_batch.bin"] if (root / "test_batch.bin").is_file() else []
    found = [(int(m.group(1)), e.name) for e in os.scandir(root) if (m := _BATCH.match(e.name))]
    return [root / name for _, name in sorted(found)]


def image_folder_files(
    root: str | os.PathLike, split: str, classes: tuple[str, ...] | None = None
) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """The class names and ``(image file, label)`` pairs of an image_folder split, sorted by
    class then file name. Labels index ``classes`` (default: the split's own class folders,
    sorted); a class folder not in ``classes`` raises _Problem."""
    base = Path(root) / _split(split)
    folders = sorted(e.name for e in os.scandir(base) if e.is_dir())
    classes = tuple(folders) if classes is None else classes
    index = {name: i for i, name in enumerate(classes)}
    unknown = [f for f in folders if f not in index]
    if unknown:
        raise _Problem(
            f"{split}/ has class folders that train/ does not have: {', '.join(unknown[:5])}"
        )
    items = []
    for name in folders:
        files = sorted(
            e.name
            for e in os.scandir(base / name)
            if e.is_file() and os.path.splitext(e.name)[1].lower() in IMAGE_SUFFIXES
        )
        items += [(base / name / f, index[name]) for f in files]
    return classes, items


def webdataset_shards(root: str | os.PathLike, split: str) -> list[Path]:
    """The tar shards of a webdataset split, ``<split>-<n>.tar`` by n."""
    pattern = _SHARD[_split(split)]
    found = [(int(m.group(1)), e.name) for e in os.scandir(root) if (m := pattern.match(e.name))]
    return [Path(root) / name for _, name in sorted(found)]


def webdataset_index(shard: str | os.PathLike) -> list[tuple[str, tarfile.TarInfo, int]]:
    """The samples of one tar shard in file order: ``(key, image member, label)``. Reads the
    tar headers and the small ``.cls`` members only. Raises _Problem for a sample without an
    image or a label, or a label that is not a non-negative integer."""
    samples: dict[str, dict[str, tarfile.TarInfo]] = {}
    with tarfile.open(shard, "r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, base = os.path.split(member.name)
            stem, dot, ext = base.partition(".")  # WebDataset: the key ends at the first dot
            if dot and stem:
                samples.setdefault(os.path.join(folder, stem), {})["." + ext.lower()] = member
        out = []
        for key, parts in samples.items():
            image = next((parts[s] for s in IMAGE_SUFFIXES if s in parts), None)
            if image is None or LABEL_SUFFIX not in parts:
                missing = "image (.png/.jpg/.jpeg)" if image is None else "label (.cls)"
                raise _Problem(f"sample {key!r} in {Path(shard).name} has no {missing}")
            text = tar.extractfile(parts[LABEL_SUFFIX]).read().strip()
            if not text.isdigit():
                raise _Problem(
                    f"sample {key!r} in {Path(shard).name}: label {text[:20]!r} is not an integer"
                )
            out.append((key, image, int(text)))
    return out


def _names_file(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        return ()
    return tuple(line.strip() for line in path.read_text().splitlines() if line.strip())


# ----------------------------------------------------------------------------- inspection
def _detect(root: Path) -> list[str]:
    names = set(os.listdir(root))
    found = []
    if "test_batch.bin" in names or any(_BATCH.match(n) for n in names):
        found.append("cifar_binary")
    if (root / "train").is_dir() or (root / "val").is_dir():
        found.append("image_folder")
    if any(_SHARD["train"].match(n) or _SHARD["val"].match(n) for n in names):
        found.append("webdataset")
    return found


LAYOUTS = (
    "cifar_binary: data_batch_*.bin + test_batch.bin; "
    "image_folder: train/<class>/*.jpg|png + val/<class>/...; "
    "webdataset: train-NNNNNN.tar + val-NNNNNN.tar shards of <key>.png|jpg + <key>.cls"
)


def _inspect_cifar(root: Path) -> DatasetInfo:
    names = _names_file(root / CIFAR_META)
    counts, top = {}, -1
    for split in SPLITS:
        files = cifar_files(root, split)
        if not files:
            want = "data_batch_*.bin" if split == "train" else "test_batch.bin"
            raise _Problem(f"the {split} part is empty: no {want}")
        counts[split] = 0
        for f in files:
            size = f.stat().st_size
            if size == 0 or size % CIFAR_RECORD_BYTES:
                raise _Problem(
                    f"{f.name} is {size} bytes, not a positive multiple of the "
                    f"{CIFAR_RECORD_BYTES}-byte CIFAR-10 record (1 label + 3,072 image bytes)"
                )
            labels = np.memmap(f, dtype=np.uint8, mode="r").reshape(-1, CIFAR_RECORD_BYTES)[:, 0]
            counts[split] += len(labels)
            top = max(top, int(labels.max()))
    if names and top >= len(names):
        raise _Problem(f"label {top} found but {CIFAR_META} names {len(names)} classes")
    classes = len(names) or top + 1
    return DatasetInfo(
        str(root), "cifar_binary", classes, counts["train"], counts["val"], CIFAR_SHAPE, names
    )


def _first_image_shape(path: Path) -> tuple[int, int, int]:
    from PIL import Image  # only here: the module stays importable without Pillow

    try:
        with Image.open(path) as im:
            return (im.height, im.width, 3)
    except OSError as exc:
        raise _Problem(f"{path} is not a readable image ({exc})") from None


def _inspect_image_folder(root: Path) -> DatasetInfo:
    for split in SPLITS:
        if not (root / split).is_dir():
            raise _Problem(f"the {split} part is missing: no {split}/ folder")
    classes, train = image_folder_files(root, "train")
    if not train:
        raise _Problem("the train part is empty: no .jpg/.jpeg/.png under train/<class>/")
    present = {label for _, label in train}
    empty = [name for i, name in enumerate(classes) if i not in present]
    if empty:
        raise _Problem(f"train/ class folders without images: {', '.join(empty[:5])}")
    _, val = image_folder_files(root, "val", classes)
    if not val:
        raise _Problem("the val part is empty: no .jpg/.jpeg/.png under val/<class>/")
    shape = _first_image_shape(train[0][0])
    return DatasetInfo(
        str(root), "image_folder", len(classes), len(train), len(val), shape, classes
    )


def _inspect_webdataset(root: Path) -> DatasetInfo:
    names = _names_file(root / WEBDATASET_CLASSES)
    counts, top, first = {}, -1, None
    for split in SPLITS:
        shards = webdataset_shards(root, split)
        samples = 0
        for shard in shards:
            try:
                index = webdataset_index(shard)
            except tarfile.TarError as exc:
                raise _Problem(f"{shard.name} is not a readable tar file ({exc})") from None
            samples += len(index)
            if index:
                top = max(top, max(label for _, _, label in index))
                first = first or (shard, index[0][1])
        if not samples:
            raise _Problem(f"the {split} part is empty: no samples in {split}-*.tar shards")
        counts[split] = samples
    if names and top >= len(names):
        raise _Problem(f"label {top} found but {WEBDATASET_CLASSES} names {len(names)} classes")
    shard, member = first
    from PIL import Image

    with tarfile.open(shard, "r:") as tar, Image.open(tar.extractfile(member)) as im:
        shape = (im.height, im.width, 3)
    return DatasetInfo(
        str(root), "webdataset", len(names) or top + 1, counts["train"], counts["val"], shape, names
    )


_INSPECT = {
    "cifar_binary": _inspect_cifar,
    "image_folder": _inspect_image_folder,
    "webdataset": _inspect_webdataset,
}


def inspect_dataset(
    path: str | os.PathLike,
    format: str | None = None,
    key: str = "dataset",
    num_classes: int | None = None,
) -> DatasetInfo:
    """Check that ``path`` is a readable dataset root in ``format`` (detected when ``None``)
    and describe it.

    Args:
        path: The dataset root.
        format: One of :data:`FORMATS`, or ``None`` to detect it from the files.
        key: The configuration key that gave ``path``, named in every message.
        num_classes: The class count the study expects; ``None``: any (at least 2).

    Raises:
        ConfigError: naming ``key``, the path, what is wrong and the allowed formats: a
            missing or unreadable path, an unknown format or layout (or several layouts at
            once), malformed files, an empty part, a wrong class count.
    """
    root = Path(os.path.abspath(os.fspath(path)))

    def fail(what: str) -> ConfigError:
        return ConfigError(
            key,
            [
                f"{key}: dataset {str(root)!r}: {what} "
                f"(allowed formats: {', '.join(FORMATS)}; layouts: {LAYOUTS}; "
                "see docs/pages/datasets.md)"
            ],
        )

    if format is not None and format not in FORMATS:
        raise fail(f"unknown format {format!r}")
    if not root.exists():
        raise fail("does not exist")
    if not root.is_dir():
        raise fail("is not a directory")
    if not os.access(root, os.R_OK | os.X_OK):
        raise fail("is not readable (permission denied)")
    try:
        if format is None:
            found = _detect(root)
            if not found:
                raise _Problem("no known layout found")
            if len(found) > 1:
                raise _Problem(
                    f"several layouts found ({', '.join(found)}); name the format to use"
                )
            format = found[0]
        info = _INSPECT[format](root)
    except _Problem as exc:
        raise fail(f"as {format or 'any format'}: {exc}") from None
    except PermissionError as exc:
        raise fail(f"is not readable: {exc.filename}: permission denied") from None
    except OSError as exc:
        raise fail(f"cannot be read: {exc}") from None
    if num_classes is not None and info.num_classes != num_classes:
        raise fail(f"has {info.num_classes} classes, the study expects {num_classes}")
    if info.num_classes < 2:
        raise fail(f"has {info.num_classes} class(es); a classification dataset needs >= 2")
    return info
