"""Loader-only measurement: the input pipeline of one rank without the model.

:func:`measure_loader` iterates a loader (a torch DataLoader, a tf.data dataset, a gluon
DataLoader: anything iterable over ``(images, labels)`` batches) and times the wait for each
batch. Compared with the training step throughput of the same cell it says whether the input
pipeline limits throughput: :func:`input_bound` (a cell is input-bound when the loader alone
delivers less than ``margin`` times what the training step consumes).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator

# the loader / train ratio below which a cell is input-bound (3)
from dlscale.study.protocol import INPUT_BOUND_MARGIN

__all__ = ["measure_loader", "input_bound", "INPUT_BOUND_MARGIN"]


def _batch_size(batch) -> int:
    images = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape = getattr(images, "shape", None)
    return int(shape[0]) if shape is not None else len(images)


def _batches(loader: Iterable) -> Iterator:
    """The loader's batches, starting a new pass (epoch) when one ends."""
    epoch = 0
    while True:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise ValueError("the loader yields no batches")
        epoch += 1


def measure_loader(
    loader: Iterable,
    warmup_batches: int = 5,
    batches: int = 50,
    max_seconds: float | None = None,
) -> dict:
    """Time ``batches`` batches of ``loader`` after ``warmup_batches`` untimed ones (worker
    start-up, first reads). A pass that ends is restarted (``set_epoch`` when the loader has
    a sampler with it). With ``max_seconds``, timing stops after the first batch that ends
    past it (at least one batch is timed): ``batches`` in the result says how many were.

    Returns:
        ``samples_per_s`` (timed samples / timed seconds, this rank), ``batches``,
        ``samples``, ``seconds``, ``median_batch_s``, ``min_batch_s``, ``max_batch_s``,
        ``p90_batch_s`` and ``warmup_batches``.
    """
    if batches < 1 or warmup_batches < 0:
        raise ValueError(
            f"batches must be >= 1 and warmup_batches >= 0, not {batches}, {warmup_batches}"
        )
    it = _batches(loader)
    for _ in range(warmup_batches):
        next(it)
    times, samples = [], 0
    start = last = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        now = time.perf_counter()
        times.append(now - last)
        last = now
        samples += _batch_size(batch)
        if max_seconds is not None and now - start >= max_seconds:
            break
    it.close()  # ends the abandoned pass (a DataLoader iterator and its prefetches)
    seconds = last - start
    ordered = sorted(times)
    return {
        "samples_per_s": samples / seconds if seconds > 0 else float("inf"),
        "batches": len(times),
        "samples": samples,
        "seconds": seconds,
        "median_batch_s": statistics.median(times),
        "min_batch_s": ordered[0],
        "max_batch_s": ordered[-1],
        "p90_batch_s": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
        "warmup_batches": warmup_batches,
    }


def input_bound(
    loader_samples_per_s: float, step_samples_per_s: float, margin: float = INPUT_BOUND_MARGIN
) -> bool:
    """True when the loader alone delivers less than ``margin`` x the training step
    throughput (both per rank): the input pipeline may limit the cell."""
    return loader_samples_per_s < margin * step_samples_per_s
