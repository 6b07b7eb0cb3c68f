"""The framework loaders of dlscale.data in their own environments: tf.data (.venvs/tensorflow),
Gluon (.venvs/mxnet) and the torch loader under Horovod (.venvs/horovod) read the shipped
digits of every format with the right labels, pixels, shapes and rank shards.

The shipped digits are written here (driver venv, the production writer); each framework reads
them in a subprocess of its venv and prints what it read as JSON. A missing venv skips its
test, unless CI is set (then it fails)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dlscale.data import FORMATS
from dlscale.data.readers import shard_indices
from dlscale.data.shipped import digits_splits, sample_photos, write_digits, write_photos

ROOT = Path(__file__).resolve().parents[3]
VENVS = ROOT / ".venvs"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")

# What the subprocesses share: fingerprints of uint8 HWC images rebuilt from the normalised
# float batches ((x * 0.5 + 0.5) * 255, rounded), with their labels.
COMMON = """
    import hashlib, json, sys
    import numpy as np
    from dlscale.data import inspect_dataset

    def prints(images, labels, nchw=False):
        images = np.asarray(images).transpose(0, 2, 3, 1) if nchw else np.asarray(images)
        raw = np.rint((images * 0.5 + 0.5) * 255).astype(np.uint8)
        return [[int(y), hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()]
                for x, y in zip(raw, np.asarray(labels))]

    paths = json.loads(sys.argv[1])
    out = {}
"""


def python_of(env: str) -> Path:
    python = VENVS / env / "bin" / "python"
    if not python.exists():
        if IN_CI:
            pytest.fail(f"CI is set but {python} is missing (scripts/setup.sh {env})")
        pytest.skip(f"{python} is missing: build it with scripts/setup.sh {env}")
    return python


def run_in(env: str, code: str, paths: dict) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DLSCALE_", "SLURM_"))}
    environ.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT / "scripts"), os.environ.get("PYTHONPATH")])
        ),
    )
    proc = subprocess.run(
        [
            str(python_of(env)),
            "-c",
            textwrap.dedent(COMMON) + textwrap.dedent(code),
            json.dumps(paths),
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("shipped")
    paths = {f: str(write_digits(root / f, f)) for f in FORMATS}
    paths["photos"] = str(write_photos(root / "photos", "image_folder"))
    return paths


def fingerprints(split: str) -> Counter:
    images, labels = digits_splits()[split]
    return Counter(
        (int(y), hashlib.sha256(x.tobytes()).hexdigest()) for x, y in zip(images, labels)
    )


def as_counter(pairs) -> Counter:
    return Counter(map(tuple, pairs))


def check_every_format(out: dict, world: int, per_rank: int) -> None:
    """val: one exact pass over the ranks; train: every rank `per_rank` samples per epoch,
    the ranks disjoint (no sample more often than in the split), a new order each epoch."""
    val, train = fingerprints("val"), fingerprints("train")
    for fmt in FORMATS:
        assert as_counter(out[fmt]["val"]) == val, fmt
        epoch0 = [as_counter(rank[0]) for rank in out[fmt]["train"]]
        assert [sum(c.values()) for c in epoch0] == [per_rank] * world, fmt
        assert sum(epoch0, Counter()) <= train, fmt  # disjoint ranks, real samples
        for rank in out[fmt]["train"]:
            assert len(rank[1]) == per_rank and rank[0] != rank[1], fmt


# ----------------------------------------------------------------------------- TensorFlow
TF_CODE = """
    import tensorflow as tf
    from dlscale.data.tf_data import make_dataset

    for fmt in ("cifar_binary", "image_folder", "webdataset"):
        info = inspect_dataset(paths[fmt], fmt)
        val = []
        for rank in range(2):
            for x, y in make_dataset(info, "val", rank, 2, 64, train=False):
                assert x.dtype == tf.float32 and y.dtype == tf.int64 and x.shape[1:] == (32, 32, 3)
                assert -1 <= float(tf.reduce_min(x)) and float(tf.reduce_max(x)) <= 1
                val += prints(x, y)
        train = []
        for rank in range(3):
            ds = make_dataset(info, "train", rank, 3, 50, seed=1)
            train.append([[p for x, y in ds for p in prints(x, y)] for epoch in range(2)])
        out[fmt] = {"val": val, "train": train}
    photos = inspect_dataset(paths["photos"])
    decoded = [x for x, _ in make_dataset(photos, "val", 0, 1, 2, train=False)][0].numpy()
    out["photos"] = np.rint((decoded * 0.5 + 0.5) * 255).astype(np.uint8).tolist()
    small = make_dataset(photos, "val", 0, 1, 2, train=False, shape=(64, 48, 3))
    out["small"] = list(next(iter(small))[0].shape)
    print(json.dumps(out))
