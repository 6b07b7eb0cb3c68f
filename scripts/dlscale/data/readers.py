"""Framework-neutral readers of the dataset formats, and the rank shards of an epoch.

:func:`open_split` gives one split as a random-access sequence of ``(image, label)`` pairs:
``image`` a ``uint8`` array ``(H, W, C)`` (RGB, C = 3), ``label`` an ``int``. Every framework's
loader (``torch_data``, ``tf_data``, ``mxnet_data``) reads through these or through the
framework's own reader of the same files, so the same bytes give the same samples everywhere.

* cifar_binary: the record files are memory-mapped; a sample is one 3,073-byte record.
* image_folder: one file per sample, decoded with Pillow.
* webdataset: each tar shard is indexed once (its headers: the offset and size of every
  member), then a sample is one seek and read of its image member. :func:`iter_shards` streams
  whole shards instead (sequential reads, the way large studies read tar shards), a disjoint
  set of shards per rank and worker.

Images not of the dataset's ``image_shape`` (image_folder, webdataset) are resized, shorter
side first, then centre-cropped to it (bilinear); greyscale and RGBA become RGB.

Readers open their files lazily in each process (they can be pickled to DataLoader workers;
nothing is read at construction beyond the listings and the tar headers).
"""

from __future__ import annotations

import io
import math
import os
import random
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from dlscale.data import (
    CIFAR_RECORD_BYTES,
    IMAGE_SUFFIXES,
    LABEL_SUFFIX,
    DatasetInfo,
    cifar_files,
    image_folder_files,
    inspect_dataset,
    webdataset_index,
    webdataset_shards,
)

__all__ = [
    "open_split",
    "shard_indices",
    "split_order",
    "epoch_order",
    "eval_indices",
    "iter_shards",
    "assign_shards",
    "stream_samples",
    "decode_image",
    "CifarBinary",
    "ImageFolder",
    "WebDataset",
]

Sample = tuple[np.ndarray, int]


# ----------------------------------------------------------------------------- decoding
def decode_image(data: bytes | os.PathLike | str, shape: tuple[int, int, int]) -> np.ndarray:
    """Decode a JPEG/PNG (bytes or a path) to ``uint8 (H, W, 3)`` of ``shape``: converted to
    RGB, and if of another size resized (shorter side to the target's, bilinear) and
    centre-cropped."""
    from PIL import Image

    src = io.BytesIO(data) if isinstance(data, bytes) else data
    with Image.open(src) as im:
        im = im.convert("RGB")
        height, width = shape[0], shape[1]
        if im.size != (width, height):
            scale = max(width / im.width, height / im.height)
            size = (max(width, round(im.width * scale)), max(height, round(im.height * scale)))
            im = im.resize(size, Image.BILINEAR)
            left, top = (im.width - width) // 2, (im.height - height) // 2
            im = im.crop((left, top, left + width, top + height))
        return np.asarray(im, dtype=np.uint8)


# ----------------------------------------------------------------------------- the formats
class _Lazy(Sequence):
    """Open handles per process: dropped when pickled, reopened on first use."""

    _handles: dict | None = None
    _pid: int | None = None

    def _open(self) -> dict:
        if self._handles is None or self._pid != os.getpid():
            self._handles, self._pid = {}, os.getpid()
        return self._handles

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_handles", None)
        state.pop("_pid", None)
        return state


