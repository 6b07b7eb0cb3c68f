"""Provenance facts recorded in every metrics file: where, with what, from which commit."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

from dlscale.registry import frameworks
from dlscale.study.cell import SITE_ENV_FILE


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


# The project's root: the checkout this package is part of (scripts/dlscale/run/ -> the root).
PROJECT_ROOT = Path(__file__).resolve().parents[3]


def project_root() -> Path:
    """PROJECT_ROOT when this package runs from a project checkout (it has a Snakefile), else
    the working directory (a job runs in the workflow's directory)."""
    return PROJECT_ROOT if (PROJECT_ROOT / "Snakefile").is_file() else Path.cwd()


# What the workflow's behaviour is made of, hashed when the project is not a git checkout.
SOURCE_PARTS = ("Snakefile", "rules", "scripts", "config/schemas", "envs", "profiles")
SOURCE_SUFFIXES = (
    ".py",
    ".smk",
    ".json",
    ".j2",
    ".txt",
    ".yaml",
    ".yml",
    ".patch",
    ".sh",
    ".mplstyle",
)
NOT_A_CHECKOUT = "not a git checkout"


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
    )


def sources_hash(root: str | Path = PROJECT_ROOT) -> str:
    """sha256 over the workflow's sources (SOURCE_PARTS: every file with a source suffix, by
    relative path and content), the first 16 hex digits."""
    root = Path(root)
    digest = hashlib.sha256()
    for part in SOURCE_PARTS:
        base = root / part
        files = [base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []
        for path in files:
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if path is not base and path.suffix not in SOURCE_SUFFIXES:
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def git_commit(path: str | Path | None = None) -> str:
    """The project's own commit (with '+dirty' when its tracked files have changes), read only
    when `path` is the top of a git checkout: a project copied into another repository's tree
    is not that repository's commit. Otherwise `not a git checkout (sources sha256:<hash>)`,
    a content hash of the workflow sources (sources_hash)."""
    root = Path(path if path is not None else project_root()).resolve()
    try:
        top = _git(root, "rev-parse", "--show-toplevel")
        if top.returncode == 0 and Path(top.stdout.strip()).resolve() == root:
            head = _git(root, "rev-parse", "HEAD")
            if head.returncode == 0:
                dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
                return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return f"{NOT_A_CHECKOUT} (sources sha256:{sources_hash(root)})"
    except OSError:
        return NOT_A_CHECKOUT


# Environment variables that shape a run, recorded with every rank: the system's and the
# launcher's (below) and each framework's own (its record's env_prefixes); values of names that
# look secret are never written.
SYSTEM_PREFIXES = (
    "SLURM_",
    "OMP_",
    "MKL_",
    "KMP_",
    "CUDA_",
    "NCCL_",
    "DLSCALE_",
    "MASTER_",
    "OPENBLAS_",
    "UCX_",
    "FI_",
)
ENV_PREFIXES = SYSTEM_PREFIXES + frameworks.env_prefixes()
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "AUTH")
REDACTED = "<redacted>"


def _shown(name: str, value: str | None) -> str | None:
    """A variable's value as a record keeps it: REDACTED where its name looks secret."""
    return REDACTED if value is not None and any(w in name.upper() for w in SECRET_WORDS) else value


def environment(env=None) -> dict:
    """The run-shaping environment variables (ENV_PREFIXES), secret-looking values redacted."""
    env = os.environ if env is None else env
    return {k: _shown(k, v) for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def site_environment(rank_dir: str | Path, env=None) -> dict | None:
    """What the hardware entry's modules and env made of this rank's environment: the launcher's
    record (SITE_ENV_FILE, dlscale.run.site_env) with the value this rank sees of every variable
    the module command set, changed or removed (`module_vars`; null: unset) and of every `env:`
    variable, secret-looking values redacted. None where the entry sets neither."""
    path = Path(rank_dir) / SITE_ENV_FILE
    if not path.is_file():
        return None
    site = json.loads(path.read_text())
    env = os.environ if env is None else env
    for key in ("module_vars", "env"):
        site[key] = {name: _shown(name, env.get(name)) for name in site[key]}
    return site


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc/self/stat start time against
    /proc/uptime, 10 ms resolution); None where they cannot be read."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


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
        "environment": environment(),
    }


