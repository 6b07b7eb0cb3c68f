"""The system a cell ran on, described by rank-local probes.

`node_description()` is called once per node of a cell (by its local rank 0, after the
framework's setup and before the timed window) and returns one JSON-able dict, written into that
rank's `rank_start` record as `system`. Every rank also records the CPU set it is bound to
(`cpu_affinity`). Each section is a dict with `available: true` and its facts, or
`available: false` and the `reason` it could not be read: a probe never fails the cell.

Sections: os, cpu, memory, gpu (nvidia-smi: model, count, memory, driver; `nvidia-smi topo -m`),
network (interfaces from /sys/class/net, InfiniBand/RoCE ports from /sys/class/infiniband),
slurm (version; the job's allocation from `scontrol show job`, on rank 0 only so the
controller is asked once per cell), packages (sha256 and count of the environment's
`name==version` list; the list itself is written once per study by the launcher:
results/<study>/environments/<sha256>.txt). The framework's build description (CUDA runtime,
cuDNN, NCCL, torch.__config__.show(), TF build info, MXNet features) comes from the adapter
(`Adapter.build_info`). The run-shaping environment variables are recorded by every rank already
(dlscale.rank.provenance.environment, secrets redacted).

Pure Python (no third-party imports): importable in every framework environment and runnable
alone, `python -m dlscale.rank.node_probes [--repeat N]`, which prints the description (or, with
--repeat, the cost of N probes: benchmarks/reports/2026-11-23-system-probes.md).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

PROBE_VERSION = 1
# The package list a node's local rank 0 leaves beside its part file (named by its sha256).
PACKAGES_FILE = "packages-{sha256}.txt"
COMMAND_TIMEOUT_S = 5.0  # one external tool (nvidia-smi, scontrol) may take at most this long

# Fields of `scontrol show job -o` kept in the record: the allocation, never paths or commands.
SCONTROL_JOB_FIELDS = (
    "JobId",
    "Partition",
    "NodeList",
    "NumNodes",
    "NumCPUs",
    "NumTasks",
    "CPUs/Task",
    "ReqB:S:C:T",
    "Socks/Node",
    "NtasksPerN:B:S:C",
    "CoreSpec",
    "MinCPUsNode",
    "MinMemoryNode",
    "MinMemoryCPU",
    "TRES",
    "AllocTRES",
    "TresPerNode",
    "TresPerJob",
    "Gres",
    "OverSubscribe",
    "Contiguous",
    "Features",
    "TimeLimit",
)
# The binding of the ranks' step, as srun exports it.
SLURM_BINDING_ENV = (
    "SLURM_CPU_BIND",
    "SLURM_CPU_BIND_TYPE",
    "SLURM_CPU_BIND_LIST",
    "SLURM_DISTRIBUTION",
    "SLURM_CPUS_PER_TASK",
    "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE",
    "SLURM_STEP_GPUS",
    "SLURM_MEM_PER_NODE",
    "SLURM_MEM_PER_CPU",
)


def unavailable(reason: str) -> dict:
    return {"available": False, "reason": reason}


def run_tool(argv: list[str], timeout: float = COMMAND_TIMEOUT_S) -> tuple[str | None, str]:
    """(stdout, "") of a command, or (None, why it gave nothing)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"{' '.join(argv)} did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"{argv[0]}: {exc.strerror}"
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        return None, f"{' '.join(argv)} exited with {proc.returncode}" + (
            f": {err[-1][:200]}" if err else ""
        )
    return proc.stdout, ""


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def cpu_list(cpus) -> str:
    """A CPU set as Linux writes it: {0,1,2,3,8} -> "0-3,8"."""
    cpus = sorted(cpus)
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)


