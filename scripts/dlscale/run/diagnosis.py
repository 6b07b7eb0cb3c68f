"""What a failed cell's record and log end with: the communication libraries' own diagnosis and
what was in effect when its ranks made first contact.

Ranks run with NCCL_DEBUG=WARN unless the user or site set NCCL_DEBUG (`with_nccl_debug`), so
NCCL says why it failed. On a failure the launcher (dlscale.run.launch.record_failure) keeps,
in failure.json's `diagnosis` and at the end of the cell's log (`render`):
  - messages: the last MESSAGE_LINES lines of the logs of the failing ranks and then the other
    unfinished ones (a peer often sees the failure first; MESSAGE_RANKS at most) that carry a
    communication library's diagnosis (MESSAGE: NCCL WARN/INFO/ERROR, gloo, MPI, Horovod, c10d,
    timeouts, rendezvous, refused connections): text for humans, never parsed for numbers;
  - first contact: how far each rank got (dlscale.run.first_contact);
  - per node: its network interfaces with their addresses and the communication variables in
    effect (COMM_PREFIXES), as its first rank saw them when it started (the launcher's own view
    where no rank started);
  - preflight: the preflight's result for the cell's hardware entry and environment
    (`preflight_result`).
"""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

from dlscale.rank.provenance import environment
from dlscale.registry import frameworks
from dlscale.run.first_contact import phase_of, read_marks
from dlscale.store.preflight_results import PREFLIGHT_DIR, result_for, summary
from dlscale.study.cell import STUDY_DIR

NCCL_DEBUG_DEFAULT = "WARN"
# variables that decide how ranks find each other and which network they use: the system's
# and each framework's (its record's comm_env)
COMM_PREFIXES = ("NCCL_", "MASTER_", "UCX_", "FI_", "OMPI_MCA_") + frameworks.comm_env()
MESSAGE = re.compile(
    r"NCCL (WARN|INFO|ERROR)|gloo|\bMPI|horovod|c10d|ProcessGroup|DistBackendError|watchdog"
    r"|timed out|timeout|rendezvous|connection (refused|reset)",
    re.IGNORECASE,
)
MESSAGE_LINES = 20  # per rank
MESSAGE_RANKS = 8


def with_nccl_debug(env: dict) -> dict:
    """A rank's environment with NCCL_DEBUG=WARN where the user or site set none."""
    env.setdefault("NCCL_DEBUG", NCCL_DEBUG_DEFAULT)
    return env


def interfaces() -> list[str]:
    """This node's network interfaces, one `name state addresses` line each (`ip -brief
    address`; the names alone where `ip` is missing)."""
    try:
        out = subprocess.run(
            ["ip", "-brief", "address"], capture_output=True, text=True, timeout=5, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [f"{name} (addresses unknown: no `ip` command)" for _, name in socket.if_nameindex()]
    return [" ".join(line.split()) for line in out.splitlines() if line.strip()]


def node_view() -> dict:
    """What a node's first rank records of its node when it starts (dlscale.run.train; the
    others record their host): its host name, interfaces and communication variables."""
    return {"host": socket.gethostname(), "interfaces": interfaces(), "variables": variables()}


def variables(env=None) -> dict:
    """The communication variables in effect (COMM_PREFIXES), secret-looking values redacted
    (dlscale.rank.provenance.environment)."""
    return {k: v for k, v in environment(env).items() if k.startswith(COMM_PREFIXES)}


def messages(log: Path) -> list[str]:
    """The last MESSAGE_LINES lines of a rank's log that match MESSAGE."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line for line in lines if MESSAGE.search(line)][-MESSAGE_LINES:]


def preflight_result(cell, study_dir=None) -> str:
    """The preflight's verdict on the cell's hardware entry and environment (the newest result
    under <study>/preflight/, dlscale.store.preflight_results), or says there is none."""
    folder = Path(study_dir or STUDY_DIR.format(study=cell.study)) / PREFLIGHT_DIR
    result = result_for(folder, cell.hardware, cell.environment)
    if result is None:
        return f"no preflight result for {cell.hardware} / {cell.environment} ({folder})"
    return summary(result)


def diagnosis(rank_dir: Path, cell, ranks, study_dir=None) -> dict:
    """The failure's diagnosis (see the module's text); `ranks`: the failing ranks, then the
    other unfinished ones."""
    marks = read_marks(rank_dir, cell.world_size)
    nodes = {}
    for rank, m in sorted(marks.items()):
        if "host" in m:
            node = nodes.setdefault(m["host"], {"ranks": [], "interfaces": [], "variables": {}})
            node["ranks"].append(rank)
            if "interfaces" in m and not node["interfaces"]:  # the node's first rank's view
                node.update(interfaces=m["interfaces"], variables=m["variables"])
    if not nodes:
        own = node_view()
        nodes[f"{own.pop('host')} (the launcher's)"] = {"ranks": [], **own}
    return {
        "messages": {str(r): messages(rank_dir / f"rank{r}.log") for r in ranks[:MESSAGE_RANKS]},
        "first_contact": {str(r): phase_of(marks, r) for r in range(cell.world_size)},
        "nodes": nodes,
        "preflight": preflight_result(cell, study_dir),
    }


def render(diag: dict) -> str:
    """The diagnosis as the last lines of the cell's log."""
    lines = ["----- diagnosis -----"]
    for rank, found in diag["messages"].items():
        lines.append(f"rank {rank}: communication messages ({len(found)}):")
        lines += [f"  {line}" for line in found] or ["  (none)"]
    lines.append(
        "first contact: " + ", ".join(f"rank {r} {p}" for r, p in diag["first_contact"].items())
    )
    for host, node in diag["nodes"].items():
        lines.append(f"node {host} (ranks {node['ranks']}): interfaces:")
        lines += [f"  {line}" for line in node["interfaces"]]
        lines.append(f"node {host}: variables in effect:")
        lines += [f"  {k}={v}" for k, v in node["variables"].items()] or ["  (none)"]
    lines.append(f"preflight: {diag['preflight']}")
    return "\n".join(lines)
