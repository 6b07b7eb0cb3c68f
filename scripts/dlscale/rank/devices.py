"""Which GPU a rank uses, and which physical board that is.

One function picks a rank's device from what the rank sees (`pick_gpu`): Slurm renumbers
`CUDA_VISIBLE_DEVICES` from 0 inside a job's cgroup, and per-task binding (`--gpus-per-task`,
`--gpu-bind=single:1`, or a site default) leaves each task one visible device, so
`cuda:<local rank>` is only right when every GPU of the node is visible. Every framework adapter
and the energy meter use it.

`gpu_identity` names the physical board a rank used: its UUID and PCI bus id where the framework
or NVML can tell, and Slurm's GRES index (SLURM_STEP_GPUS / SLURM_JOB_GPUS, in the order of the
visible devices). NVML's index is not CUDA's index in general: the energy meter looks a board up
by UUID or PCI bus id (`nvml_handle`). Two ranks of one node on one board are flagged
(dlscale.store.metrics_summary.shared_gpus).

`python -m dlscale.rank.devices` prints what this process would pick (one JSON line): run it under
`srun` with the binding of your hardware entry to see every rank's choice before a study.
Pure Python: importable in every framework environment.
"""

from __future__ import annotations

import json
import os
import sys

# The variables that decide what a rank sees, named in every refusal.
BINDING_VARIABLES = (
    "CUDA_VISIBLE_DEVICES",
    "SLURM_STEP_GPUS",
    "SLURM_JOB_GPUS",
    "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GPU_BIND",
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


def pick_gpu(local_rank: int, local_world_size: int, device_count: int, env=os.environ) -> int:
    """The device ordinal (as this process's CUDA runtime numbers them) of a rank's GPU.

    - all of the node's GPUs visible (count >= ranks on the node): the local rank;
    - exactly one visible (per-task binding, or a one-GPU node): device 0;
    - anything else is refused, naming what the rank sees and the fix."""
    if device_count >= 1 and device_count >= local_world_size and local_rank < device_count:
        return local_rank
    if device_count == 1:
        return 0
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
        "--gpus-per-task=1) or let every rank see all of the node's GPUs (gpu_binding: node, "
        "srun --gpus-per-node=<ranks per node>), and leave CUDA_VISIBLE_DEVICES to Slurm"
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


def main(argv: list[str] | None = None) -> int:
    """Print this process's choice as one JSON line (`srun ... python -m dlscale.rank.devices`):
    the device count is what the environment shows (visible_count), or --count."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m dlscale.rank.devices", description=__doc__)
    parser.add_argument("--count", type=int, default=None, help="GPUs this process sees")
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
    try:
        ordinal = pick_gpu(ctx.local_rank, ctx.local_world_size, count or 0, env)
        record["gpu"] = gpu_identity(ordinal, env)
    except DeviceChoiceError as exc:
        record["gpu"], record["error"] = None, str(exc)
    print(json.dumps(record, sort_keys=True), flush=True)
    return 0 if record["gpu"] else 3


if __name__ == "__main__":
    sys.exit(main())