def cpu_affinity() -> str | None:
    """The CPUs this process may run on (its binding), as a CPU list."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return cpu_list(os.sched_getaffinity(0))


# ----------------------------------------------------------------------------- sections
def os_facts() -> dict:
    release = {}
    text = _read("/etc/os-release") or ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        release[key] = value.strip().strip('"')
    libc = platform.libc_ver()
    return {
        "available": True,
        "name": release.get("PRETTY_NAME") or platform.system(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "libc": " ".join(v for v in libc if v) or None,
    }


def cpu_facts(sys_root: str = "/sys/devices/system/cpu", cpuinfo: str = "/proc/cpuinfo") -> dict:
    """Model, sockets, cores and threads per core from sysfs topology (whole node, not only the
    CPUs this process may use), maximum frequency, NUMA nodes."""
    model = None
    for line in (_read(cpuinfo) or "").splitlines():
        if line.startswith("model name"):  # x86; ARM's /proc/cpuinfo may have none
            model = line.split(":", 1)[1].strip()
            break
    cores, sockets, logical = set(), set(), 0
    for topo in Path(sys_root).glob("cpu[0-9]*/topology"):
        package, core = _read(topo / "physical_package_id"), _read(topo / "core_id")
        if package is None or core is None:
            continue
        logical += 1
        sockets.add(package)
        cores.add((package, core))
    if not logical:
        logical = os.cpu_count() or 0
    max_khz = _read(Path(sys_root) / "cpu0/cpufreq/cpuinfo_max_freq")
    numa = len(list(Path(sys_root).parent.glob("node/node[0-9]*")))
    return {
        "available": True,
        "model": model or platform.processor() or None,
        "logical_cpus": logical,
        "sockets": len(sockets) or None,
        "cores_per_socket": (len(cores) // len(sockets)) if sockets else None,
        "threads_per_core": (logical // len(cores)) if cores else None,
        "max_mhz": round(int(max_khz) / 1000) if max_khz and max_khz.isdigit() else None,
        "numa_nodes": numa or None,
    }


def memory_facts(meminfo: str = "/proc/meminfo") -> dict:
    text = _read(meminfo)
    if text is None:
        return unavailable(f"{meminfo} not readable")
    total = re.search(r"^MemTotal:\s+(\d+) kB", text, re.MULTILINE)
    if not total:
        return unavailable(f"no MemTotal in {meminfo}")
    facts = {"available": True, "total_mib": int(total.group(1)) // 1024, "cgroup_limit_mib": None}
    # the job's memory limit (Slurm's cgroup, cgroup v2), where this process has one
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        if line.startswith("0::"):
            limit = _read(f"/sys/fs/cgroup{line[3:]}/memory.max")
            if limit and limit.isdigit():
                facts["cgroup_limit_mib"] = int(limit) // (1 << 20)
    return facts


GPU_QUERY = "index,name,uuid,memory.total,driver_version,pci.bus_id"


def parse_gpu_query(text: str) -> list[dict]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` -> one dict per GPU."""
    gpus = []
    for line in text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 6:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, name, uuid, memory, driver, bus = fields
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "uuid": uuid,
                "memory_mib": int(float(memory)) if memory.replace(".", "").isdigit() else None,
                "driver": driver,
                "pci_bus_id": bus,
            }
        )
    return gpus