class CifarBinary(_Lazy):
    """The records of CIFAR-10 binary files, in file order."""

    def __init__(self, files: Sequence[str | os.PathLike]):
        self.files = [str(f) for f in files]
        counts = [os.path.getsize(f) // CIFAR_RECORD_BYTES for f in self.files]
        self.starts = np.cumsum([0, *counts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def records(self, file: int) -> np.ndarray:
        """The raw records of file number ``file``: ``uint8 (n, 3073)`` (memory-mapped)."""
        handles = self._open()
        if file not in handles:
            data = np.memmap(self.files[file], dtype=np.uint8, mode="r")
            handles[file] = data.reshape(-1, CIFAR_RECORD_BYTES)
        return handles[file]

    def record(self, index: int) -> bytes:
        """The 3,073 bytes of record ``index``."""
        file, row = self._locate(index)
        return self.records(file)[row].tobytes()

    def _locate(self, index: int) -> tuple[int, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"record {index} of {len(self)}")
        index %= len(self)
        file = int(np.searchsorted(self.starts, index, side="right")) - 1
        return file, index - int(self.starts[file])

    def __getitem__(self, index: int) -> Sample:
        file, row = self._locate(index)
        rec = self.records(file)[row]
        # 1 label byte, then the R, G and B planes, each 32 x 32 row-major: CHW -> HWC
        return np.ascontiguousarray(rec[1:].reshape(3, 32, 32).transpose(1, 2, 0)), int(rec[0])

    def labels(self) -> np.ndarray:
        """Every label, in order (reads only the label bytes' pages)."""
        return np.concatenate([self.records(i)[:, 0] for i in range(len(self.files))])


class ImageFolder(_Lazy):
    """Image files with their labels; decoded on access."""

    def __init__(self, items: Sequence[tuple[str | os.PathLike, int]], shape: tuple[int, ...]):
        self.items = [(str(p), int(label)) for p, label in items]
        self.shape = tuple(shape)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Sample:
        path, label = self.items[index]
        return decode_image(path, self.shape), label

    def labels(self) -> np.ndarray:
        return np.array([label for _, label in self.items], dtype=np.int64)


class WebDataset(_Lazy):
    """The samples of tar shards in the WebDataset layout, in shard and member order, read
    by offset (an index of every shard's headers is built at construction)."""

    def __init__(self, shards: Sequence[str | os.PathLike], shape: tuple[int, ...]):
        self.shards = [str(s) for s in shards]
        self.shape = tuple(shape)
        # (shard number, data offset, size, label) per sample
        self.index = [
            (i, member.offset_data, member.size, label)
            for i, shard in enumerate(self.shards)
            for _, member, label in webdataset_index(shard)
        ]

    def __len__(self) -> int:
        return len(self.index)

    def raw(self, index: int) -> tuple[bytes, int]:
        """The encoded image bytes and the label of sample ``index``."""
        shard, offset, size, label = self.index[index]
        handles = self._open()
        if shard not in handles:
            handles[shard] = open(self.shards[shard], "rb")  # noqa: SIM115 (kept open)
        fh = handles[shard]
        fh.seek(offset)
        return fh.read(size), label

    def __getitem__(self, index: int) -> Sample:
        data, label = self.raw(index)
        return decode_image(data, self.shape), label

    def labels(self) -> np.ndarray:
        return np.array([entry[3] for entry in self.index], dtype=np.int64)

    def shard_samples(self) -> list[int]:
        """Samples per shard, in shard order."""
        counts = [0] * len(self.shards)
        for shard, *_ in self.index:
            counts[shard] += 1
        return counts


def open_split(
    info_or_path: DatasetInfo | str | os.PathLike,
    split: str,
    shape: tuple[int, int, int] | None = None,
) -> CifarBinary | ImageFolder | WebDataset:
    """One split (``train`` or ``val``) of a dataset as a random-access sequence of
    ``(uint8 HWC image, int label)``.

    Args:
        info_or_path: A :class:`DatasetInfo`, or a dataset root (inspected first).
        split: ``train`` or ``val``.
        shape: ``(H, W, C)`` to bring image_folder and webdataset images to; default the
            dataset's ``image_shape``. CIFAR records are always 32x32x3.
    """
    info = info_or_path
    if not isinstance(info, DatasetInfo):
        info = inspect_dataset(info)
    shape = tuple(shape or info.image_shape)
    if info.format == "cifar_binary":
        return CifarBinary(cifar_files(info.path, split))
    if info.format == "image_folder":
        train_classes, _ = image_folder_files(info.path, "train")
        return ImageFolder(image_folder_files(info.path, split, train_classes)[1], shape)
    if info.format == "webdataset":
        return WebDataset(webdataset_shards(info.path, split), shape)
    raise ValueError(f"unknown format {info.format!r}")


# ----------------------------------------------------------------------------- rank shards
def epoch_order(num_samples: int, epoch: int, seed: int, shuffle: bool = True) -> list[int]:
    """The order of an epoch's samples before it is split over ranks: ``0..n-1``, or with
    ``shuffle`` a permutation drawn from ``seed + epoch`` (numpy's PCG64; the same on every
    rank, another each epoch). torch's DistributedSampler draws its permutation with
    torch.randperm from the same ``seed + epoch``; the split is the same (:func:`split_order`)."""
    if not shuffle:
        return list(range(num_samples))
    return np.random.default_rng(seed + epoch).permutation(num_samples).tolist()


def split_order(
    order: Sequence[int], rank: int, world_size: int, drop_last: bool = False
) -> list[int]:
    """Rank ``rank``'s share of an epoch's ``order``, as torch's DistributedSampler splits it:
    every rank gets the same count; without ``drop_last`` the order is padded by repeating its
    start to a multiple of ``world_size`` (a few samples twice), with ``drop_last`` its tail
    beyond the largest multiple is dropped; then rank r takes positions r, r + world_size, ..."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
    order = list(order)
    n = len(order)
    if drop_last and n % world_size:
        per_rank = math.ceil((n - world_size) / world_size)
    else:
        per_rank = math.ceil(n / world_size)
    total = per_rank * world_size
    if drop_last:
        order = order[:total]
    elif total > n and n:
        pad = total - n
        order += (order * math.ceil(pad / n))[:pad]
    return order[rank:total:world_size]


def shard_indices(
    num_samples: int,
    rank: int,
    world_size: int,
    epoch: int,
    seed: int,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[int]:
    """The sample indices rank ``rank`` reads in ``epoch``: the semantics of torch's
    ``DistributedSampler(dataset, world_size, rank, shuffle, seed, drop_last)`` after
    ``set_epoch(epoch)`` (identical indices without shuffle; with shuffle the permutation is
    numpy's, see :func:`epoch_order`). Over the ranks the shards are disjoint and cover the
    epoch (with ``drop_last`` less its last ``num_samples % world_size`` samples of the
    order; without, plus that many repeats)."""
    return split_order(epoch_order(num_samples, epoch, seed, shuffle), rank, world_size, drop_last)


def eval_indices(num_samples: int, rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s share of a validation pass: ``rank, rank + world_size, ...`` without
    padding, so the ranks' results add up to exactly one pass (counts differ by at most 1)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
    return list(range(rank, num_samples, world_size))


# ----------------------------------------------------------------------------- streaming
def assign_shards(
    num_shards: int, world_size: int, workers: int, epoch: int, seed: int, shuffle: bool = True
) -> list[list[int]]:
    """The shards of each reading unit (unit ``rank * workers + worker`` of ``world_size *
    workers``) in an epoch: the shard numbers, shuffled with ``seed + epoch`` (the same on
    every rank) when ``shuffle``, dealt round-robin. Disjoint; together every shard once."""
    units = world_size * workers
    if num_shards < units:
        raise ValueError(
            f"{num_shards} shards cannot feed {world_size} ranks x {workers} workers; "
            f"write at least {units} shards"
        )
    order = list(range(num_shards))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    return [order[u::units] for u in range(units)]


def stream_samples(shard: str | os.PathLike) -> Iterator[tuple[str, bytes, int]]:
    """``(key, encoded image, label)`` of one tar shard, read strictly sequentially (tar
    stream mode: no seek, no header pre-scan); a sample's members must be consecutive, as
    WebDataset writers put them."""
    key, parts = None, {}

    def sample():
        image = next((parts[s] for s in IMAGE_SUFFIXES if s in parts), None)
        if image is None or LABEL_SUFFIX not in parts:
            raise ValueError(f"sample {key!r} in {Path(shard).name} lacks an image or a label")
        return key, image, int(parts[LABEL_SUFFIX].strip())

    with tarfile.open(shard, "r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, base = os.path.split(member.name)
            stem, dot, ext = base.partition(".")
            if not (dot and stem):
                continue
            this = os.path.join(folder, stem)
            if this != key and parts:
                yield sample()
                parts = {}
            key = this
            parts["." + ext.lower()] = tar.extractfile(member).read()
    if parts:
        yield sample()


def iter_shards(
    shards: Sequence[str | os.PathLike],
    shape: tuple[int, int, int],
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    workers: int = 1,
    epoch: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    buffer: int = 256,
    limit: int | None = None,
) -> Iterator[Sample]:
    """Stream the samples of tar shards, the shards of unit ``rank * workers + worker``
    (:func:`assign_shards`) read sequentially one after the other, the samples shuffled
    within a window of ``buffer`` (deterministic per epoch and unit) when ``shuffle``; at
    most ``limit`` samples (units get unequal counts unless shards are equal: a limit equal
    for every unit gives every rank the same number of steps)."""
    shards = [str(s) for s in shards]
    unit = rank * workers + worker
    mine = [
        shards[i]
        for i in assign_shards(len(shards), world_size, workers, epoch, seed, shuffle)[unit]
    ]
    rng = random.Random((seed + epoch) * 1_000_003 + unit)
    limit = float("inf") if limit is None else limit
    given = 0

    def decoded():
        for shard in mine:
            for _key, data, label in stream_samples(shard):
                yield decode_image(data, shape), label

    pool: list[Sample] = []
    for sample in decoded():
        if given >= limit:
            return
        if not shuffle:
            given += 1
            yield sample
            continue
        pool.append(sample)
        if len(pool) >= buffer:
            given += 1
            yield pool.pop(rng.randrange(len(pool)))
    rng.shuffle(pool)
    for sample in pool:
        if given >= limit:
            return
        given += 1
        yield sample
