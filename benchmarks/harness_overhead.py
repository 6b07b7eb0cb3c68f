"""Harness overhead: the PyTorch adapter (dlscale's timing loop) against a bare hand-written
DDP training loop on the same model, batch and steps, measured side by side in one process.

    .venv/bin/python benchmarks/harness_overhead.py [--model cnn_small] [--batch 32]
                                                    [--steps 30] [--rounds 7]

Each round runs the bare loop and the adapter back to back (alternating which goes first) and
takes the ratio adapter/bare of their throughputs: the adapter's as dlscale reports it
(per_rank_batch x steps / sum of its per-step times), the bare loop's as wall-clock samples/s
over its steps. Prints every round and the median ratio.
Goal: median reported ratio >= 0.98. World size 1, gloo, CPU threads = --threads.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.parallel import DistributedDataParallel

from dlscale.frameworks.base import RankContext, TrainSpec, run_timed
from dlscale.frameworks.pytorch import Adapter
from dlscale.models import get_spec
from dlscale.models.torch import build, example_batch


def bare_loop(spec: TrainSpec) -> float:
    """What a user would write by hand: DDP, SGD, synthetic batch; wall-clock samples/s."""
    model_name, batch, warmup, steps = (
        spec.model,
        spec.per_rank_batch,
        spec.warmup_steps,
        spec.steps,
    )
    model = DistributedDataParallel(build(model_name))
    opt = torch.optim.SGD(model.parameters(), lr=spec.learning_rate, momentum=spec.momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = example_batch(get_spec(model_name), batch)
    for _ in range(warmup):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    return batch * steps / (time.perf_counter() - t0)


def dlscale_loop(adapter: Adapter) -> float:
    """The adapter under dlscale's timing loop; throughput as dlscale reports it."""
    run = run_timed(adapter)
    return adapter.spec.per_rank_batch * adapter.spec.steps / sum(run["step_seconds"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cnn_small")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--learning-rate", type=float, default=0.01, help="SGD (the config's default)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD (the config's default)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = TrainSpec(
        framework="pytorch",
        model=a.model,
        per_rank_batch=a.batch,
        warmup_steps=a.warmup,
        steps=a.steps,
        precision="fp32",
        device="cpu",
        threads=a.threads,
        learning_rate=a.learning_rate,
        momentum=a.momentum,
    )
    ctx = RankContext(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_index=0,
        node="local",
        master_addr="127.0.0.1",
        master_port=port,
        launcher="benchmark",
        hosts=("127.0.0.1",),
    )

    adapter = Adapter(spec, ctx)
    adapter.setup()  # the process group the bare loop shares
    ratios = []
    print(
        f"model={a.model} batch={a.batch} warmup={a.warmup} steps={a.steps} "
        f"threads={a.threads} rounds={a.rounds}"
    )
    print("round  bare[samples/s]  dlscale[samples/s]  ratio")
    for r in range(a.rounds):
        if r % 2 == 0:
            reported = dlscale_loop(adapter)
            bare = bare_loop(spec)
        else:
            bare = bare_loop(spec)
            reported = dlscale_loop(adapter)
        ratios.append(reported / bare)
        print(f"{r:5d}  {bare:15.1f}  {reported:18.1f}  {reported / bare:5.3f}")
    print(
        f"median ratio dlscale/bare = {statistics.median(ratios):.3f} "
        f"(min {min(ratios):.3f}, max {max(ratios):.3f}, n={len(ratios)}); goal >= 0.98"
    )
    adapter.teardown()


if __name__ == "__main__":
    main()
