"""tf.data input pipelines of the dataset formats (TensorFlow and Keras; .venvs/tensorflow only).

:func:`make_dataset` gives rank ``rank`` of ``world_size`` its ``tf.data.Dataset`` of one split:

* cifar_binary: ``tf.data.FixedLengthRecordDataset`` over the record files (3,073-byte records),
  decoded in TensorFlow (label byte, CHW planes -> HWC);
* image_folder: the file list, ``tf.io.read_file``, decoded by TensorFlow (``decode_png``;
  ``decode_jpeg`` with libjpeg's accurate integer IDCT, Pillow's default, so both give the same
  pixels: tested on scikit-learn's sample JPEGs; TensorFlow's default fast IDCT differs by
  ~1 level on average);
* webdataset: the tar shards read by the neutral indexed reader
  (:class:`dlscale.data.readers.WebDataset`, sequential within each shard) through
  ``Dataset.from_generator``, the image bytes decoded by TensorFlow as above.

Sharding is TensorFlow's per-element ``shard(world_size, rank)`` (what
``AutoShardPolicy.DATA`` does): rank r reads the samples at positions r, r + world_size, ...
of the split, the ranks' parts are disjoint and cover the split. Training: each rank's part is
cut to ``num_samples // world_size`` (every rank the same count: equal steps, the
``drop_last`` of :func:`dlscale.data.readers.shard_indices`), shuffled with ``seed + rank``
afresh on every iteration (one iteration of the dataset = one epoch; a rank keeps its part
across epochs, unlike torch's DistributedSampler, which re-deals every epoch), batched with
whole batches only. Validation: unshuffled, every sample once, last batch partial. Then
``prefetch(AUTOTUNE)``. The dataset's own auto-sharding is switched off
(``AutoShardPolicy.OFF``), so ``strategy.experimental_distribute_dataset`` does not shard again.

Batches: ``float32 (N, H, W, C)`` (channels last, as the Keras models) scaled to [-1, 1] with
the fixed mean 0.5 and std 0.5 of :mod:`dlscale.data.torch_data`, and ``int64 (N,)`` labels.
"""

from __future__ import annotations

import tensorflow as tf

from dlscale.data import (
    CIFAR_RECORD_BYTES,
    DatasetInfo,
    cifar_files,
    image_folder_files,
    webdataset_shards,
)
from dlscale.data.readers import WebDataset

__all__ = ["MEAN", "STD", "make_dataset"]

MEAN = 0.5
STD = 0.5
AUTOTUNE = tf.data.AUTOTUNE


def _cifar_record(record: tf.Tensor):
    data = tf.io.decode_raw(record, tf.uint8)
    image = tf.transpose(tf.reshape(data[1:], (3, 32, 32)), (1, 2, 0))
    return image, tf.cast(data[0], tf.int64)


def _decoder(shape: tuple[int, int, int]):
    height, width = shape[0], shape[1]

    def decode(data: tf.Tensor, label: tf.Tensor):
        image = tf.cond(
            tf.io.is_jpeg(data),
            # libjpeg's accurate integer IDCT, Pillow's default (TensorFlow's is the fast one)
            lambda: tf.io.decode_jpeg(data, channels=3, dct_method="INTEGER_ACCURATE"),
            lambda: tf.io.decode_png(data, channels=3),
        )
        size = tf.shape(image)[:2]

        def resize():  # shorter side to the target's, then centre crop (as the neutral reader)
            scale = tf.maximum(
                width / tf.cast(size[1], tf.float64), height / tf.cast(size[0], tf.float64)
            )
            new = tf.cast(tf.round(tf.cast(size, tf.float64) * scale), tf.int32)
            new = tf.maximum(new, (height, width))
            big = tf.image.resize(image, new, method="bilinear")
            crop = tf.image.resize_with_crop_or_pad(big, height, width)
            return tf.cast(tf.clip_by_value(tf.round(crop), 0, 255), tf.uint8)

        same = tf.logical_and(tf.equal(size[0], height), tf.equal(size[1], width))
        image = tf.cond(same, lambda: image, resize)
        return tf.ensure_shape(image, (height, width, 3)), label

    return decode


