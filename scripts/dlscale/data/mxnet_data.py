"""Gluon loaders of the dataset formats (MXNet; .venvs/mxnet only).

:func:`make_loader` gives rank ``rank`` of ``world_size`` (the kvstore's ``rank`` and
``num_workers``) a ``gluon.data.DataLoader`` over one split, read by the neutral readers
(:func:`dlscale.data.readers.open_split`) with the rank's indices from
:func:`dlscale.data.readers.shard_indices`: the semantics of torch's DistributedSampler
(shuffled from ``seed + epoch``, every rank the same count, padded by repeats; whole batches
only). Call ``sampler.set_epoch(epoch)`` before each epoch, as in the torch loader.
Validation: rank r reads samples r, r + world_size, ... (:func:`readers.eval_indices`), every
sample once, last batch partial.

Batches: ``float32 (N, C, H, W)`` NDArrays (as the Gluon models) scaled to [-1, 1] with the
fixed mean 0.5 and std 0.5 of :mod:`dlscale.data.torch_data`, and ``float32 (N,)`` labels
(Gluon's loss functions take float labels).
"""

from __future__ import annotations

import mxnet as mx
import numpy as np
from mxnet import gluon

from dlscale.data import DatasetInfo
from dlscale.data.readers import eval_indices, open_split, shard_indices

__all__ = ["MEAN", "STD", "RankSampler", "SplitDataset", "batchify", "make_loader"]

MEAN = 0.5
STD = 0.5


class SplitDataset(gluon.data.Dataset):
    """A reader of :func:`open_split` as a Gluon dataset of (uint8 HWC, label)."""

    def __init__(self, reader):
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int):
        return self.reader[index]


class RankSampler(gluon.data.Sampler):
    """This rank's indices of an epoch (:func:`shard_indices`) or of a validation pass."""

    def __init__(self, num_samples: int, rank: int, world_size: int, seed: int, train: bool):
        self.num_samples, self.rank, self.world_size = num_samples, rank, world_size
        self.seed, self.train, self.epoch = seed, train, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _indices(self) -> list[int]:
        if not self.train:
            return eval_indices(self.num_samples, self.rank, self.world_size)
        return shard_indices(self.num_samples, self.rank, self.world_size, self.epoch, self.seed)

    def __iter__(self):
        return iter(self._indices())

    def __len__(self) -> int:
        return len(self._indices())


def batchify(samples):
    """(uint8 HWC image, label) pairs -> normalised float32 NCHW NDArray, float32 labels."""
    images = np.stack([image for image, _ in samples]).transpose(0, 3, 1, 2).astype(np.float32)
    images = images * (1 / (255 * STD)) - MEAN / STD
    labels = np.array([label for _, label in samples], dtype=np.float32)
    return mx.nd.array(images, dtype=np.float32), mx.nd.array(labels, dtype=np.float32)


def make_loader(
    info: DatasetInfo,
    split: str,
    rank: int,
    world_size: int,
    batch_size: int,
    *,
    workers: int = 2,
    seed: int = 0,
    train: bool = True,
    shape: tuple[int, int, int] | None = None,
) -> tuple[gluon.data.DataLoader, RankSampler]:
    """Rank ``rank``'s Gluon DataLoader over ``split`` and its sampler (module docstring).
    ``workers``: Gluon's worker processes (0: read in the calling process)."""
    dataset = SplitDataset(open_split(info, split, shape))
    sampler = RankSampler(len(dataset), rank, world_size, seed, train)
    batches = gluon.data.BatchSampler(sampler, batch_size, "discard" if train else "keep")
    if len(batches) == 0:
        raise ValueError(
            f"rank {rank} of {world_size} has {len(sampler)} {split} samples, fewer than one "
            f"batch of {batch_size}: use a smaller per-rank batch or fewer ranks"
        )
    loader = gluon.data.DataLoader(
        dataset, batch_sampler=batches, batchify_fn=batchify, num_workers=workers
    )
    return loader, sampler
