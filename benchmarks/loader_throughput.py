"""Input pipeline vs training step on the shipped digits (CPU): is the small-CNN cell input-bound?

    PYTHONPATH=scripts .venv/bin/python benchmarks/loader_throughput.py [--repeats 5]
        [--batch 32] [--workers 0,2] [--threads 1] [--formats cifar_binary,image_folder,webdataset]

Per repeat, in an order that alternates between repeats:

* step: the training step of ``cnn_small`` (the registry's PyTorch builder, SGD with momentum,
  cross-entropy, ``--threads`` torch threads as a cell with ``cpus_per_rank`` = that) on one
  fixed batch of the shipped digits, ``--warmup`` untimed then ``--steps`` timed steps, wall
  clock over the timed window: samples/s;
* loader-only, per format and worker count: ``dlscale.data.torch_data.make_loader`` (rank 0 of
  1, training order, per-rank batch ``--batch``) measured by
  ``dlscale.data.loader_bench.measure_loader`` (``--warmup`` untimed, ``--batches`` timed
  batches, the model never runs): samples/s.
* fed (``--fed``): the same training step fed by the loader (the real pipeline end to end).

Prints per variant the median and range over the repeats and the ratio loader / step of the
medians (with the range of per-repeat ratios). Target: >= 3 for the shipped data.
The digits are written by the production writer into a temporary folder first (not timed).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dlscale.data import FORMATS, inspect_dataset
from dlscale.data.loader_bench import INPUT_BOUND_MARGIN, measure_loader
from dlscale.data.shipped import write_digits
from dlscale.data.torch_data import make_loader
from dlscale.models import find_builder


def new_model(seed: int = 0):
    torch.manual_seed(seed)
    model = find_builder("dlscale.models.torch", "PyTorch", "cnn_small")()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train_step(model, opt, images, labels) -> None:
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    opt.step()


def step_throughput(info, a) -> float:
    """cnn_small's training step on one fixed batch of real digits: samples/s."""
    model, opt = new_model()
    loader, _ = make_loader(info, "train", 0, 1, a.batch, workers=0)
    images, labels = next(iter(loader))
    for _ in range(a.warmup):
        train_step(model, opt, images, labels)
    start = time.perf_counter()
    for _ in range(a.steps):
        train_step(model, opt, images, labels)
    return a.batch * a.steps / (time.perf_counter() - start)


def loader_throughput(info, workers: int, a) -> float:
    loader, _ = make_loader(info, "train", 0, 1, a.batch, workers=workers)
    return measure_loader(loader, a.warmup, a.batches)["samples_per_s"]


def fed_throughput(info, workers: int, a) -> float:
    """The training step fed by the loader: samples/s over --steps steps after --warmup."""
    model, opt = new_model()
    loader, sampler = make_loader(info, "train", 0, 1, a.batch, workers=workers)
    done, epoch, start = 0, 0, None
    while done < a.warmup + a.steps:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            if done == a.warmup:
                start = time.perf_counter()
            train_step(model, opt, images, labels)
            done += 1
            if done == a.warmup + a.steps:
                break
        epoch += 1
    return a.batch * a.steps / (time.perf_counter() - start)


def summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):8.1f} samples/s "
        f"(range {min(values):.1f}..{max(values):.1f}, n={len(values)})"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=32, help="per-rank batch")
    p.add_argument("--workers", default="0,2", help="loader worker counts, comma-separated")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the training step")
    p.add_argument("--formats", default=",".join(FORMATS))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30, help="timed training steps")
    p.add_argument("--batches", type=int, default=60, help="timed loader batches")
    p.add_argument("--fed", action="store_true", help="also the step fed by the loader")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    workers = [int(w) for w in a.workers.split(",")]
    root = Path(tempfile.mkdtemp(prefix="dlscale-loader-bench-", dir="/var/tmp"))
    infos = {f: inspect_dataset(write_digits(root / f, f), f) for f in a.formats.split(",")}
    print(
        f"cnn_small, per-rank batch {a.batch}, {a.threads} torch thread(s), CPU; warm-up "
        f"{a.warmup}, {a.steps} timed steps / {a.batches} timed loader batches; "
        f"{a.repeats} repeats, order alternating; data {root}"
    )
    variants = {"step": lambda: step_throughput(infos[a.formats.split(",")[0]], a)}
    for fmt, info in infos.items():
        for w in workers:
            variants[f"loader {fmt} w{w}"] = lambda info=info, w=w: loader_throughput(info, w, a)
            if a.fed:
                variants[f"fed {fmt} w{w}"] = lambda info=info, w=w: fed_throughput(info, w, a)
    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(a.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            results[name].append(variants[name]())
    step = results["step"]
    print(f"{'step (fixed batch)':28s} {summary(step)}")
    for name, values in results.items():
        if name == "step":
            continue
        per_repeat = [v / s for v, s in zip(values, step)]
        ratio = statistics.median(values) / statistics.median(step)
        verdict = ""
        if name.startswith("loader"):
            verdict = "ok" if ratio >= INPUT_BOUND_MARGIN else "INPUT-BOUND"
        print(
            f"{name:28s} {summary(values)}; / step: {ratio:5.2f} "
            f"(per repeat {min(per_repeat):.2f}..{max(per_repeat):.2f}) {verdict}"
        )


if __name__ == "__main__":
    main()