def slurm_facts() -> dict:
    """The Slurm job this process belongs to, when there is one."""
    keys = (
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_JOB_NODELIST",
        "SLURM_JOB_PARTITION",
        "SLURM_CLUSTER_NAME",
        "SLURM_STEP_ID",
    )
    return {k.lower(): os.environ[k] for k in keys if k in os.environ}


def _cpu_jiffies() -> tuple[int, int]:
    """(total, idle) jiffies of all CPUs from /proc/stat (idle includes iowait; guests excluded)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:9]]
    return sum(values), values[3] + values[4]


def _process_jiffies() -> dict[int, tuple[str, int]]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                data = fh.read()
            fields = data[data.rindex(")") + 2 :].split()
            out[int(name)] = (
                data[data.index("(") + 1 : data.rindex(")")],
                int(fields[11]) + int(fields[12]),
            )  # utime + stime
        except (OSError, ValueError, IndexError):
            continue
    return out


def host_activity(window_s: float, top: int = 3) -> dict:
    """CPU use of the whole host over `window_s` while this cell's ranks sit idle: whatever is
    busy then competes with the measurement. Returns busy CPUs and the busiest processes."""
    try:
        total0, idle0 = _cpu_jiffies()
        procs0 = _process_jiffies()
        time.sleep(window_s)
        total1, idle1 = _cpu_jiffies()
        procs1 = _process_jiffies()
    except OSError:
        return {
            "window_s": window_s,
            "busy_cpus": None,
            "top_processes": [],
            "method": "unavailable (/proc not readable)",
        }
    d_total = total1 - total0
    busy = (d_total - (idle1 - idle0)) / d_total * (os.cpu_count() or 1) if d_total else 0.0
    hz = os.sysconf("SC_CLK_TCK")
    users = sorted(
        ((procs1[p][1] - procs0[p][1]) / hz / window_s, p, procs1[p][0])
        for p in procs1
        if p in procs0 and p != os.getpid()
    )
    return {
        "window_s": window_s,
        "busy_cpus": round(busy, 3),
        "top_processes": [
            {"pid": p, "comm": c, "cpus": round(u, 3)}
            for u, p, c in reversed(users[-top:])
            if u > 0
        ],
        "method": "/proc/stat and /proc/<pid>/stat deltas while all ranks wait",
    }


def smi_number(text: str) -> float | None:
    """One nvidia-smi value as a number, or None where the board does not report it
    (`[N/A]`, `N/A`, `[Not Supported]`: MIG instances and some boards)."""
    try:
        return float(text.strip())
    except ValueError:
        return None


def parse_gpu_activity(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used` (csv, noheader,
    nounits) -> one dict per GPU; a value a board does not report is None with the reason."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [v.strip() for v in line.split(",")]
        if len(fields) != 4:
            continue  # not a GPU line (a MIG table or a warning): nothing to read
        index, uuid, util, mem = fields
        gpu = {
            "index": int(index) if index.isdigit() else None,
            "uuid": uuid or None,
            "utilization_pct": smi_number(util),
            "memory_used_mb": smi_number(mem),
        }
        missing = {k: v for k, v in (("utilization.gpu", util), ("memory.used", mem))}
        missing = {k: v for k, v in missing.items() if smi_number(v) is None}
        if missing:
            gpu["unavailable"] = (
                "nvidia-smi reports "
                + ", ".join(f"{k} as {v!r}" for k, v in missing.items())
                + " (a MIG instance or a board without the counter)"
            )
        gpus.append(gpu)
    return gpus


def gpu_activity() -> list[dict] | dict:
    """Utilisation and memory of every visible NVIDIA GPU (nvidia-smi), or
    {"available": False, "reason"} where they cannot be read."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"available": False, "reason": f"nvidia-smi could not run: {exc!r}"}
    if out.returncode != 0:
        return {
            "available": False,
            "reason": f"nvidia-smi exited {out.returncode}: {out.stderr.strip()[-200:]}",
        }
    try:
        return parse_gpu_activity(out.stdout)
    except ValueError as exc:
        return {"available": False, "reason": f"unexpected nvidia-smi output: {exc}"}
