"""Provenance facts recorded in every metrics file: where, with what, from which commit."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def git_commit(path: str) -> str | None:
    """The workflow's git commit (with a '+dirty' suffix when the tree has changes), or None."""
    try:
        head = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def host_facts() -> dict:
    """Facts about the process and host a rank runs on."""
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    return {
        "node": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1m": load1,
        "executable": sys.executable,
    }


def slurm_facts() -> dict:
    """The Slurm job this process belongs to, when there is one."""
    keys = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_JOB_PARTITION",
            "SLURM_CLUSTER_NAME", "SLURM_STEP_ID")
    return {k.lower(): os.environ[k] for k in keys if k in os.environ}
