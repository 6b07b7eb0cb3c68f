"""The Systems table: what each hardware entry of a study was, from the probes its cells recorded.

Each node's local rank 0 records a system description in its `rank_start`
(dlscale.rank.node_probes); every rank records its CPU binding and run-shaping environment, and
the hardware entry's modules and env where it has any (`site_env`). `cell_systems` turns one
cell's records into one row per node and field (a readable value each); `systems_table`
summarises a study per hardware entry, field and value, and flags fields whose value differs
between the nodes of one cell (e.g. two driver versions in one job). The report prints it with
the MLPerf system-description field each row fills (`MLPERF_FIELDS`), and names those it does
not.

Analysis side: imports neither the launcher nor the frameworks.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd

from dlscale.registry import frameworks
from dlscale.study.protocol import RANK_START

NOT_RECORDED = "not recorded (measured before the system probes)"
MAX_VALUES = 6  # distinct values of one field listed per hardware entry; the rest are counted

# The environment variables the Systems table shows (every rank records more: provenance): the
# system's and each framework's own (its record's env_prefixes).
PERFORMANCE_ENV = ("NCCL_", "UCX_", "OMP_", "MKL_", "CUDA_VISIBLE_DEVICES", "FI_", "KMP_")
PERFORMANCE_ENV += frameworks.env_prefixes()

# MLPerf Training system-description fields (system_desc JSON of a submission), by whether the
# Systems table fills them.
MLPERF_NOT_COVERED = (
    "submitter",
    "division",
    "status",
    "system_name",
    "host_processor_caches",
    "host_processor_interconnect",
    "host_storage_type",
    "host_storage_capacity",
    "host_networking_topology",
    "accelerator_frequency",
    "accelerator_host_interconnect",
    "accelerator_on-chip_memories",
    "accelerator_memory_configuration",
    "cooling",
    "hw_notes",
)

# field -> the MLPerf system-description field(s) it fills; the table's rows, in this order.
# The placement row (gpu_placement) and how its value starts when a rank ran away from its GPU.
PLACEMENT_FIELD = "GPU ranks on their GPU's NUMA node"
PLACEMENT_AWAY = "AWAY from their GPU's NUMA node"
MLPERF_FIELDS = {
    "Nodes per cell": "number_of_nodes",
    "Operating system": "operating_system",
    "CPU model": "host_processor_model_name",
    "CPU sockets per node": "host_processors_per_node",
    "Cores per socket": "host_processor_core_count",
    "Logical CPUs per node": "host_processor_vcpu_count",
    "CPU max frequency": "host_processor_frequency",
    "Node memory": "host_memory_capacity, host_memory_configuration (NUMA)",
    "Accelerators per node": "accelerators_per_node",
    "Accelerator model": "accelerator_model_name",
    "Accelerator memory": "accelerator_memory_capacity",
    "GPU interconnect": "accelerator_interconnect, accelerator_interconnect_topology",
    "GPU driver": "other_software_stack",
    "CUDA runtime / cuDNN / NCCL": "other_software_stack",
    "Network interfaces": "host_networking",
    "InfiniBand / RoCE": "host_networking",
    "Framework": "framework",
    "Framework build": "framework, sw_notes",
    "Python": "other_software_stack",
    "Package environment": "other_software_stack",
    "Slurm": "sw_notes",
    "Allocation": "sw_notes",
    "CPU binding per rank": "sw_notes",
    PLACEMENT_FIELD: "sw_notes",
    "Performance environment": "sw_notes",
    "Modules": "other_software_stack",
    "Site environment (env:)": "sw_notes",
    "Container": "other_software_stack",
}
# Fields a cell has once (not per node): never a disagreement between nodes.
PER_CELL = ("Nodes per cell", "Allocation", "Framework", "Container")


def _why(section) -> str | None:
    if not isinstance(section, dict):
        return "not recorded"
    return None if section.get("available") else section.get("reason", "unavailable")


def _gib(mib) -> str:
    return f"{mib / 1024:.1f} GiB" if mib else "unknown"


def _cpu(system, key, fmt="{}"):
    cpu = system.get("cpu", {})
    why = _why(cpu)
    if why:
        return why
    return fmt.format(cpu[key]) if cpu.get(key) is not None else "not exposed"


def _memory(system) -> str:
    mem = system.get("memory", {})
    why = _why(mem)
    if why:
        return why
    numa = system.get("cpu", {}).get("numa_nodes")
    out = _gib(mem["total_mib"]) + (f", {numa} NUMA node(s)" if numa else "")
    if mem.get("cgroup_limit_mib"):
        out += f" (job limit {_gib(mem['cgroup_limit_mib'])})"
    return out


def _gpu(system, what: str) -> str:
    gpu = system.get("gpu", {})
    why = _why(gpu)
    if why:
        return "0 (" + why + ")" if what == "count" else "none (" + why + ")"
    if what == "count":
        return str(gpu["count"])
    if what == "model":
        return ", ".join(gpu["models"])
    if what == "memory":
        return ", ".join(sorted({_gib(d["memory_mib"]) for d in gpu["devices"]}))
    if what == "driver":
        return ", ".join(gpu["drivers"])
    topo = gpu.get("topology", {})
    why = _why(topo)
    return why if why else "GPU-GPU links: " + ", ".join(topo["links"])


def _libraries(system) -> str:
    build = system.get("framework_build", {})
    why = _why(build)
    if why:
        return why
    return "CUDA {} / cuDNN {} / NCCL {}".format(
        *(build.get(k) or "none" for k in ("cuda_runtime", "cudnn", "nccl"))
    )


def _build(system) -> str:
    build = system.get("framework_build", {})
    why = _why(build)
    if why:
        return why
    text = json.dumps(build.get("build"), sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return f"{build['framework']} {build['version']}, build description sha256 {digest}"


def _interfaces(system) -> str:
    net = system.get("network", {})
    why = _why(net)
    if why:
        return why
    out = []
    for i in net["interfaces"]:
        if i["state"] != "up":
            continue
        speed = f"{i['speed_mbps']} Mb/s" if i["speed_mbps"] else "speed not reported"
        out.append(f"{i['name']} ({i['type']}, {speed}, MTU {i['mtu']}, {i['driver'] or '?'})")
    return "; ".join(out) or "no interface up"


def _rdma(system) -> str:
    net = system.get("network", {})
    why = _why(net)
    if why:
        return why
    rdma = net["rdma"]
    if isinstance(rdma, dict):
        return _why(rdma) or "none"
    return "; ".join(
        f"{p['device']}/{p['port']} {p['link_layer']} {p['rate']} {p['state']}" for p in rdma
    )


def _slurm(system) -> str:
    slurm = system.get("slurm", {})
    return slurm.get("version") or _why(slurm) or "unknown"


def _allocation(system) -> str | None:
    job = system.get("slurm", {}).get("job", {})
    if not isinstance(job, dict) or not job.get("available"):
        return None
    keys = ("NumNodes", "NumCPUs", "NumTasks", "CPUs/Task", "TresPerNode", "AllocTRES", "TRES")
    out = " ".join(f"{k}={job[k]}" for k in keys if job.get(k) not in (None, "", "(null)"))
    binding = system.get("slurm", {}).get("binding", {})
    bind = binding.get("SLURM_CPU_BIND_TYPE") or binding.get("SLURM_CPU_BIND")
    return out + (f" binding={bind}" if bind else "")


def _packages(system) -> str:
    pkgs = system.get("packages", {})
    why = _why(pkgs)
    if why:
        return why
    return f"sha256 {pkgs['sha256'][:16]}, {pkgs['count']} packages"


NODE_FIELDS = {
    "Operating system": lambda s: (
        _why(s.get("os")) or f"{s['os']['name']}, kernel {s['os']['kernel']}"
    ),
    "CPU model": lambda s: _cpu(s, "model"),
    "CPU sockets per node": lambda s: _cpu(s, "sockets"),
    "Cores per socket": lambda s: _cpu(s, "cores_per_socket"),
    "Logical CPUs per node": lambda s: (
        _cpu(s, "logical_cpus") + f" ({_cpu(s, 'threads_per_core')} thread(s) per core)"
    ),
    "CPU max frequency": lambda s: _cpu(s, "max_mhz", "{} MHz"),
    "Node memory": _memory,
    "Accelerators per node": lambda s: _gpu(s, "count"),
    "Accelerator model": lambda s: _gpu(s, "model"),
    "Accelerator memory": lambda s: _gpu(s, "memory"),
    "GPU interconnect": lambda s: _gpu(s, "topology"),
    "GPU driver": lambda s: _gpu(s, "driver"),
    "CUDA runtime / cuDNN / NCCL": _libraries,
    "Network interfaces": _interfaces,
    "InfiniBand / RoCE": _rdma,
    "Framework build": _build,
    "Package environment": _packages,
    "Slurm": _slurm,
}


def _cpus(text) -> set[int] | None:
    """A CPU list as Linux writes it ("0-3,8") as a set; None when absent or unreadable."""
    if not isinstance(text, str) or not text.strip():
        return None
    out = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            out.update(range(int(low), int(high or low) + 1))
    except ValueError:
        return None
    return out


def _bus(bus_id) -> str | None:
    """A PCI bus id without its domain's width ("00000000:18:00.0" and "0000:18:00.0" alike)."""
    return ":".join(bus_id.lower().split(":")[-2:]) if isinstance(bus_id, str) else None