def parse_topology(text: str) -> dict:
    """`nvidia-smi topo -m` -> {"matrix": {gpu: {peer: link}}, "links": sorted distinct GPU-GPU
    link types, "cpu_affinity": {gpu: cpus}, "numa_affinity": {gpu: node}}."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]
    header = next((line for line in lines if line.strip().startswith("GPU0")), None)
    if header is None:
        raise ValueError("no GPU0 header in nvidia-smi topo -m output")
    columns = re.split(r"\t+|\s{2,}", header.strip())
    matrix, cpus, numa = {}, {}, {}
    for line in lines[lines.index(header) + 1 :]:
        cells = [c.strip() for c in re.split(r"\t+|\s{2,}", line.strip())]
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = dict(zip(columns, cells[1:]))
        gpu = cells[0]
        matrix[gpu] = {c: v for c, v in row.items() if re.fullmatch(r"GPU\d+", c) and c != gpu}
        if "CPU Affinity" in row:
            cpus[gpu] = row["CPU Affinity"]
        if "NUMA Affinity" in row:
            numa[gpu] = row["NUMA Affinity"]
    links = sorted({v for peers in matrix.values() for v in peers.values() if v != "X"})
    return {"matrix": matrix, "links": links, "cpu_affinity": cpus, "numa_affinity": numa}


def gpu_facts() -> dict:
    out, why = run_tool(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    if out is None:
        return unavailable(f"no NVIDIA GPU description: {why}")
    try:
        gpus = parse_gpu_query(out)
    except ValueError as exc:
        return unavailable(str(exc))
    facts = {
        "available": True,
        "count": len(gpus),
        "models": sorted({g["name"] for g in gpus}),
        "drivers": sorted({g["driver"] for g in gpus}),
        "devices": gpus,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if len(gpus) < 2:
        facts["topology"] = unavailable("fewer than 2 GPUs: no GPU-GPU interconnect")
        return facts
    topo, why = run_tool(["nvidia-smi", "topo", "-m"])
    if topo is None:
        facts["topology"] = unavailable(why)
    else:
        try:
            facts["topology"] = {"available": True, **parse_topology(topo), "text": topo.strip()}
        except ValueError as exc:
            facts["topology"] = unavailable(str(exc))
    return facts


NET_TYPES = {"1": "ethernet", "32": "infiniband", "772": "loopback"}


def network_facts(net_root: str = "/sys/class/net", ib_root: str = "/sys/class/infiniband") -> dict:
    interfaces = []
    for dev in sorted(Path(net_root).glob("*")):
        kind = NET_TYPES.get(_read(dev / "type") or "", _read(dev / "type"))
        if kind == "loopback":
            continue
        speed = _read(dev / "speed")  # Mb/s; unreadable or -1 where the link reports none
        driver = os.path.basename(os.path.realpath(dev / "device" / "driver"))
        interfaces.append(
            {
                "name": dev.name,
                "type": kind,
                "state": _read(dev / "operstate"),
                "speed_mbps": int(speed) if speed and speed.isdigit() and int(speed) > 0 else None,
                "mtu": int(_read(dev / "mtu") or 0) or None,
                "driver": driver if (dev / "device" / "driver").exists() else None,
            }
        )
    rdma = []
    ib = Path(ib_root)
    for dev in sorted(ib.glob("*")):
        for port in sorted((dev / "ports").glob("*")):
            rdma.append(
                {
                    "device": dev.name,
                    "port": port.name,
                    "link_layer": _read(port / "link_layer"),  # InfiniBand, or Ethernet = RoCE
                    "rate": _read(port / "rate"),  # e.g. "200 Gb/sec (4X HDR)"
                    "state": _read(port / "state"),
                    "firmware": _read(dev / "fw_ver"),
                }
            )
    return {
        "available": True,
        "interfaces": interfaces,
        "rdma": rdma
        if rdma
        else unavailable(f"no RDMA device ({ib_root} {'empty' if ib.exists() else 'absent'})"),
    }


def parse_scontrol_job(text: str) -> dict:
    """`scontrol show job -o ID` (one line of Key=Value) -> the allocation fields kept."""
    fields = {}
    for token in re.split(r"\s+(?=[A-Za-z/:]+=)", text.strip()):
        key, sep, value = token.partition("=")
        if sep and key in SCONTROL_JOB_FIELDS:
            fields[key] = value
    return fields


# What the launcher records of a cell's job (slurm_job.json, kept with its measurement), from
# `scontrol show job -d -o`: these fields, and per node its CPUs, memory and GRES with indices.
ALLOCATION_FIELDS = (
    "Partition",
    "NodeList",
    "NumNodes",
    "NumTasks",
    "TRES",
    "TresPerNode",
    "JOB_GRES",
)
ALLOCATION_NODE_FIELDS = ("CPU_IDs", "Mem", "GRES")


def parse_allocation(text: str) -> dict:
    """`scontrol show job -d -o ID` -> ALLOCATION_FIELDS (lower case) and `per_node`: one entry
    per `Nodes=` group of the detail (`Nodes=n1 CPU_IDs=0 Mem=1500 GRES=gpu:fake:1(IDX:0)`)."""
    found: dict = {"per_node": []}
    node: dict | None = None
    for token in re.split(r"\s+(?=[A-Za-z/:_]+=)", text.strip()):
        key, sep, value = token.partition("=")
        if not sep:
            continue
        if key == "Nodes":  # a per-node group of -d starts with Nodes=
            node = {"nodes": value}
            found["per_node"].append(node)
        elif node is not None and key in ALLOCATION_NODE_FIELDS:
            node[key.lower()] = value
        elif key in ALLOCATION_FIELDS:
            found[key.lower()] = value
            node = None
    return found


def job_allocation(job_id: str) -> dict | None:
    """The job's allocation (parse_allocation), None when Slurm cannot say."""
    out, _ = run_tool(["scontrol", "show", "job", "-d", "-o", str(job_id)])
    return parse_allocation(out) if out else None


