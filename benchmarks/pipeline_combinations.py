"""The 8-rank pipeline combinations: llama3_debug on 8 gloo ranks, one process each
(tests/helpers/parallel_ranks.py: the production PyTorch adapter, 3 AdamW steps), against the
single-process loss on the same global batch, with each rank's state bytes beside its stage's
share. Too slow for the test command on a 2-core machine; the test command keeps the 2- and
4-rank cases (tests/unit/frameworks/test_torch_pipeline.py).

    PYTHONPATH=scripts .venv/bin/python benchmarks/pipeline_combinations.py \
        [--strategies pp+fsdp+tp:1f1b:pp2,...] [--nodes 2] [--ranks-per-node 4] [--tp 2]

Default: pp 2 x dp_shard 2 x tp 2 (pp+fsdp+tp) under 1f1b and under interleaved_1f1b, and
pp 2 x 4 replicas (pp, FSDP2 over (dp_replicate, 1)), 2 nodes x 4 ranks (tp inside a node),
all in the same 8 processes. Prints one row per strategy: the loss's relative difference from
the single-process loss (the target: 1e-4), the bubble fraction, and per rank the state bytes
measured and predicted and the stage's pieces; exits 1 where a loss misses the target.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
RTOL = 1e-4
DEFAULT = "pp+fsdp+tp:1f1b:pp2,pp+fsdp+tp:interleaved_1f1b:pp2,pp:1f1b:pp2"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=DEFAULT)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--ranks-per-node", type=int, default=4)
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args()

    from dlscale.run.launchers.ports import local_port

    from helpers.parallel_ranks import reference_loss

    world = args.nodes * args.ranks_per_node
    tokens = args.strategies.split(",")
    ports = [local_port(world) for _ in tokens]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"rank{r}.json" for r in range(world)]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                [sys.executable, str(REPO / "tests" / "helpers" / "parallel_ranks.py")]
                + [str(r), str(world), str(args.ranks_per_node), ",".join(map(str, ports))]
                + [",".join(tokens), str(args.tp), str(outs[r]), "llama3_debug", "adamw"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(world)
        ]
        logs = [p.communicate(timeout=1800)[0] for p in procs]
        wall = time.perf_counter() - start
        for r, (p, log) in enumerate(zip(procs, logs)):
            if p.returncode:
                print(f"rank {r} failed:\n{log[-3000:]}")
                return 1
        ranks = [json.loads(o.read_text()) for o in outs]
    if len(tokens) == 1:
        ranks = [{tokens[0]: r} for r in ranks]
    expected = reference_loss(world, "llama3_debug", "adamw")
    print(
        f"{world} ranks ({args.nodes} nodes x {args.ranks_per_node}), {len(tokens)} strategies "
        f"in {wall:.1f} s; single-process loss {expected:.8f}"
    )
    failed = False
    for token in tokens:
        losses = {r[token]["loss"] for r in ranks}
        loss = losses.pop() if len(losses) == 1 else float("nan")
        rel = abs(loss - expected) / expected
        facts = ranks[0][token]["execution"]
        pipe = facts["pipeline"]
        ok = rel <= RTOL
        failed |= not ok
        print(
            f"\n{token}: dims {facts['dims']}, {pipe['schedule']} over {pipe['microbatches']} "
            f"micro-batches, bubble {pipe['bubble_fraction']:.3f}; loss {loss:.8f}, "
            f"relative difference {rel:.2e} ({'ok' if ok else 'MISSES 1e-4'})"
        )
        print(f"  {'rank':>4} {'stages':>8} {'state bytes':>12} {'predicted':>12}  pieces")
        for r, rank in enumerate(ranks):
            rec = rank[token]
            memory = rec["memory"]
            state = memory["param_bytes"] + memory["grad_bytes"] + memory["optimizer_state_bytes"]
            stages = rec["execution"]["pipeline"]["local_stages"]
            print(
                f"  {r:>4} {','.join(str(s['stage']) for s in stages):>8} {state:>12} "
                f"{memory['predicted']['state_bytes']:>12}  "
                + " | ".join(" ".join(s["pieces"]) for s in stages)
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