def _gpu_index(identity: dict, devices: list[dict]) -> int | None:
    """nvidia-smi's index of a rank's board (dlscale.rank.devices.gpu_identity) among the node's
    GPUs (node probes): by UUID, else PCI bus id, else Slurm's GRES index."""
    for key, norm in (("uuid", str), ("pci_bus_id", _bus)):
        mine = identity.get(key)
        if mine:
            for device in devices:
                if device.get(key) and norm(device[key]) == norm(mine):
                    return device.get("index")
    return identity.get("gres_index")


def gpu_placement(system: dict | None, starts: list[dict]) -> str:
    """Whether each GPU rank of a node ran on CPUs of its GPU's NUMA node: the rank's recorded
    CPU binding (cpu_affinity) against its board's CPU affinity in `nvidia-smi topo -m` (node
    probes). A rank with any CPU outside its GPU's is named: its host work crosses the socket
    (Slurm's default distribution can do this on a 2-socket, 4-GPU node)."""
    gpu_ranks = [st for st in starts if st.get("gpu")]
    if not gpu_ranks:
        return "no GPU ranks"
    if system is None:
        return NOT_RECORDED
    gpu = system.get("gpu", {})
    topo = gpu.get("topology", {}) if isinstance(gpu, dict) else {}
    why = _why(gpu) or _why(topo)
    if why:
        return f"not checked ({why})"
    affinity, numa = topo.get("cpu_affinity", {}), topo.get("numa_affinity", {})
    away, near, unknown = [], 0, 0
    for st in sorted(gpu_ranks, key=lambda st: st.get("local_rank", 0)):
        index = _gpu_index(st["gpu"], gpu.get("devices", []))
        label = f"GPU{index}"
        gpu_cpus, rank_cpus = _cpus(affinity.get(label)), _cpus(st.get("cpu_affinity"))
        if index is None or gpu_cpus is None or rank_cpus is None:
            unknown += 1
        elif rank_cpus <= gpu_cpus:
            near += 1
        else:
            away.append(
                f"local rank {st.get('local_rank')} on CPUs {st['cpu_affinity']}, its GPU {index} "
                f"on NUMA node {numa.get(label, '?')} (CPUs {affinity[label]})"
            )
    unknown_text = f"; {unknown} rank(s) not checked (board or CPU list unknown)" if unknown else ""
    if away:
        return f"{PLACEMENT_AWAY}: {'; '.join(away)}{unknown_text}"
    if not near:
        return f"not checked: {unknown} rank(s) whose board or CPU list is unknown"
    return f"all {near} on their GPU's NUMA node{unknown_text}"


