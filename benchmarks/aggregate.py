"""Aggregation at scale: N synthetic cell records (the real metrics format, built with
dlscale.store.metrics.assemble and written with write_atomic) collected into the tidy tables.

    .venv/bin/python benchmarks/aggregate.py [--cells 10000] [--repeats 3] [--workdir DIR]

Prints the median wall time of dlscale.analysis.collect.collect over the repeats (files already
on disk, page cache warm after the first repeat) and its split into reading+validation and
statistics. Goal: <= 2 s median for 10,000 cells.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dlscale.analysis.collect import collect
from dlscale.store import metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as common  # noqa: E402
from helpers.cells import small_cell  # noqa: E402 (tests/helpers, on the path by _common)
from helpers.synthetic_metrics import cell_records  # noqa: E402

FRAMEWORKS = common.FRAMEWORKS
MODELS = [f"m{i}" for i in range(25)]
HARDWARE = ["cpu", "v100", "a100", "h100"]
POLICIES = ["weak", "strong"]
# 4 hardware x 5 frameworks x 25 models x 2 policies x 2 node counts x 5 repetitions = 10,000
# cells of 1 or 2 ranks (one rank per node, like the demo's cells): the file sizes of real
# small-world cells. Bigger worlds scale the work with the number of rank lines (printed).
NODES = [1, 2]
REPS = 5


def write_cells(root: Path, n: int, steps: int) -> list[str]:
    paths = []
    combos = itertools.product(
        HARDWARE, FRAMEWORKS, MODELS, POLICIES, ["fp32"], NODES, range(1, REPS + 1)
    )
    for hw, fw, model, policy, prec, nodes, rep in itertools.islice(combos, n):
        cell = small_cell(
            hardware=hw,
            framework=fw,
            model=model,
            policy=policy,
            precision=prec,
            nodes=nodes,
            rep=rep,
            per_rank_batch=8,
            global_batch=8 * nodes,
            steps=steps,
            environment=f"{fw}:e",
            study="bench",
        )
        metrics.write_atomic(root / cell.path, cell_records(cell))
        paths.append(cell.path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=10000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=None)
    a = p.parse_args()
    root = a.workdir or Path(tempfile.mkdtemp(prefix="dlscale-agg-"))
    t0 = time.perf_counter()
    paths = write_cells(root, a.cells, a.steps)
    print(f"wrote {len(paths)} cells in {time.perf_counter() - t0:.1f} s under {root}")
    os.chdir(root)
    sizes = [os.path.getsize(p) for p in paths]
    lines = sum(Path(p).read_text().count("\n") for p in paths)
    print(f"{len(paths)} metrics files, {lines} record lines, {sum(sizes) / 1e6:.1f} MB")
    times, floor = [], []
    for _ in range(a.repeats):  # alternating: the collect and the floor see the same machine
        t0 = time.perf_counter()
        _, cells, scaling, quarantine, _ = collect(paths)
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p in paths:  # the floor: read and parse every line, nothing else
            [json.loads(line) for line in Path(p).read_text().splitlines()]
        floor.append(time.perf_counter() - t0)
    med, fmed = statistics.median(times), statistics.median(floor)
    print(
        f"collect: {len(cells)} cells, {len(scaling)} scaling rows, {len(quarantine)} "
        f"quarantined; median {med:.2f} s over {a.repeats} repeats "
        f"(min {min(times):.2f}, max {max(times):.2f}); goal <= 2 s at 10,000 cells"
    )
    print(
        f"floor (read + json.loads per line, no validation or tables): median {fmed:.2f} s "
        f"(min {min(floor):.2f}, max {max(floor):.2f}); collect / floor = {med / fmed:.2f}"
    )


if __name__ == "__main__":
    main()
