"""One rank of the sharded-initialisation check (tests/unit/models/test_llama.py): llama3_debug
built on the meta device, each block then the root fully_shard-ed over all ranks (gloo),
materialised on the CPU and initialised by init_weights from this rank's own seed (seed + rank,
as the adapter seeds); writes whether every parameter, gathered whole, equals what one process
builds from rank 0's seed.

    python sharded_init.py RANK WORLD PORT OUT.json
"""

from __future__ import annotations

import json
import sys


def main(rank: int, world: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from dlscale.models.torch import build

    torch.manual_seed(0)
    single = build("llama3_debug")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        with torch.device("meta"):
            model = build("llama3_debug")
        mesh = init_device_mesh("cpu", (world,))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device="cpu")
        torch.manual_seed(0 + rank)
        model.init_weights()
        local = sum(p.to_local().numel() for p in model.parameters())
        differ = [
            name
            for (name, p), q in zip(model.named_parameters(), single.parameters())
            if not torch.equal(p.full_tensor().detach(), q.detach())
        ]
        result = {
            "differ": differ,
            "dtensors": all(hasattr(p, "full_tensor") for p in model.parameters()),
            "local_numel": local,
            "rope_equal": torch.equal(model.rope, single.rope),
        }
    finally:
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
