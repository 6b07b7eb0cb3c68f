"""One task of a script cell: torchrun's environment, then the user's script, unmodified.

    python -m dlscale.run.script_rank --rank-dir DIR

The launcher (dlscale.run.script_cell) starts one of these per rank (launch `ranks`) or per node
(launch `torchrun`), locally or in its srun step, with the cell's command already filled in
(DIR/COMMAND_FILE). Each finds who it is from the launcher's environment
(dlscale.rank.rank_context.discover: DLSCALE_* locally, SLURM_* under srun) and starts the script
as a child process with what torchrun would have set:

    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK,
    ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT

so an unmodified script with `init_process_group("env://")` runs as it is; under launch torchrun
the task of node g runs `torchrun --nnodes N --nproc-per-node R --node-rank g --master-addr A
--master-port P --no-python <command>` instead, and torchrun sets them for its ranks. The
script's standard output and error are the task's (the rank's log). When the script ends the
task writes what it saw (TASK_FILE: its node, its ranks, the child's pid, start and end time,
exit code and peak resident set), and exits with the script's exit code. It imports nothing of
the script and never reads its output: the launcher does (dlscale.run.script_cell).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMAND_FILE = "script_command.json"  # in the rank folder: the filled argv and the geometry
TASK_FILE = "script-task{task}.json"  # one per task: what it saw
# torchrun's variables for each rank, as torch.distributed.run sets them
TORCHRUN_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def torchrun_environment(ctx, nodes: int) -> dict[str, str]:
    """torchrun's variables of the rank `ctx` (a RankContext) of a job on `nodes` nodes."""
    return {
        "RANK": str(ctx.rank),
        "LOCAL_RANK": str(ctx.local_rank),
        "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_WORLD_SIZE": str(ctx.local_world_size),
        "GROUP_RANK": str(ctx.node_index),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_RANK": str(ctx.rank),
        "ROLE_WORLD_SIZE": str(ctx.world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": ctx.master_addr,
        "MASTER_PORT": str(ctx.master_port),
    }


def torchrun_argv(python: str, argv: list[str], nodes: int, per_node: int, ctx) -> list[str]:
    """The task of node ctx.node_index under launch torchrun: torchrun with a static rendezvous
    at MASTER_ADDR:MASTER_PORT, running the command as given (--no-python)."""
    return [
        python,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        f"--node-rank={ctx.node_index}",
        f"--master-addr={ctx.master_addr}",
        f"--master-port={ctx.master_port}",
        "--no-python",
        *argv,
    ]


def _libraries() -> dict:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for name in ("torch", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def _device_model(device: str) -> str:
    """The GPU's name from the driver's proc files on a cuda cell (no subprocess), else the
    CPU's."""
    from dlscale.rank.provenance import cpu_model

    if device == "cuda":
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            try:
                for line in info.read_text().splitlines():
                    if line.startswith("Model:"):
                        return line.split(":", 1)[1].strip()
            except OSError:
                continue
        return "cuda device (not named by the driver's proc files)"
    return cpu_model()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dlscale-script-rank", description=__doc__.split("\n")[0])
    parser.add_argument("--rank-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    from dlscale.rank.node_probes import cpu_affinity
    from dlscale.rank.provenance import cpu_model
    from dlscale.rank.rank_context import discover

    spec = json.loads((args.rank_dir / COMMAND_FILE).read_text())
    ctx = discover()
    nodes, per_node = spec["nodes"], spec["ranks_per_node"]
    env = dict(os.environ)
    if spec["launch"] == "torchrun":
        command = torchrun_argv(sys.executable, spec["argv"], nodes, per_node, ctx)
        ranks = list(range(ctx.node_index * per_node, (ctx.node_index + 1) * per_node))
        task = ctx.node_index
    else:
        env.update(torchrun_environment(ctx, nodes))
        command, ranks, task = spec["argv"], [ctx.rank], ctx.rank
    facts = {
        "task": task,
        "ranks": ranks,
        "node": ctx.node,
        "node_index": ctx.node_index,
        "local_ranks": [r % per_node for r in ranks],
        "launcher": ctx.launcher,
        "threads": int(env.get("OMP_NUM_THREADS", "0") or 0) or None,
        "loadavg_1m": os.getloadavg()[0],
        "cpu_affinity": cpu_affinity(),
        "cpu_model": cpu_model(),
        "device_model": _device_model(spec["device"]),
        "python": sys.version.split()[0],
        "libraries": _libraries(),
        "torchrun_environment": {k: env[k] for k in TORCHRUN_VARIABLES if k in env},
        "argv": command,
    }
    started = time.time()
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:  # the program cannot start: the cell fails with this line
        print(f"[dlscale.run.script_rank] cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127

    def forward(signum, frame):  # the launcher stops the task: stop the script with it
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    code = child.wait()
    ended = time.time()
    facts.update(
        pid=child.pid,
        started=started,
        ended=ended,
        seconds=ended - started,
        exit_code=code,
        # the largest resident set of the script's processes (ru_maxrss, KiB on Linux)
        peak_rss_mb=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    )
    path = args.rank_dir / TASK_FILE.format(task=task)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(facts))
    os.replace(tmp, path)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
