"""Write labelled images into each dataset format (the layouts of :mod:`dlscale.data`).

Used by :mod:`dlscale.data.shipped` for the shipped digits; also a way to convert a user's
own arrays. Output is deterministic: the same images give the same bytes (PNG with fixed
settings, tar members with fixed times, owners and modes, sorted order).
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dlscale.data import CIFAR_META, CIFAR_RECORD_BYTES, LABEL_SUFFIX, WEBDATASET_CLASSES

__all__ = ["cifar_record", "write_cifar_binary", "write_image_folder", "write_webdataset"]

#: The splits a writer takes: name -> (images uint8 (N, H, W, 3), labels (N,)).
Splits = dict[str, tuple[np.ndarray, np.ndarray]]


def cifar_record(image: np.ndarray, label: int) -> bytes:
    """One CIFAR-10 binary record: the label byte, then the R, G and B planes of a
    ``uint8 (32, 32, 3)`` image, each row-major."""
    image = np.asarray(image)
    if image.shape != (32, 32, 3) or image.dtype != np.uint8:
        raise ValueError(f"a CIFAR record holds uint8 (32, 32, 3), not {image.dtype} {image.shape}")
    if not 0 <= int(label) <= 255:
        raise ValueError(f"a CIFAR label is one byte, not {label}")
    return bytes([int(label)]) + image.transpose(2, 0, 1).tobytes()


def encode_png(image: np.ndarray) -> bytes:
    """Lossless PNG bytes of a ``uint8 (H, W, 3)`` image (fixed settings: deterministic)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image), "RGB").save(out, "PNG", compress_level=6)
    return out.getvalue()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def write_cifar_binary(
    out_dir: str | os.PathLike,
    splits: Splits,
    class_names: Sequence[str] = (),
    train_batches: int = 5,
) -> Path:
    """``data_batch_1..N.bin`` (the train split in ``train_batches`` near-equal files, as
    CIFAR-10's five), ``test_batch.bin`` (val) and, with ``class_names``,
    ``batches.meta.txt``."""
    out = Path(out_dir)
    for split, (images, labels) in splits.items():
        records = b"".join(cifar_record(im, lab) for im, lab in zip(images, labels))
        assert len(records) == len(labels) * CIFAR_RECORD_BYTES
        if split == "val":
            _write(out / "test_batch.bin", records)
            continue
        bounds = np.linspace(0, len(labels), train_batches + 1).round().astype(int)
        for i in range(train_batches):
            lo, hi = bounds[i] * CIFAR_RECORD_BYTES, bounds[i + 1] * CIFAR_RECORD_BYTES
            _write(out / f"data_batch_{i + 1}.bin", records[lo:hi])
    if class_names:
        _write(out / CIFAR_META, ("\n".join(class_names) + "\n").encode())
    return out


def write_image_folder(
    out_dir: str | os.PathLike,
    splits: Splits,
    class_names: Sequence[str],
    encoded: dict[str, Sequence[tuple[bytes, str]]] | None = None,
) -> Path:
    """``<split>/<class name>/<split>_<n>.png`` per image (n: its position in the split,
    6 digits), lossless PNG. ``encoded``: per split, already-encoded files ``(bytes,
    suffix)`` written instead of the PNGs, one per label (e.g. JPEG photos kept as JPEG)."""
    out = Path(out_dir)
    for split, (images, labels) in splits.items():
        files = (encoded or {}).get(split)
        for n, label in enumerate(labels):
            data, suffix = files[n] if files else (encode_png(images[n]), ".png")
            _write(out / split / class_names[label] / f"{split}_{n:06d}{suffix}", data)
    return out


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def write_webdataset(
    out_dir: str | os.PathLike,
    splits: Splits,
    class_names: Sequence[str] = (),
    samples_per_shard: int = 256,
    encoded: dict[str, Sequence[tuple[bytes, str]]] | None = None,
) -> Path:
    """``<split>-000000.tar``, ``<split>-000001.tar``, ... holding ``samples_per_shard``
    samples each (the last shard the rest): ``<split>_<n>.png`` + ``<split>_<n>.cls`` per
    sample (n: its position in the split), in split order; ``classes.txt`` with
    ``class_names``. ``encoded``: as in :func:`write_image_folder` (bytes replace the PNG)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, (images, labels) in splits.items():
        files = (encoded or {}).get(split)
        for shard, start in enumerate(range(0, len(labels), samples_per_shard)):
            with tarfile.open(
                out / f"{split}-{shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT
            ) as tar:
                for n in range(start, min(start + samples_per_shard, len(labels))):
                    key = f"{split}_{n:06d}"
                    data, suffix = files[n] if files else (encode_png(images[n]), ".png")
                    _tar_member(tar, key + suffix, data)
                    _tar_member(tar, key + LABEL_SUFFIX, str(int(labels[n])).encode())
    if class_names:
        _write(out / WEBDATASET_CLASSES, ("\n".join(class_names) + "\n").encode())
    return out
