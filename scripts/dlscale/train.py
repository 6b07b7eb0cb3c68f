"""One rank of a cell: the CLI contract shared by every framework.

    python -m dlscale.train --framework F --model M --batch-size B --warmup-steps W --steps S
                            --precision P --device D --threads T --rank-dir DIR
                            [--expect-world-size N --expect-ranks-per-node R]

The rank discovers who it is from the launcher's environment, checks that against the cell
(pre-flight), trains with the framework's adapter under the shared timing loop, and writes its
own part file (rank_start, step..., rank_end) in DIR.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

from . import __version__
from .frameworks import get_adapter, names as framework_names
from .frameworks.base import TIMER, TrainSpec, run_timed
from .launch import discover
from .metrics import RankWriter, rank_summary
from .provenance import host_facts


class PreflightError(RuntimeError):
    pass


FAULT_ENV = "DLSCALE_FAULT"


def fault_hook(rank: int, rank_dir: str):
    """Fault injection for tests: DLSCALE_FAULT="<text in the cell path>:<rank>:<step>:<action>"
    makes that rank of the matching cell, before that step (warm-up counts), exit with the code
    <action>, or hang (sleep) when <action> is `hang`."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return None
    pattern, f_rank, f_step, code = spec.rsplit(":", 3)
    if pattern not in rank_dir or int(f_rank) != rank:
        return None

    def before_step(step: int) -> None:
        if step != int(f_step):
            return
        if code == "hang":
            print(f"[dlscale.train] {FAULT_ENV}: rank {rank} hangs before step {step}",
                  file=sys.stderr, flush=True)
            time.sleep(24 * 3600)
        print(f"[dlscale.train] {FAULT_ENV}: rank {rank} exits with {code} before step {step}",
              file=sys.stderr, flush=True)
        os._exit(int(code))
    return before_step


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dlscale.train", description="one data-parallel training rank")
    p.add_argument("--framework", required=True, choices=framework_names())
    p.add_argument("--model", required=True)
    p.add_argument("--batch-size", required=True, type=int, help="per-rank batch")
    p.add_argument("--warmup-steps", required=True, type=int)
    p.add_argument("--steps", required=True, type=int)
    p.add_argument("--precision", required=True, choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", required=True, choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (the rank's CPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rank-dir", required=True)
    p.add_argument("--expect-world-size", type=int)
    p.add_argument("--expect-ranks-per-node", type=int)
    return p


def preflight(ctx, expect_world: int | None, expect_rpn: int | None) -> None:
    """Fail the cell early and clearly when the launch does not match the cell."""
    problems = []
    if expect_world is not None and ctx.world_size != expect_world:
        problems.append(f"world size is {ctx.world_size}, the cell needs {expect_world}")
    if expect_rpn is not None and ctx.local_world_size != expect_rpn:
        problems.append(f"{ctx.local_world_size} rank(s) on node {ctx.node}, the cell needs {expect_rpn}")
    if problems:
        raise PreflightError(f"pre-flight check failed on rank {ctx.rank} ({ctx.launcher}): "
                             + "; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ctx = discover()
    preflight(ctx, args.expect_world_size, args.expect_ranks_per_node)
    spec = TrainSpec(framework=args.framework, model=args.model, per_rank_batch=args.batch_size,
                     warmup_steps=args.warmup_steps, steps=args.steps, precision=args.precision,
                     device=args.device, threads=args.threads, seed=args.seed)
    adapter = get_adapter(spec.framework)(spec, ctx)
    writer = RankWriter(args.rank_dir, ctx.rank)
    try:
        adapter.setup()
        facts = host_facts()  # load average just before the timed window
        writer.write("rank_start", {
            **facts, **adapter.describe(),
            "dlscale_version": __version__, "local_rank": ctx.local_rank,
            "node_index": ctx.node_index, "launcher": ctx.launcher, "device": spec.device,
            "threads": spec.threads, "per_rank_batch": spec.per_rank_batch, "timer": TIMER,
            "master": f"{ctx.master_addr}:{ctx.master_port}"})
        run = run_timed(adapter, fault_hook(ctx.rank, args.rank_dir))
        writer.write("idle_probe", run["idle_probe"])
        for i, seconds in enumerate(run["step_seconds"]):
            writer.write("step", {"step": i, "seconds": seconds, "samples": spec.per_rank_batch})
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        writer.write("rank_end", {
            **rank_summary(run["step_seconds"], spec.per_rank_batch, peak_rss_mb),
            "peak_device_memory_mb": adapter.peak_device_memory_mb(),
            "energy": run["energy"], "breakdown": run["breakdown"], "allreduce": run["allreduce"]})
    finally:
        writer.close()
        adapter.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