"""


def test_tf_data_reads_every_format(data):
    out = run_in("tensorflow", TF_CODE, data)
    check_every_format(out, world=3, per_rank=1438 // 3 // 50 * 50)
    # the JPEG photos through TensorFlow's decoder (accurate IDCT): Pillow's pixels exactly
    _, expected, _ = sample_photos()
    assert np.array_equal(np.array(out["photos"], dtype=np.uint8), np.stack(expected))
    assert out["small"] == [2, 64, 48, 3]


# ----------------------------------------------------------------------------- MXNet
MX_CODE = """
    from dlscale.data.mxnet_data import make_loader

    for fmt in ("cifar_binary", "image_folder", "webdataset"):
        info = inspect_dataset(paths[fmt], fmt)
        val = []
        for rank in range(2):
            loader, _ = make_loader(info, "val", rank, 2, 64, train=False, workers=0)
            for x, y in loader:
                assert x.dtype == np.float32 and x.shape[1:] == (3, 32, 32)
                val += prints(x.asnumpy(), y.asnumpy(), True)
        train = []
        for rank in range(3):
            loader, sampler = make_loader(info, "train", rank, 3, 50, seed=1, workers=2)
            epochs = []
            for epoch in range(2):
                sampler.set_epoch(epoch)
                batches = [prints(x.asnumpy(), y.asnumpy(), True) for x, y in loader]
                epochs.append([p for batch in batches for p in batch])
            train.append(epochs)
        out[fmt] = {"val": val, "train": train}
    print(json.dumps(out))
"""


def test_gluon_loader_reads_every_format(data):
    out = run_in("mxnet", MX_CODE, data)
    check_every_format(out, world=3, per_rank=480 // 50 * 50)
    # the order is shard_indices' (DistributedSampler semantics): labels in that order
    labels = digits_splits()["train"][1]
    for fmt in ("cifar_binary", "webdataset"):  # file order = the source order there
        for rank, epochs in enumerate(out[fmt]["train"]):
            for epoch, samples in enumerate(epochs):
                order = shard_indices(1438, rank, 3, epoch, seed=1)
                assert [y for y, _ in samples] == [int(labels[i]) for i in order[: len(samples)]]


# ----------------------------------------------------------------------------- Horovod
HVD_CODE = """
    import horovod.torch as hvd
    from dlscale.data.torch_data import make_loader

    hvd.init()
    for fmt in ("cifar_binary", "image_folder", "webdataset"):
        info = inspect_dataset(paths[fmt], fmt)
        loader, _ = make_loader(info, "val", hvd.rank(), hvd.size(), 100, train=False, workers=2)
        val = [p for x, y in loader for p in prints(x.numpy(), y.numpy(), True)]
        loader, sampler = make_loader(info, "train", hvd.rank(), hvd.size(), 100, workers=2)
        train = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            train.append([p for x, y in loader for p in prints(x.numpy(), y.numpy(), True)])
        out[fmt] = {"val": val, "train": [train], "size": hvd.size()}
    print(json.dumps(out))
"""


def test_horovod_reads_through_the_torch_loader(data):
    out = run_in("horovod", HVD_CODE, data)
    assert out["cifar_binary"]["size"] == 1
    check_every_format(out, world=1, per_rank=1400)
