"""Which GPU a rank uses, and which physical board that is.

One function picks a rank's device from what the rank sees (`pick_gpu`): Slurm renumbers
`CUDA_VISIBLE_DEVICES` from 0 inside a job's cgroup, and per-task binding (`--gpus-per-task`,
`--gpu-bind=single:1`, or a site default) leaves each task one visible device, so
`cuda:<local rank>` is only right when every GPU of the node is visible, and binding to the GPUs
next to a rank's NUMA node (`--gpu-bind=closest`) leaves it those it shares with its neighbours
there. Every framework adapter and the energy meter use it.

`gpu_identity` names the physical board a rank used: its UUID and PCI bus id where the framework
or NVML can tell, and Slurm's GRES index (SLURM_STEP_GPUS / SLURM_JOB_GPUS, in the order of the
visible devices). NVML's index is not CUDA's index in general: the energy meter looks a board up
by UUID or PCI bus id (`nvml_handle`). Two ranks of one node on one board are flagged
(dlscale.store.metrics_summary.shared_gpus).

`binding_check` holds what a rank got (its CPU affinity, the GPUs it sees, the device it takes)
against what its cell's `gpu_binding` promises: the preflight's ranks run it first.

`python -m dlscale.rank.devices [--binding B]` prints what this process would pick (one JSON line),
and with --binding the check: run it under `srun` with the binding of your hardware entry to see
every rank's choice before a study.
Pure Python: importable in every framework environment.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from dlscale.rank.node_probes import cpu_list
from dlscale.registry.gpu_bindings import (
    CPUS_MAPPED,
    CPUS_NUMA_NODE,
    SEES_ALL,
    SEES_CLOSEST,
    SEES_MAPPED,
    SEES_ONE,
    binding_of,
    parse_cpu_list,
    promises,
)

# The variables that decide what a rank sees, named in every refusal.
BINDING_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPU_BIND",
    "SLURM_CPU_BIND_LIST",
    "SLURM_LOCALID",
)

# hardware.yaml `gpu_binding` (its values and srun options: dlscale.registry.gpu_bindings)
# decides what a rank sees; pick_gpu below takes its device from what it sees.


class DeviceChoiceError(RuntimeError):
    """A rank cannot tell which GPU is its own."""


def visible_devices(env=os.environ) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list (indices, UUIDs or MIG ids); None when unset (every GPU
    of the node is visible); [] when it hides every device."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = [v.strip() for v in value.split(",") if v.strip()]
    if entries and entries[0] in ("-1", "NoDevFiles"):
        return []
    return entries


def visible_count(env=os.environ) -> int | None:
    """How many GPUs a CUDA runtime of this process would see, as far as the environment tells
    (CUDA_VISIBLE_DEVICES, else Slurm's SLURM_GPUS_ON_NODE); None when it does not say."""
    visible = visible_devices(env)
    if visible is not None:
        return len(visible)
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(on_node) if on_node.isdigit() else None


def _binding_state(env) -> str:
    shown = [f"{k}={env[k]!r}" for k in BINDING_VARIABLES if k in env]
    return ", ".join(shown) or "none of " + ", ".join(BINDING_VARIABLES) + " is set"


def same_cpus_index(local_rank: int, env=os.environ) -> tuple[int, int] | None:
    """(this rank's index, their count) among the node's ranks bound to the same CPUs as this
    one, from the CPU masks srun exports to every task of a bound step (SLURM_CPU_BIND_LIST:
    one mask per local task, in local task order); None where the step is not bound so."""
    masks = [m.strip() for m in env.get("SLURM_CPU_BIND_LIST", "").split(",") if m.strip()]
    if local_rank >= len(masks):
        return None
    try:
        values = [int(m, 16) for m in masks]
    except ValueError:
        return None
    group = [i for i, v in enumerate(values) if v == values[local_rank]]
    return group.index(local_rank), len(group)


def pick_gpu(local_rank: int, local_world_size: int, device_count: int, env=os.environ) -> int:
    """The device ordinal (as this process's CUDA runtime numbers them) of a rank's GPU.

    - all of the node's GPUs visible (count >= ranks on the node): the local rank;
    - exactly one visible (per-task binding, a map, or a one-GPU node): device 0;
    - several, but fewer than the node's ranks (gpu_binding closest: the GPUs next to the rank's
      NUMA node, which the node's other ranks bound there see too): the rank's index among the
      ranks bound to the same CPUs (same_cpus_index), where they are no more than the GPUs;
    - anything else is refused, naming what the rank sees and the fix."""
    if device_count >= 1 and device_count >= local_world_size and local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
    shared = same_cpus_index(local_rank, env) if device_count > 1 else None
    if shared is not None and shared[1] <= device_count:
        return shared[0]
    if device_count <= 0:
        raise DeviceChoiceError(
            f"local rank {local_rank}: no GPU is visible to this rank ({_binding_state(env)}). "
            "Request GPUs for the job (hardware.yaml gpus_per_node, gpu_request) and do not "
            "hide them from the step (CUDA_VISIBLE_DEVICES, --gpu-bind)"
        )
    raise DeviceChoiceError(
        f"local rank {local_rank} of {local_world_size} on this node sees {device_count} GPUs: "
        f"neither one GPU per task nor all of the node's GPUs ({_binding_state(env)}). "
        "Fix: give each rank its own GPU (hardware.yaml gpu_binding: task, srun "
        "--gpus-per-task=1, or a map), let every rank see all of the node's GPUs (gpu_binding: "
        "node, srun --gpus-per-node=<ranks per node>), or bind each NUMA node's ranks to no "
        "more than its GPUs (gpu_binding: closest), and leave CUDA_VISIBLE_DEVICES to Slurm"
    )


def _slurm_gpus(env) -> list[str] | None:
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = env.get(name, "").strip()
        if value:
            return [v.strip() for v in value.split(",") if v.strip()]
    return None


def gpu_identity(
    ordinal: int,
    env=os.environ,
    *,
    uuid: str | None = None,
    pci_bus_id: str | None = None,
    name: str | None = None,
) -> dict:
    """The physical GPU behind device `ordinal` of this process: the framework's UUID and PCI
    bus id when it knows them, the CUDA_VISIBLE_DEVICES entry, and Slurm's GRES index of the
    board on this node. `key` is the best of these for telling boards apart (uuid > pci bus
    id > GRES index > visible entry)."""
    visible = visible_devices(env)
    entry = visible[ordinal] if visible is not None and ordinal < len(visible) else None
    slurm = _slurm_gpus(env)
    gres_index = None
    if slurm is not None and entry is not None:
        if entry in slurm:
            gres_index = int(entry) if entry.isdigit() else None  # not renumbered (no cgroup)
        elif visible is not None and len(slurm) == len(visible):
            gres_index = int(slurm[ordinal]) if slurm[ordinal].isdigit() else None
    if entry is not None and entry.startswith(("GPU-", "MIG-")) and uuid is None:
        uuid = entry
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = f"GPU-{uuid}"
    if uuid:
        key, source = uuid, "uuid"
    elif pci_bus_id:
        key, source = pci_bus_id, "pci_bus_id"
    elif gres_index is not None:
        key, source = f"gres:{gres_index}", "slurm gres index"
    elif entry is not None:
        key, source = f"visible:{entry}", "CUDA_VISIBLE_DEVICES entry"
    else:
        key, source = f"ordinal:{ordinal}", "device ordinal (all of the node's GPUs visible)"
    return {
        "ordinal": ordinal,
        "visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "visible_entry": entry,
        "gres_index": gres_index,
        "uuid": uuid,
        "pci_bus_id": pci_bus_id,
        "name": name,
        "key": key,
        "key_source": source,
    }


def nvml_handle(nvml, gpu: dict):
    """The NVML handle of a rank's board: by UUID, else by PCI bus id; NVML's index is used
    only when every GPU of the node is visible and CUDA numbers them in PCI order
    (CUDA_DEVICE_ORDER=PCI_BUS_ID, which the launcher sets). Returns (handle, how)."""
    if gpu.get("uuid"):
        return nvml.nvmlDeviceGetHandleByUUID(gpu["uuid"]), "uuid"
    if gpu.get("pci_bus_id"):
        return nvml.nvmlDeviceGetHandleByPciBusId(gpu["pci_bus_id"]), "pci bus id"
    if gpu.get("visible_devices") is None and os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return nvml.nvmlDeviceGetHandleByIndex(gpu["ordinal"]), "index (PCI order)"
    raise DeviceChoiceError(
        f"cannot tell which NVML device is CUDA device {gpu.get('ordinal')}: no UUID or PCI "
        f"bus id known (CUDA_VISIBLE_DEVICES={gpu.get('visible_devices')!r})"
    )


# ----------------------------------------------------------- what a rank got, against its binding
NODE_ROOT = "/sys/devices/system/node"
CPU_ROOT = "/sys/devices/system/cpu"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def locality_domains(
    node_root: str = NODE_ROOT, cpu_root: str = CPU_ROOT
) -> tuple[dict[int, frozenset[int]], str]:
    """The node's NUMA nodes and their CPUs, as the kernel shows them (and as Slurm's
    --cpu-bind=ldoms/map_ldom bind to them), with the word for them; where the kernel shows no
    NUMA node, its sockets (Slurm then takes each socket as a locality domain)."""
    nodes = {}
    for folder in Path(node_root).glob("node[0-9]*"):
        text = _read(folder / "cpulist")
        if text is None:
            continue
        try:
            nodes[int(folder.name[4:])] = parse_cpu_list(text) if text else frozenset()
        except ValueError:
            continue
    if nodes:
        return nodes, "NUMA node"
    sockets: dict[int, set[int]] = {}
    for topo in Path(cpu_root).glob("cpu[0-9]*/topology"):
        package = _read(topo / "physical_package_id")
        if package is not None and package.lstrip("-").isdigit():
            sockets.setdefault(int(package), set()).add(int(topo.parent.name[3:]))
    return {k: frozenset(v) for k, v in sockets.items()}, "socket"


def _gres_index(env, ordinal: int | None = None) -> int | None:
    """The node's GRES index of the rank's GPU where it sees exactly one (or of device
    `ordinal`): Slurm's SLURM_STEP_GPUS (the node's own numbers, also inside a cgroup that
    renumbers CUDA_VISIBLE_DEVICES), else the CUDA_VISIBLE_DEVICES entry."""
    for name in ("SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        entries = [v.strip() for v in env.get(name, "").split(",") if v.strip()]
        index = 0 if ordinal is None and len(entries) == 1 else ordinal
        if index is not None and index < len(entries) and entries[index].isdigit():
            return int(entries[index])
    return None


def binding_check(
    gpu_binding: str | None,
    local_rank: int,
    local_world_size: int,
    env=os.environ,
    affinity=None,
    domains: tuple[dict[int, frozenset[int]], str] | None = None,
    who: str | None = None,
) -> dict:
    """What this rank got (its CPU affinity, os.sched_getaffinity; the GPUs it sees,
    CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS; the device it takes, pick_gpu) against what its
    cell's gpu_binding promises (dlscale.registry.gpu_bindings: node, all of the node's GPUs of
    the step; task, one; closest, the CPUs of one NUMA node and the GPU(s) next to them; a map,
    its GPU and its NUMA node or CPUs). `who` names the rank in the message (its rank and node).
    Returns {"ok", "detail", "fix", what it got}: the preflight's `binding` check."""
    binding = binding_of(gpu_binding)
    gpus_promise, cpus_promise = promises(binding)
    cpus = frozenset(os.sched_getaffinity(0) if affinity is None else affinity)
    domains, kind = domains if domains is not None else locality_domains()
    touched = sorted(d for d, members in domains.items() if members & cpus)
    count, visible = visible_count(env), env.get("CUDA_VISIBLE_DEVICES")
    wanted = []  # what it should have, where it has not
    if gpus_promise == SEES_ALL and count is not None and count < local_world_size:
        wanted.append(
            f"see all of its node's GPUs of the step (at least {local_world_size}, one per "
            "rank on the node)"
        )
    elif gpus_promise == SEES_ONE and count != 1:
        wanted.append("see exactly one GPU, its own")
    elif gpus_promise == SEES_CLOSEST and count == 0:
        wanted.append("see the GPU(s) next to its CPUs")
    elif gpus_promise == SEES_MAPPED:
        gpu = binding.gpu_of(local_rank)
        if count != 1 or _gres_index(env) != gpu:
            wanted.append(f"see exactly GPU {gpu} of the node")
    ordinal = None
    if not wanted:
        try:
            ordinal = pick_gpu(local_rank, local_world_size, count or 0, env)
        except DeviceChoiceError as exc:
            wanted.append(f"see GPUs it can tell its own among ({exc})")
    if cpus_promise == CPUS_NUMA_NODE and len(touched) > 1:
        wanted.append(f"be bound to the CPUs of one {kind} (srun --cpu-bind=ldoms)")
    elif cpus_promise == CPUS_MAPPED:
        numa = binding.numa_of(local_rank)
        want = binding.cpus_of(local_rank) if numa is None else domains.get(numa)
        if numa is not None and want is None:
            wanted.append(
                f"be bound to {kind} {numa}, which this node does not have (its {kind}s: "
                f"{', '.join(map(str, sorted(domains))) or 'none'})"
            )
        elif numa is not None and not (cpus and cpus <= want):
            wanted.append(f"be bound to the CPUs of {kind} {numa} ({cpu_list(want)})")
        elif numa is None and cpus != want:
            wanted.append(f"be bound to CPUs {cpu_list(want)}")
    where = f"{kind}{'s' if len(touched) != 1 else ''} {', '.join(map(str, touched)) or '-'}"
    shown = "unset (every GPU of the node)" if visible is None else repr(visible)
    step = f", SLURM_STEP_GPUS={env['SLURM_STEP_GPUS']!r}" if "SLURM_STEP_GPUS" in env else ""
    got = f"CPUs {cpu_list(cpus) or 'none'} ({where}) and CUDA_VISIBLE_DEVICES={shown}{step}"
    record = {
        "gpu_binding": binding.value,
        "local_rank": local_rank,
        "cpus": cpu_list(cpus),
        "domains": touched,  # the NUMA nodes (or sockets) its CPUs lie in
        "domain_kind": kind,
        "visible_devices": visible,
        "step_gpus": env.get("SLURM_STEP_GPUS"),
        "ordinal": ordinal,
        "gpu": gpu_identity(ordinal, env) if ordinal is not None else None,
    }
    name = f"gpu_binding {binding.name}" + (f" ({binding.value})" if binding.name == "map" else "")
    whom = who or f"local rank {local_rank}"
    if not wanted:
        taken = f"takes device {ordinal} ({record['gpu']['key']})"
        return {**record, "ok": True, "detail": f"{name}: {whom} got {got}; {taken}", "fix": None}
    options = " ".join(binding.srun_options(local_world_size))
    return {
        **record,
        "ok": False,
        "detail": f"{name}: {whom} got {got}; it should {' and '.join(wanted)}",
        "fix": (
            f"the launcher stated `srun {options}` and removed inherited binding variables: a "
            "site default, a cli_filter or a job_submit plugin bound the ranks otherwise, or "
            "the partition binds no CPUs (TaskPlugin without task/affinity or task/cgroup). "
            "Ask the site, or choose another gpu_binding in config/hardware.yaml (node, task, "
            "closest or a map)"
        ),
    }


def main(argv: list[str] | None = None) -> int:
    """Print this process's choice as one JSON line (`srun ... python -m dlscale.rank.devices`):
    the device count is what the environment shows (visible_count), or --count."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dlscale.rank.devices", description=__doc__)
    parser.add_argument("--count", type=int, default=None, help="GPUs this process sees")
    parser.add_argument(
        "--binding",
        default=None,
        help="check what this rank got against a gpu_binding (node, task, closest, or a "
        "cell's map 'map_gpu:0,1 map_ldom:0,1'): the preflight's check",
    )
    args = parser.parse_args(argv)
    from dlscale.rank.rank_context import discover  # who this rank is, as a training rank reads it

    env, ctx = os.environ, discover()
    count = args.count if args.count is not None else visible_count(env)
    record = {
        "rank": ctx.rank,
        "node": ctx.node,
        "local_rank": ctx.local_rank,
        "local_world_size": ctx.local_world_size,
        "device_count": count,
    }
    if hasattr(os, "sched_getaffinity"):
        record["cpu_affinity"] = cpu_list(os.sched_getaffinity(0))
    try:
        ordinal = pick_gpu(ctx.local_rank, ctx.local_world_size, count or 0, env)
        record["gpu"] = gpu_identity(ordinal, env)
    except DeviceChoiceError as exc:
        record["gpu"], record["error"] = None, str(exc)
    if args.binding is not None:
        who = f"rank {ctx.rank} (local rank {ctx.local_rank} on {ctx.node})"
        record["binding"] = binding_check(
            args.binding, ctx.local_rank, ctx.local_world_size, env, who=who
        )
    print(json.dumps(record, sort_keys=True), flush=True)
    return 0 if record["gpu"] and record.get("binding", {}).get("ok", True) else 3


if __name__ == "__main__":
    sys.exit(main())
