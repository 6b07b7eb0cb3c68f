"""One rank of the stalled-subgroup test (tests/unit/frameworks/test_collective_timeouts.py): the
production device mesh (dlscale.frameworks.torch_parallel.build_mesh) over gloo; rank 0 starts
an allreduce on its tensor-parallel group, whose other rank (1) never joins; rank 0 writes how
long it waited and what it raised.

    python mesh_stall.py RANK WORLD PORT OUT.json
"""

from __future__ import annotations

import datetime
import json
import sys
import time


def main(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from dlscale.frameworks.torch_parallel import build_mesh
    from dlscale.rank.timing import COLLECTIVE_TIMEOUT_S
    from dlscale.registry.parallel_dims import ParallelDims

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    # 2 nodes x 2 ranks, tensor parallel in a node: tp groups {0, 1} and {2, 3}, new groups
    mesh = build_mesh(ParallelDims(dp_replicate=2, dp_shard=1, tp=2, ranks_per_node=2), "cpu")
    if rank == 1:
        time.sleep(120)  # never joins; ended by the test
        return
    if rank != 0:
        return
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=mesh["tp"].get_group())
        raised = None
    except Exception as exc:  # noqa: BLE001 (what the stalled collective raised)
        raised = f"{type(exc).__name__}: {exc}"
    with open(out, "w") as fh:
        json.dump({"waited_s": time.monotonic() - started, "raised": raised}, fh)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