def _normalise(images: tf.Tensor, labels: tf.Tensor):
    x = tf.cast(images, tf.float32) * (1 / (255 * STD)) - MEAN / STD
    return x, labels


#: Shuffle buffer of a webdataset stream (encoded samples held), as WebDataset loaders do:
#: shards are read sequentially, so only a window of them can be shuffled.
WEBDATASET_SHUFFLE_BUFFER = 1024


def _rank_part(info: DatasetInfo, split: str, shape, rank: int, world_size: int):
    """Rank ``rank``'s part of the split as cheap elements (a raw CIFAR record, an image
    path, an encoded webdataset sample), the function that reads and decodes one, the split's
    sample count and the default shuffle buffer. Sharding comes first: nothing of another
    rank's part is decoded (CIFAR's records and the webdataset's headers are still read)."""
    if info.format == "cifar_binary":
        files = [str(f) for f in cifar_files(info.path, split)]
        ds = tf.data.FixedLengthRecordDataset(files, CIFAR_RECORD_BYTES).shard(world_size, rank)
        return ds, _cifar_record, info.samples(split), None
    decode = _decoder(shape)
    if info.format == "image_folder":
        train_classes, _ = image_folder_files(info.path, "train")
        items = image_folder_files(info.path, split, train_classes)[1]
        paths = tf.constant([str(p) for p, _ in items])
        labels = tf.constant([label for _, label in items], tf.int64)
        ds = tf.data.Dataset.from_tensor_slices((paths, labels)).shard(world_size, rank)
        return ds, lambda p, y: decode(tf.io.read_file(p), y), len(items), None
    if info.format == "webdataset":
        reader = WebDataset(webdataset_shards(info.path, split), shape)

        def encoded():  # the same positions as shard(world_size, rank), read in file order
            for i in range(rank, len(reader), world_size):
                yield reader.raw(i)

        signature = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int64))
        ds = tf.data.Dataset.from_generator(encoded, output_signature=signature)
        return ds, decode, len(reader), WEBDATASET_SHUFFLE_BUFFER
    raise ValueError(f"unknown format {info.format!r}")


def make_dataset(
    info: DatasetInfo,
    split: str,
    rank: int,
    world_size: int,
    batch_size: int,
    *,
    seed: int = 0,
    train: bool = True,
    shape: tuple[int, int, int] | None = None,
    shuffle_buffer: int | None = None,
) -> tf.data.Dataset:
    """Rank ``rank``'s ``tf.data.Dataset`` of ``split`` in batches of ``batch_size`` (the
    per-rank batch); see the module docstring. ``shuffle_buffer``: elements held for the
    training shuffle; default the rank's whole part (a full shuffle: raw CIFAR records, image
    paths), for webdataset :data:`WEBDATASET_SHUFFLE_BUFFER` encoded samples of the stream."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
    shape = tuple(shape or info.image_shape)
    ds, read, n, buffer = _rank_part(info, split, shape, rank, world_size)
    if train:
        per_rank = n // world_size
        if per_rank < batch_size:
            raise ValueError(
                f"rank {rank} of {world_size} has {per_rank} {split} samples, fewer than one "
                f"batch of {batch_size}: use a smaller per-rank batch or fewer ranks"
            )
        ds = ds.take(per_rank)
        ds = ds.shuffle(
            shuffle_buffer or min(per_rank, buffer or per_rank),
            seed=seed + rank,
            reshuffle_each_iteration=True,
        )
    ds = ds.map(read, num_parallel_calls=AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=train).map(_normalise, num_parallel_calls=AUTOTUNE)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options).prefetch(AUTOTUNE)
