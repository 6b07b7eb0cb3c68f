"""PyTorch loaders of the dataset formats (PyTorch DDP and Horovod; torch environments only).

:func:`make_loader` gives a rank its ``DataLoader`` over one split:

* training: torch's ``DistributedSampler`` (shuffled from ``seed + epoch``, every rank the same
  number of samples, padded by repeats, see :func:`dlscale.data.readers.shard_indices`) and
  whole batches only (the last partial batch of a rank is dropped), so every rank takes the
  same number of equal steps. Call ``sampler.set_epoch(epoch)`` before each epoch's
  iteration, as with any DistributedSampler, or every epoch repeats the first one's order::

      loader, sampler = make_loader(info, "train", rank, world_size, per_rank_batch)
      for epoch in range(epochs):
          sampler.set_epoch(epoch)
          for images, labels in loader: ...

* validation: rank r reads samples r, r + world_size, ... (no padding, no shuffle, partial
  last batch kept), so the ranks' correct counts sum to exactly one pass over ``val``.

Batches are ``float32 (N, C, H, W)`` images scaled to [-1, 1] (``(x / 255 - 0.5) / 0.5``: the
fixed :data:`MEAN` and :data:`STD` for every dataset and channel, not statistics of the data)
and ``int64 (N,)`` labels. Workers (``workers``, persistent across epochs) read and decode;
the batch is converted in one vectorised step in the worker (collate). Pinned memory by
default when CUDA is present.

webdataset training with ``stream=True``: whole shards read sequentially and dealt to the
ranks' workers (:class:`ShardStream`, the WebDataset way) instead of sample by sample.

Horovod uses the same loader with Horovod's rank and size:
``make_loader(info, "train", hvd.rank(), hvd.size(), per_rank_batch)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    Sampler,
    get_worker_info,
)

from dlscale.data import DatasetInfo, webdataset_shards
from dlscale.data.readers import WebDataset, assign_shards, eval_indices, iter_shards, open_split

__all__ = ["MEAN", "STD", "SplitDataset", "EvalSampler", "ShardStream", "collate", "make_loader"]

#: Per-channel normalisation of every dataset, on the [0, 1] scale: x -> (x - MEAN) / STD.
MEAN = 0.5
STD = 0.5


class SplitDataset(Dataset):
    """A reader of :func:`open_split` as a torch map-style dataset of (uint8 HWC, label)."""

    def __init__(self, reader: Sequence):
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int):
        return self.reader[index]


class EvalSampler(Sampler[int]):
    """Rank ``rank``'s unpadded share of a validation pass (:func:`readers.eval_indices`)."""

    def __init__(self, num_samples: int, rank: int, world_size: int):
        self.indices = eval_indices(num_samples, rank, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)

    def set_epoch(self, epoch: int) -> None:
        """Validation order does not change with the epoch (kept for the same call)."""


class ShardStream(IterableDataset):
    """A webdataset split streamed shard by shard (:func:`readers.iter_shards`): each epoch
    the shards are dealt to this rank's ``workers`` reading units (:func:`assign_shards`,
    disjoint over all ranks' units) and every unit yields the same number of samples, the
    smallest unit's count, so every rank takes the same number of steps (the samples beyond
    it in larger units are left out of that epoch; equal shards leave out none). Call
    :meth:`set_epoch` before each epoch, as with a DistributedSampler."""

    def __init__(
        self,
        info: DatasetInfo,
        split: str,
        rank: int,
        world_size: int,
        workers: int,
        seed: int,
        shape: tuple[int, int, int],
        shuffle: bool = True,
    ):
        self.shards = [str(s) for s in webdataset_shards(info.path, split)]
        self.counts = WebDataset(self.shards, shape).shard_samples()
        self.rank, self.world_size, self.units = rank, world_size, max(1, workers)
        self.seed, self.shape, self.shuffle, self.epoch = seed, shape, shuffle, 0
        self.per_unit()  # refuses too few shards now, not in a worker

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def per_unit(self) -> int:
        """Samples each reading unit yields this epoch."""
        units = assign_shards(
            len(self.shards), self.world_size, self.units, self.epoch, self.seed, self.shuffle
        )
        return min(sum(self.counts[i] for i in unit) for unit in units)

    def __len__(self) -> int:
        return self.per_unit() * self.units

    def __iter__(self):
        worker = get_worker_info()
        return iter_shards(
            self.shards,
            self.shape,
            self.rank,
            self.world_size,
            worker.id if worker else 0,
            self.units,
            self.epoch,
            self.seed,
            self.shuffle,
            limit=self.per_unit(),
        )


def collate(batch: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 HWC image, label) pairs -> normalised float32 NCHW images, int64 labels."""
    images = torch.from_numpy(np.stack([image for image, _ in batch]))
    images = images.permute(0, 3, 1, 2).to(torch.float32).contiguous()
    images.mul_(1 / (255 * STD)).sub_(MEAN / STD)
    return images, torch.tensor([label for _, label in batch], dtype=torch.int64)


def make_loader(
    info: DatasetInfo,
    split: str,
    rank: int,
    world_size: int,
    batch_size: int,
    *,
    workers: int = 2,
    pin_memory: bool | None = None,
    seed: int = 0,
    train: bool = True,
    shape: tuple[int, int, int] | None = None,
    stream: bool = False,
) -> tuple[DataLoader, DistributedSampler | EvalSampler | ShardStream]:
    """The DataLoader of rank ``rank`` of ``world_size`` over ``split`` and its sampler.

    Args:
        info: The dataset (:func:`dlscale.data.inspect_dataset`).
        split: ``train`` or ``val``.
        batch_size: Samples per batch of this rank (the per-rank batch).
        workers: Loader worker processes (0: read in the calling process).
        pin_memory: Page-locked batches for fast host-to-GPU copies; ``None``: when CUDA is
            available.
        seed: Shuffle seed (the same on every rank).
        train: Training order (DistributedSampler, shuffled, whole batches) or validation
            order (:class:`EvalSampler`), see the module docstring.
        shape: ``(H, W, C)`` for image_folder and webdataset images; default the dataset's.
        stream: webdataset training only: read whole shards sequentially, dealt to ranks and
            workers (:class:`ShardStream`, returned as the sampler: ``set_epoch`` it) instead
            of by sample through the shard index and the DistributedSampler. Needs at least
            ``world_size x max(1, workers)`` shards.
    """
    if stream:
        if info.format != "webdataset" or not train:
            raise ValueError("stream=True reads webdataset shards for training only")
        dataset = ShardStream(
            info, split, rank, world_size, workers, seed, tuple(shape or info.image_shape)
        )
        loader = DataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=collate,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
            drop_last=True,
        )  # workers restart each epoch: they must see the epoch set_epoch gave the dataset
        return loader, dataset
    dataset = SplitDataset(open_split(info, split, shape))
    if train:
        sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed
        )
    else:
        sampler = EvalSampler(len(dataset), rank, world_size)
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        collate_fn=collate,
        pin_memory=pin_memory,
        drop_last=train,
        persistent_workers=workers > 0,
    )
    if len(loader) == 0:
        raise ValueError(
            f"rank {rank} of {world_size} has {len(sampler)} {split} samples, fewer than one "
            f"batch of {batch_size}: use a smaller per-rank batch or fewer ranks"
        )
    return loader, sampler