def slurm_facts(ask_controller: bool) -> dict:
    version, why = run_tool(["scontrol", "--version"])
    facts = {
        "available": version is not None,
        "version": version.strip() if version else None,
        "binding": {k: os.environ[k] for k in SLURM_BINDING_ENV if k in os.environ},
    }
    if version is None:
        facts["reason"] = why
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        facts["job"] = unavailable("not in a Slurm job (SLURM_JOB_ID unset)")
    elif not ask_controller:
        facts["job"] = unavailable("recorded by rank 0 only (one controller query per cell)")
    else:
        out, why = run_tool(["scontrol", "show", "job", "-o", job])
        facts["job"] = {"available": True, **parse_scontrol_job(out)} if out else unavailable(why)
    return facts


def package_list() -> str:
    """The environment's packages, one `name==version` a line, sorted (the hashed text)."""
    seen = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            seen.add(f"{re.sub(r'[-_.]+', '-', name).lower()}=={dist.version}")
    return "".join(f"{line}\n" for line in sorted(seen))


def package_facts(text: str | None = None) -> dict:
    text = package_list() if text is None else text
    return {
        "available": True,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "count": text.count("\n"),
        "python": platform.python_version(),
        "prefix": sys.prefix,
    }


SECTIONS = ("os", "cpu", "memory", "gpu", "network", "slurm", "packages", "framework_build")


def node_description(
    *, ask_controller: bool = True, packages: str | None = None, build_info=None
) -> dict:
    """Every section, each guarded: a probe that raises is recorded as unavailable, with why.
    `packages`: the package list when the caller already has it; `build_info`: the framework
    adapter's build_info (section `framework_build`)."""
    started = time.perf_counter()
    probes = {
        "os": os_facts,
        "cpu": cpu_facts,
        "memory": memory_facts,
        "gpu": gpu_facts,
        "network": network_facts,
        "slurm": lambda: slurm_facts(ask_controller),
        "packages": lambda: package_facts(packages),
        "framework_build": build_info or (lambda: unavailable("no framework in this process")),
    }
    out = {"probe_version": PROBE_VERSION}
    for name, probe in probes.items():
        try:
            out[name] = probe()
        except Exception as exc:  # a probe never fails the cell
            out[name] = unavailable(f"probe failed: {exc!r}"[:300])
    out["probe_seconds"] = round(time.perf_counter() - started, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import statistics

    p = argparse.ArgumentParser(
        prog="dlscale.rank.node_probes", description=__doc__.splitlines()[0]
    )
    p.add_argument("--repeat", type=int, default=0, help="time N probes instead of printing one")
    args = p.parse_args(argv)
    if not args.repeat:
        print(json.dumps(node_description(), indent=1))
        return 0
    seconds = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        node_description(ask_controller=bool(os.environ.get("SLURM_JOB_ID")))
        cpu_affinity()
        seconds.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "n": len(seconds),
                "median_s": round(statistics.median(seconds), 4),
                "min_s": round(min(seconds), 4),
                "max_s": round(max(seconds), 4),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
