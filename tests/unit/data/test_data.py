"""The data layer (dlscale.data): the CIFAR binary reader byte for byte, labels and pixels
surviving every format of the shipped digits, JPEG decoding of the sample photos, rank shards
(against torch's DistributedSampler), the validation of a configured dataset path, the torch
loader, staging and the loader-only measurement. Runs in the driver venv (torch CPU)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from dlscale.data import CIFAR_RECORD_BYTES, FORMATS, DatasetInfo, inspect_dataset
from dlscale.data.loader_bench import input_bound, measure_loader
from dlscale.data.readers import (
    CifarBinary,
    eval_indices,
    iter_shards,
    open_split,
    shard_indices,
    split_order,
)
from dlscale.data.shipped import digits_splits, sample_photos, write_digits, write_photos
from dlscale.data.staging import stage, staged_path
from dlscale.data.torch_data import make_loader
from dlscale.data.writers import cifar_record, write_cifar_binary
from dlscale.study.config import ConfigError


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> dict[str, DatasetInfo]:
    """The shipped digits written by the production writer, once per format."""
    root = tmp_path_factory.mktemp("digits")
    return {f: inspect_dataset(write_digits(root / f, f), f) for f in FORMATS}


def fingerprint(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


# ----------------------------------------------------------------------------- CIFAR binary
def test_cifar_record_layout_by_hand(tmp_path):
    """A record built by hand from the official layout: label byte, 1,024 R, 1,024 G, 1,024 B
    bytes, each plane row-major (row 0 columns 0..31, then row 1, ...)."""
    r = np.arange(1024, dtype=np.uint16) % 251
    g = (np.arange(1024, dtype=np.uint16) * 7) % 253
    b = 255 - np.arange(1024, dtype=np.uint16) % 256
    raw = (
        bytes([7])
        + bytes(r.astype(np.uint8))
        + bytes(g.astype(np.uint8))
        + bytes(b.astype(np.uint8))
    )
    assert len(raw) == CIFAR_RECORD_BYTES
    (tmp_path / "data_batch_1.bin").write_bytes(raw * 2)
    (tmp_path / "test_batch.bin").write_bytes(raw)
    (tmp_path / "batches.meta.txt").write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    info = inspect_dataset(tmp_path)
    assert (info.format, info.train_samples, info.val_samples, info.num_classes) == (
        "cifar_binary",
        2,
        1,
        10,
    )
    image, label = open_split(info, "train")[1]
    assert label == 7 and image.shape == (32, 32, 3) and image.dtype == np.uint8
    # pixel (row 3, column 5) is byte 3 * 32 + 5 of each plane
    assert tuple(image[3, 5]) == (r[101] % 256, g[101] % 256, b[101] % 256)
    assert tuple(image[31, 0]) == (r[992], g[992], b[992])
    assert cifar_record(image, label) == raw


def test_cifar_round_trip_is_byte_exact(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(23, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=23)
    write_cifar_binary(tmp_path, {"train": (images, labels), "val": (images[:5], labels[:5])})
    files = sorted(tmp_path.glob("data_batch_*.bin"))
    assert [f.name for f in files] == [f"data_batch_{i}.bin" for i in range(1, 6)]
    written = b"".join(f.read_bytes() for f in files)
    reader = open_split(tmp_path, "train")
    assert isinstance(reader, CifarBinary) and len(reader) == 23
    assert b"".join(reader.record(i) for i in range(23)) == written
    for i in range(23):
        image, label = reader[i]
        assert label == labels[i] and np.array_equal(image, images[i])
        assert cifar_record(image, label) == written[i * 3073 : (i + 1) * 3073]
    assert np.array_equal(reader.labels(), labels)
    assert reader[-1][1] == labels[-1]
    with pytest.raises(IndexError):
        reader[23]


# ----------------------------------------------------------------------------- every format
def test_shipped_digits_split():
    splits = digits_splits()
    (train_x, train_y), (_, val_y) = splits["train"], splits["val"]
    assert (len(train_y), len(val_y)) == (1438, 359)
    assert train_x.shape == (1438, 32, 32, 3) and train_x.dtype == np.uint8
    # stratified: every class ~20 % in val
    share = np.bincount(val_y) / (np.bincount(val_y) + np.bincount(train_y))
    assert np.all(np.abs(share - 0.2) < 0.02)
    # real digits, not noise: 4x4 blocks of one grey value, 17 levels, all channels equal
    assert np.array_equal(train_x[:, ::4, ::4].repeat(4, 1).repeat(4, 2), train_x)
    assert np.array_equal(train_x[..., 0], train_x[..., 2])
    assert len(np.unique(train_x)) == 17
    # deterministic
    again = digits_splits()
    assert all(np.array_equal(again["val"][i], splits["val"][i]) for i in range(2))


@pytest.mark.parametrize("split", ["train", "val"])
def test_labels_and_pixels_survive_every_format(digits, split):
    """The same multiset of (label, image hash) in every format as in the source arrays (all
    formats are lossless here: raw records and PNG)."""
    images, labels = digits_splits()[split]
    expected = Counter((int(y), fingerprint(x)) for x, y in zip(images, labels))
    for fmt, info in digits.items():
        reader = open_split(info, split)
        got = Counter((label, fingerprint(image)) for image, label in reader)
        assert got == expected, fmt
        assert sorted(reader.labels().tolist()) == sorted(labels.tolist()), fmt
    # and the webdataset stream reads the same samples across its shards
    info = digits["webdataset"]
    shards = sorted(Path(info.path).glob(f"{split}-*.tar"))
    streamed = Counter(
        (label, fingerprint(image)) for image, label in iter_shards(shards, info.image_shape)
    )
    assert streamed == expected


@pytest.mark.parametrize("fmt", ["image_folder", "webdataset"])
def test_jpeg_photos_decode_as_scikit_learn_does(tmp_path, fmt):
    """scikit-learn's two sample JPEGs through the JPEG path: the same Pillow decoder gives the
    same pixels (exact; tf.data's decoder is checked against them in test_data_frameworks.py).
    A requested smaller shape resizes and centre-crops."""
    names, arrays, _ = sample_photos()
    info = inspect_dataset(write_photos(tmp_path / fmt, fmt))
    assert (info.format, info.num_classes, info.image_shape) == (fmt, 2, (427, 640, 3))
    assert info.class_names == tuple(names)
    for split in ("train", "val"):
        for i, ((image, label), expected) in enumerate(zip(open_split(info, split), arrays)):
            assert label == i and np.array_equal(image, expected)
    small = open_split(info, "val", (64, 48, 3))
    assert small[0][0].shape == (64, 48, 3)


# ----------------------------------------------------------------------------- rank shards
@pytest.mark.parametrize("n", [1, 7, 10, 13, 64])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_are_disjoint_and_cover_the_epoch(n, world_size, drop_last):
    if drop_last and n < world_size:  # as DistributedSampler: nothing to anyone, every epoch
        for epoch in range(2):
            assert all(
                shard_indices(n, r, world_size, epoch, seed=5, drop_last=True) == []
                for r in range(world_size)
            )
        return
    orders = []
    for epoch in range(4):
        shards = [
            shard_indices(n, r, world_size, epoch, seed=5, drop_last=drop_last)
            for r in range(world_size)
        ]
        sizes = {len(s) for s in shards}
        assert len(sizes) == 1  # every rank the same count: equal steps
        flat = [i for s in shards for i in s]
        counts = Counter(flat)
        if drop_last:
            assert len(flat) == n - n % world_size
            assert max(counts.values()) == 1  # disjoint
        else:
            assert set(flat) == set(range(n))  # covers the epoch
            pad = len(flat) - n
            assert 0 <= pad < world_size and sum(c - 1 for c in counts.values()) == pad
        orders.append(flat)
    if n > 3:
        assert len({tuple(o) for o in orders}) > 1  # another order each epoch
    assert orders[0] == [
        i
        for s in [
            shard_indices(n, r, world_size, 0, 5, drop_last=drop_last) for r in range(world_size)
        ]
        for i in s
    ]  # the same on every call (every rank computes it alone)


@pytest.mark.parametrize("n", [1, 5, 10, 11, 100])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_equal_torch_distributed_sampler(n, world_size, drop_last):
    for rank in range(world_size):
        for epoch in (0, 3):
            ref = DistributedSampler(
                range(n), world_size, rank, shuffle=True, seed=9, drop_last=drop_last
            )
            ref.set_epoch(epoch)
            g = torch.Generator()
            g.manual_seed(9 + epoch)
            order = torch.randperm(n, generator=g).tolist()
            assert split_order(order, rank, world_size, drop_last) == list(ref)
            plain = DistributedSampler(
                range(n), world_size, rank, shuffle=False, drop_last=drop_last
            )
            assert shard_indices(n, rank, world_size, epoch, 9, False, drop_last) == list(plain)


def test_eval_shards_are_one_exact_pass():
    for n in (1, 10, 359):
        for w in (1, 2, 3, 4):
            flat = sorted(i for r in range(w) for i in eval_indices(n, r, w))
            assert flat == list(range(n))
    with pytest.raises(ValueError, match="rank 2"):
        shard_indices(10, 2, 2, 0, 0)


# ----------------------------------------------------------------------------- validation
ALLOWED = "allowed formats: cifar_binary, image_folder, webdataset"


def check_error(path, expected: str, key: str = "data.path", **kw) -> str:
    with pytest.raises(ConfigError) as info:
        inspect_dataset(path, key=key, **kw)
    text = str(info.value)
    assert key in text and str(path) in text and ALLOWED in text, text
    assert expected in text, text
    return text


def test_dataset_info_survives_json(digits):
    for info in digits.values():
        assert DatasetInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info
        assert info.samples("train") == 1438 and info.samples("val") == 359


def test_inspect_errors_name_key_path_and_formats(tmp_path, digits, monkeypatch):
    check_error(tmp_path / "nowhere", "does not exist")
    (tmp_path / "file").write_text("x")
    check_error(tmp_path / "file", "is not a directory")
    (tmp_path / "empty").mkdir()
    check_error(tmp_path / "empty", "no known layout found")
    check_error(Path(digits["cifar_binary"].path), "unknown format 'tfrecord'", format="tfrecord")
    check_error(
        Path(digits["cifar_binary"].path), "has 10 classes, the study expects 100", num_classes=100
    )

    real_access = os.access
    monkeypatch.setattr(
        os, "access", lambda p, mode: False if "locked" in str(p) else real_access(p, mode)
    )
    (tmp_path / "locked").mkdir()
    check_error(tmp_path / "locked", "is not readable")


def test_inspect_errors_per_layout(tmp_path, digits):
    # CIFAR: empty validation part, truncated records, a label beyond the named classes
    cifar = tmp_path / "cifar"
    shutil.copytree(digits["cifar_binary"].path, cifar)
    (cifar / "test_batch.bin").unlink()
    check_error(cifar, "the val part is empty: no test_batch.bin")
    (cifar / "test_batch.bin").write_bytes(b"\x01" * 3000)
    check_error(cifar, "test_batch.bin is 3000 bytes, not a positive multiple")
    (cifar / "test_batch.bin").write_bytes(bytes([12]) + bytes(3072))
    check_error(cifar, "label 12 found but batches.meta.txt names 10 classes")
    (cifar / "batches.meta.txt").unlink()
    assert inspect_dataset(cifar).num_classes == 13  # without names: the largest label + 1

    # image folder: wrong class count, an empty class, a val class train lacks, an empty part
    folder = tmp_path / "folder"
    shutil.copytree(digits["image_folder"].path, folder)
    check_error(folder, "has 10 classes, the study expects 9", num_classes=9)
    (folder / "train" / "x").mkdir()
    check_error(folder, "train/ class folders without images: x")
    (folder / "train" / "x").rmdir()
    (folder / "val" / "y").mkdir()
    check_error(folder, "val/ has class folders that train/ does not have: y")
    (folder / "val" / "y").rmdir()
    for f in (folder / "val").rglob("*.png"):
        f.unlink()
    check_error(folder, "the val part is empty")

    # webdataset: a sample without a label, a shard that is no tar, an empty part
    wds = tmp_path / "wds"
    shutil.copytree(digits["webdataset"].path, wds)
    with tarfile.open(wds / "val-000009.tar", "w") as tar:
        tar.add(folder / "train" / "0" / sorted(os.listdir(folder / "train" / "0"))[0], "k.png")
    check_error(wds, "sample 'k' in val-000009.tar has no label (.cls)")
    (wds / "val-000009.tar").write_bytes(b"not a tar")
    check_error(wds, "val-000009.tar is not a readable tar file")
    for f in wds.glob("val-*.tar"):
        f.unlink()
    check_error(wds, "the val part is empty", format="webdataset")

    # several layouts in one root
    (wds / "test_batch.bin").write_bytes(bytes(3073))
    check_error(wds, "several layouts found (cifar_binary, webdataset)")


# ----------------------------------------------------------------------------- torch loader
@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_loader_batches(digits, fmt):
    info = digits[fmt]
    images, labels = digits_splits()["val"]
    expected = Counter(zip(labels.tolist(), map(fingerprint, images)))
    seen = Counter()
    for rank in range(2):
        loader, sampler = make_loader(info, "val", rank, 2, 64, workers=0, train=False)
        for x, y in loader:
            assert x.dtype == torch.float32 and y.dtype == torch.int64
            assert x.shape[1:] == (3, 32, 32) and -1 <= x.min() and x.max() <= 1
            raw = ((x * 0.5 + 0.5) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
            seen.update(zip(y.tolist(), map(fingerprint, raw)))
    assert seen == expected  # one exact validation pass over both ranks

    loader, sampler = make_loader(info, "train", 1, 3, 100, workers=0)
    sampler.set_epoch(2)
    batches = list(loader)
    assert len(batches) == len(loader) == 1438 // 3 // 100
    assert all(x.shape == (100, 3, 32, 32) for x, _ in batches)


def test_torch_loader_with_workers(digits):
    info = digits["cifar_binary"]
    train_labels = digits_splits()["train"][1]
    loader, sampler = make_loader(info, "train", 0, 2, 32, workers=2, seed=4)
    assert isinstance(sampler, DistributedSampler) and loader.num_workers == 2
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        labels = torch.cat([y for _, y in loader]).tolist()
        order = list(sampler)  # the epoch's indices of this rank, in the order read
        assert len(labels) == 719 // 32 * 32  # whole batches only
        assert labels == [int(train_labels[i]) for i in order[: len(labels)]]
        orders.append(order)
    assert orders[0] != orders[1]  # set_epoch reshuffles
    with pytest.raises(ValueError, match="fewer than one batch"):
        make_loader(info, "train", 0, 4, 400, workers=0)


# ----------------------------------------------------------------------------- staging
def _stage_worker(args):
    info, dest = args
    staged, seconds, copied = stage(info, dest)
    return staged.path, seconds, copied


def test_staging_copies_once_per_node_and_reuses(tmp_path, digits, monkeypatch):
    info = digits["webdataset"]
    dest = tmp_path / "node-local"
    with multiprocessing.get_context("fork").Pool(3) as pool:
        results = pool.map(_stage_worker, [(info, dest)] * 3)
    paths = {p for p, _, _ in results}
    assert len(paths) == 1  # every rank of the node gets the same copy
    copied = sorted(c for _, _, c in results)
    total = sum(f.stat().st_size for f in Path(info.path).iterdir())
    assert copied[:2] == [0, 0] and copied[2] == total  # one copy, by one rank
    assert all(s > 0 for _, s, _ in results)
    staged_info = inspect_dataset(paths.pop())
    assert (staged_info.train_samples, staged_info.num_classes) == (1438, 10)
    assert sorted(os.listdir(dest)) == [Path(staged_info.path).name]  # no lock or tmp left
    # reused: nothing copied (the folder named through a variable, as a hardware entry would)
    monkeypatch.setenv("DLSCALE_TEST_NODE_TMP", str(dest))
    again, _, copied = stage(info, "$DLSCALE_TEST_NODE_TMP")
    assert (again.path, copied) == (staged_info.path, 0)
    # a damaged copy is replaced, a changed source gets a new folder
    (Path(again.path) / "val-000001.tar").write_bytes(b"")
    assert stage(info, dest)[2] == total
    src = tmp_path / "src"
    shutil.copytree(info.path, src)
    changed = inspect_dataset(src)
    assert stage(changed, dest)[0].path != again.path
    with pytest.raises(ValueError, match="a variable is not set here"):
        stage(info, "$DLSCALE_NOT_SET_ANYWHERE/x")


def test_staging_takes_over_a_dead_ranks_lock(tmp_path, digits):
    info = digits["cifar_binary"]
    target = staged_path(info, tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    target.with_name(target.name + ".lock").write_text(f"{socket.gethostname()} {dead.pid}")
    staged, _, copied = stage(info, tmp_path, timeout_s=5)
    assert copied > 0 and inspect_dataset(staged.path).val_samples == 359
    # a live holder that never finishes: the waiting rank gives up with a clear message
    other = staged_path(digits["image_folder"], tmp_path)
    other.with_name(other.name + ".lock").write_text(f"{socket.gethostname()} {os.getpid()}")
    with pytest.raises(TimeoutError, match="another rank holds"):
        stage(digits["image_folder"], tmp_path, timeout_s=0.5)


# ----------------------------------------------------------------------------- loader-only
def test_measure_loader_counts_batches_and_restarts_passes(digits):
    loader, sampler = make_loader(digits["cifar_binary"], "val", 0, 1, 100, workers=0, train=False)
    assert len(loader) == 4  # 359 samples: 3 x 100 + 59
    out = measure_loader(loader, warmup_batches=2, batches=6)
    # batches 3..8 of the repeated passes: 100, 59 | 100, 100, 100, 59
    assert out["batches"] == 6 and out["samples"] == 518
    assert out["samples_per_s"] == pytest.approx(518 / out["seconds"])
    assert 0 < out["min_batch_s"] <= out["median_batch_s"] <= out["max_batch_s"]
    assert input_bound(100.0, 40.0) and not input_bound(120.0, 40.0)


def test_measure_loader_stops_at_its_time_cap():
    """A slow loader is timed for max_seconds, not for all its batches: the result counts the
    batches it did time."""

    def slow():
        while True:
            time.sleep(0.05)
            yield np.zeros((4, 1)), np.zeros(4)

    class Slow:
        def __iter__(self):
            return slow()

    out = measure_loader(Slow(), warmup_batches=1, batches=1000, max_seconds=0.2)
    assert 2 <= out["batches"] <= 10 and out["samples"] == 4 * out["batches"]
    assert out["seconds"] >= 0.2


def test_streamed_shards_disjoint_and_equal_per_rank(digits, workers=2):
    """webdataset shards streamed (sequential reads), dealt to 2 ranks x workers: the ranks
    read disjoint real samples, the same count each, a new deal each epoch."""
    info = digits["webdataset"]
    train = Counter((int(y), fingerprint(x)) for x, y in zip(*digits_splits()["train"]))
    seen_epochs = []
    for epoch in range(2):
        per_rank = []
        for rank in range(2):
            loader, stream = make_loader(info, "train", rank, 2, 25, workers=workers, stream=True)
            stream.set_epoch(epoch)
            got = Counter()
            for x, y in loader:
                raw = ((x * 0.5 + 0.5) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
                got.update(zip(y.tolist(), map(fingerprint, raw)))
            per_rank.append(got)
        assert sum(per_rank[0].values()) == sum(per_rank[1].values()) > 0  # equal steps
        assert per_rank[0] + per_rank[1] <= train  # disjoint, real samples
        seen_epochs.append(per_rank[0])
    assert seen_epochs[0] != seen_epochs[1]
    with pytest.raises(ValueError, match="write at least 8 shards"):
        make_loader(info, "train", 0, 4, 25, workers=2, stream=True)
