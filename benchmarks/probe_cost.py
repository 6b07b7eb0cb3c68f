"""Cost of the system probes per node, as a rank pays it (goal <= 1 s).

    PYTHONPATH=scripts .venv/bin/python benchmarks/probe_cost.py [--repeat 20]
    PYTHONPATH=scripts .venvs/tensorflow/bin/python benchmarks/probe_cost.py --framework tensorflow

Times `dlscale.run.train.describe_node`, the function each node's local rank 0 calls after setup
and before the timed window: every node-probe section (OS, CPU, memory, nvidia-smi, network,
Slurm version and, in a Slurm job on rank 0, `scontrol show job`), the environment's package
list and its hash, the framework's build description, and writing the list beside the part
file. The framework is imported first (a rank has it already). Prints the first (cold) call and
the median, min and max of --repeat further calls; `cpu_affinity` (every rank) is timed apart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from types import SimpleNamespace

from dlscale.rank.node_probes import cpu_affinity
from dlscale.registry import frameworks
from dlscale.run.train import describe_node


def build_info_of(framework: str):
    """The framework's build description, by the model package its record names (the frameworks
    that share one share the probe: pytorch and horovod, tensorflow and keras)."""
    package = frameworks.get(framework).model_package
    if package == "torch":
        from dlscale.frameworks.torch_model import TorchModel

        return lambda: TorchModel.build_info(None)  # uses no adapter state
    if package == "tf":
        from dlscale.frameworks.tensorflow import Adapter

        return lambda: Adapter.build_info(None)
    if package == "mxnet":
        import mxnet

        from dlscale.frameworks.mxnet import Adapter

        return lambda: Adapter.build_info(SimpleNamespace(mx=mxnet))
    raise SystemExit(f"unknown framework {framework}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--framework", default="pytorch", choices=frameworks.names())
    p.add_argument("--repeat", type=int, default=20)
    args = p.parse_args()
    adapter = SimpleNamespace(build_info=build_info_of(args.framework))
    ctx = SimpleNamespace(rank=0)
    with tempfile.TemporaryDirectory() as rank_dir:
        started = time.perf_counter()
        describe_node(adapter, ctx, rank_dir)
        cold = time.perf_counter() - started
        seconds = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            system = describe_node(adapter, ctx, rank_dir)
            seconds.append(time.perf_counter() - started)
    started = time.perf_counter()
    for _ in range(100):
        cpu_affinity()
    affinity = (time.perf_counter() - started) / 100
    print(
        json.dumps(
            {
                "framework": args.framework,
                "n": len(seconds),
                "cold_s": round(cold, 4),
                "median_s": round(statistics.median(seconds), 4),
                "min_s": round(min(seconds), 4),
                "max_s": round(max(seconds), 4),
                "cpu_affinity_s": round(affinity, 6),
                "gpu": system["gpu"]["available"],
                "packages": system["packages"].get("count"),
            }
        )
    )


if __name__ == "__main__":
    main()