def _environment(env: dict) -> str:
    shown = [f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(PERFORMANCE_ENV)]
    return " ".join(shown) or "none set"


def _modules(site: dict) -> str:
    """The modules asked for, and what the module system says is loaded (LOADEDMODULES, set by
    Lmod and Environment Modules alike; `module list` is text for people)."""
    loaded = site["module_vars"].get("LOADEDMODULES")
    asked = " ".join(site["modules"]) or "none"
    return asked + (f" (loaded: {loaded.replace(':', ' ')})" if loaded else "")


def _site_env(site: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(site["env"].items())) or "none"


def _site(starts: list[dict]) -> dict[str, str]:
    """The Modules and env rows of one node, from its ranks' `site_env` (the hardware entry's
    modules and env as each rank saw them); nothing where the entry set neither."""
    sites = [st["site_env"] for st in starts if "site_env" in st]
    if not sites:
        return {}
    return {
        "Modules": " | ".join(sorted({_modules(site) for site in sites})),
        "Site environment (env:)": " | ".join(sorted({_site_env(site) for site in sites})),
    }


def cell_systems(records: list[dict], cell_name: str) -> list[dict]:
    """One row per node of the cell and field: hardware, cell, node, field, value."""
    start = records[0]["value"]
    cell, prov = start["cell"], start["provenance"]
    ranks = [r for r in records if r["event"] == RANK_START]
    nodes = {}
    for rec in ranks:
        st = rec["value"]
        nodes.setdefault((st["node_index"], st["node"]), []).append(st)
    rows = []

    def add(node, field, value):
        rows.append(
            {
                "hardware": cell["hardware"],
                "cell": cell_name,
                "node": node,
                "field": field,
                "value": value,
            }
        )

    add("", "Nodes per cell", str(cell["nodes"]))
    add("", "Framework", " ".join(f"{k}={v}" for k, v in sorted(prov["libraries"].items())))
    if cell.get("container"):  # the image the ranks ran in (hardware.yaml container)
        box = cell["container"]
        add("", "Container", f"{box['engine']} {box['image']} ({box.get('digest', 'no digest')})")
    allocation = None
    for (index, node), starts in sorted(nodes.items()):
        name = f"{index}:{node}"
        system = next((st["system"] for st in starts if "system" in st), None)
        add(name, "Python", starts[0]["python"])
        for field, extract in NODE_FIELDS.items():
            add(name, field, NOT_RECORDED if system is None else extract(system))
        allocation = allocation or (system and _allocation(system))
        binding = sorted({st.get("cpu_affinity") or "not recorded" for st in starts})
        add(name, "CPU binding per rank", "; ".join(binding))
        add(name, PLACEMENT_FIELD, gpu_placement(system, starts))
        envs = sorted({_environment(st.get("environment", {})) for st in starts})
        add(name, "Performance environment", " | ".join(envs))
        for field, value in _site(starts).items():
            add(name, field, value)
    add(
        "",
        "Allocation",
        allocation or ("not a Slurm job" if not prov.get("slurm_job_id") else NOT_RECORDED),
    )
    return rows


