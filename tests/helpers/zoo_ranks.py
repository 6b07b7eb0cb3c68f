"""Real ranks of a study's own model (config `models:`, dlscale.models.zoo) for the equivalence
tests, in the model's environment (pytorch-hf for a transformers model): the ranks and the
single-process program of tests/helpers/parallel_ranks.py, with the model registered first
from its record (a cell's model_source, as a rank registers it).

    python zoo_ranks.py RECORD.json NAME rank RANK WORLD RANKS_PER_NODE PORTS ENTRIES TP OUT.json \
        [REFERENCE.json [FAULT ...]]
    python zoo_ranks.py RECORD.json NAME reference WORLD OUT.json [FAULT ...]

ENTRIES: comma-separated strategies run one after another in the same processes (PORTS, one
each), each with plain SGD (sgd0: no momentum, no clipping, so a wrong gradient scale moves the
loss by that factor). `reference` writes the loss of the same 3 steps in one process: rank 0's
weights, the ranks' batches as one batch; with FAULTs (parallel_ranks.FAULTS, e.g. no_average)
the loss each break trains to instead, under its name. A rank given REFERENCE.json writes
the same there after its entries, in its own interpreter: one start of torch and transformers
fewer than a process of its own (seconds of a test on a 2-core machine)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

OPTIMIZER = "sgd0"


def main(argv: list[str]) -> None:
    from dlscale.models.zoo import register

    record_file, name, mode = argv[:3]
    register(name, json.loads(Path(record_file).read_text()))
    import parallel_ranks

    if mode == "reference":
        reference(parallel_ranks, name, int(argv[3]), argv[4], argv[5:])
        return
    rank, world, rpn = (int(a) for a in argv[3:6])
    ports, entries = argv[6].split(","), argv[7].split(",")
    tp, out = int(argv[8]), argv[9]
    results = {}
    for port, entry in zip(ports, entries, strict=True):
        degree = parallel_ranks.degree_of(entry, tp)
        result = parallel_ranks.run_rank(
            rank, world, rpn, int(port), entry, degree, name, OPTIMIZER
        )
        results[entry] = {k: result[k] for k in ("loss", "memory", "wrapper", "execution")}
    Path(out).write_text(json.dumps(results, default=str))
    if len(argv) > 10:
        reference(parallel_ranks, name, world, argv[10], argv[11:])


def reference(parallel_ranks, name: str, world: int, out: str, faults: list[str]) -> None:
    """The single-process program's loss, and with `faults` what each break trains to."""
    losses = {"loss": parallel_ranks._reference_loss(world, name, OPTIMIZER, "fp32", None, world)}
    for fault in faults:
        losses[fault] = parallel_ranks._reference_loss(world, name, OPTIMIZER, "fp32", fault, world)
    Path(out).write_text(json.dumps(losses))


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