def probe_seconds(records: list[dict]) -> list[float]:
    return [
        r["value"]["system"]["probe_seconds"]
        for r in records
        if r["event"] == RANK_START and "system" in r["value"]
    ]


SYSTEMS_COLUMNS = [
    "hardware",
    "field",
    "mlperf_fields",
    "value",
    "cells",
    "nodes",
    "cells_nodes_differ",
    "differing_cells",
]


def systems_table(node_rows: list[dict]) -> pd.DataFrame:
    """Per hardware entry, field and distinct value: how many cells and node records show it;
    per hardware and field: the cells whose nodes disagree (cells_nodes_differ, their names)."""
    if not node_rows:
        return pd.DataFrame(columns=SYSTEMS_COLUMNS)
    df = pd.DataFrame(node_rows)
    per_cell = df.groupby(["hardware", "field", "cell"])["value"].nunique()
    differ = per_cell[per_cell > 1].reset_index()
    differ = differ[~differ["field"].isin(PER_CELL)]
    out = (
        df.groupby(["hardware", "field", "value"])
        .agg(cells=("cell", "nunique"), nodes=("node", "size"))
        .reset_index()
    )
    names = differ.groupby(["hardware", "field"])["cell"].apply(lambda c: " ".join(sorted(c)))
    out["cells_nodes_differ"] = [
        len(names.get((h, f), "").split()) for h, f in zip(out["hardware"], out["field"])
    ]
    out["differing_cells"] = [names.get((h, f), "") for h, f in zip(out["hardware"], out["field"])]
    out["mlperf_fields"] = out["field"].map(MLPERF_FIELDS)
    out["order"] = out["field"].map({f: i for i, f in enumerate(MLPERF_FIELDS)})
    out = out.sort_values(
        ["hardware", "order", "cells", "value"], ascending=[True, True, False, True]
    )
    return out[SYSTEMS_COLUMNS].reset_index(drop=True)
