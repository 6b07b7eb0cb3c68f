"""hardware.yaml `gpu_binding`: how the launcher binds a cuda cell's GPUs and CPUs to its ranks,
from the entry to the srun options (dlscale.run.launchers.srun.gpu_step_options), the device
each rank then takes (dlscale.rank.devices.pick_gpu) and what the preflight checks each rank got
(dlscale.rank.binding). The schema's enum and default are filled from here.

Four forms, one key:
- `node` (the default): `--gpus-per-node=<ranks per node>`; every rank sees all of its node's
  GPUs of the step and takes the one at its local rank;
- `task`: `--gpus-per-task=1 --gpu-bind=per_task:1`; every rank sees its one GPU, as device 0;
- `closest`: `--gpus-per-node=<every GPU the job holds on a node> --cpu-bind=ldoms
  --gpu-bind=closest`: every rank is bound to the CPUs of one NUMA node and sees the job's
  GPU(s) whose cores (gres.conf `Cores=`, what Slurm's NVML autodetection writes) lie there;
  where that is several, it takes the one at its index among the node's ranks bound to the same
  CPUs (pick_gpu). The step takes all of the job's GPUs, not one per rank: a step's GPUs are
  the first free ones, not those next to its ranks, and an exclusive job holds the whole node's
  (a job of fewer GPUs than the node has gets them next to its cores from the scheduler);
- a map, `{gpus: [...], numa: [...]}` or `{gpus: [...], cpus: [...]}`: the site states per local
  rank its GPU index and its NUMA node (`--cpu-bind=map_ldom:`) or its CPUs
  (`--cpu-bind=mask_cpu:`), with `--gpus-per-node=<every GPU of the node>
  --gpu-bind=map_gpu:`; every rank sees exactly its GPU, as device 0. Slurm honours these
  only where the ranks' step holds every CPU of the node (an exclusive job whose ranks per
  node x cpus_per_rank are the node's CPUs); the entry must say `exclusive: true`.

The stated CPU binding. `closest` and maps state both halves. `node` and `task` state their GPU
half and leave the CPU half to the partition's own configuration (a node's or partition's
`CpuBind`, `TaskPluginParam`, else Slurm's automatic binding where the step's tasks x
cpus-per-task fill its cores), as every cell measured before this form did: no `--cpu-bind`
value says "the configured default", and any value would change what those measured cells got
on some site (`none` unbinds where the site binds cores; `cores` binds where it binds nothing),
so their identity would no longer describe their measurement. Neither takes `--gpu-bind=none`
either: with Slurm 22.05 it leaves CUDA_VISIBLE_DEVICES unset, so a rank would see every GPU of
the node, other jobs' too. What no form leaves to chance is an inherited default: the launcher
removes the srun input variables that would bind otherwise (SRUN_BINDING_INPUTS) from the ranks'
srun environment, and the preflight checks what each rank got (CPU affinity, visible GPUs)
against what its form promises, so a cli_filter or job_submit plugin cannot bind differently
unnoticed. Each rank of a cell records its CPU affinity and visible GPUs (rank_start).

Adding a binding: a record here (its srun options, what the rank sees, what the preflight
checks), a test in tests/unit for its options, and its line in docs/pages/gpu.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# srun's input variables (srun(1), "INPUT ENVIRONMENT VARIABLES") that bind tasks to CPUs, GPUs
# or memory, or shape where they land: removed from the ranks' srun environment, so a site's
# profile or the user's shell cannot bind the ranks otherwise than gpu_binding states. (Slurm's
# output variables, SLURM_CPU_BIND_LIST and the like, are not read by srun and are kept.)
SRUN_BINDING_INPUTS = (
    "SLURM_CPU_BIND",
    "SLURM_GPU_BIND",
    "SLURM_MEM_BIND",
    "SLURM_DISTRIBUTION",
    "SLURM_HINT",
    "SLURM_GPUS_PER_TASK",
    "SLURM_NTASKS_PER_GPU",
    "SLURM_CPUS_PER_GPU",
    "SLURM_NTASKS_PER_CORE",
    "SLURM_NTASKS_PER_SOCKET",
    "SLURM_THREADS_PER_CORE",
)

# What a rank's GPUs and CPUs must be (dlscale.rank.binding reads these):
SEES_ALL, SEES_ONE, SEES_CLOSEST, SEES_MAPPED = "all", "one", "closest", "mapped"
CPUS_SITE, CPUS_NUMA_NODE, CPUS_MAPPED = "site", "one numa node", "mapped"


@dataclass(frozen=True)
class GpuBinding:
    """One named binding: the srun options the launcher states (`options(ranks_per_node,
    job_gpus)`: job_gpus, the GPUs the job holds on a node, where the launcher asked Slurm,
    `needs_job_gpus`) and what the preflight checks (`gpus`, `cpus`). What each rank sees and
    gets as CPUs under each form is the table of docs/pages/gpu.md."""

    name: str
    options: Callable[[int, int | None], list[str]]
    gpus: str
    cpus: str
    needs_job_gpus: bool = False

    @property
    def value(self) -> str:
        """Its form in a cell (Cell.gpu_binding)."""
        return self.name

    def srun_options(self, ranks_per_node: int, job_gpus: int | None = None) -> list[str]:
        return self.options(ranks_per_node, job_gpus)


GPU_BINDINGS = {
    b.name: b
    for b in (
        GpuBinding(
            "node",
            lambda ranks_per_node, job_gpus: [f"--gpus-per-node={ranks_per_node}"],
            SEES_ALL,
            CPUS_SITE,
        ),
        GpuBinding(
            "task",
            lambda ranks_per_node, job_gpus: ["--gpus-per-task=1", "--gpu-bind=per_task:1"],
            SEES_ONE,
            CPUS_SITE,
        ),
        GpuBinding(
            "closest",
            lambda ranks_per_node, job_gpus: [
                *([f"--gpus-per-node={job_gpus}"] if job_gpus else []),
                "--cpu-bind=ldoms",
                "--gpu-bind=closest",
            ],
            SEES_CLOSEST,
            CPUS_NUMA_NODE,
            needs_job_gpus=True,
        ),
    )
}
DEFAULT_GPU_BINDING = "node"
assert DEFAULT_GPU_BINDING in GPU_BINDINGS

MAX_CPU = 1023  # a CPU id Slurm's masks and Linux's cpu_set_t (CPU_SETSIZE 1024) hold
MAX_NUMA = 255
_CPU_LIST = re.compile(r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*")
_MAP_VALUE = re.compile(
    r"map_gpu:(?P<gpus>[0-9]+(,[0-9]+)*) "
    r"(map_ldom:(?P<numa>[0-9]+(,[0-9]+)*)|mask_cpu:(?P<masks>0x[0-9a-f]+(,0x[0-9a-f]+)*))"
)


def parse_cpu_list(text) -> frozenset[int]:
    """A CPU list as Linux and Slurm write it ("0-3,8", or one CPU as an integer) -> its CPUs;
    ValueError where it is not one."""
    if isinstance(text, int) and not isinstance(text, bool):
        text = str(text)
    if not isinstance(text, str) or not _CPU_LIST.fullmatch(text.strip()):
        raise ValueError(f"{text!r} is not a CPU list (e.g. 0-15 or 0-7,16-23)")
    cpus = set()
    for part in text.strip().split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first > last:
            raise ValueError(f"{text!r}: the range {part} runs backwards")
        if last > MAX_CPU:
            raise ValueError(f"{text!r}: CPU {last} is above {MAX_CPU}")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def cpu_mask(cpus) -> str:
    """A CPU set as the hexadecimal mask srun's --cpu-bind=mask_cpu: takes ({0, 1} -> 0x3)."""
    return hex(sum(1 << c for c in cpus))


def mask_cpus(mask: str) -> frozenset[int]:
    """The inverse of cpu_mask."""
    bits = int(mask, 16)
    return frozenset(i for i in range(bits.bit_length()) if bits >> i & 1)


@dataclass(frozen=True)
class GpuMap:
    """A site's explicit map: per local rank its GPU index on the node and its NUMA node, or its
    CPUs. Slurm applies it per node by local task id (the map's first entries where a cell runs
    fewer ranks per node than the entry's GPUs)."""

    gpus: tuple[int, ...]
    numa: tuple[int, ...] | None = None
    cpus: tuple[frozenset[int], ...] | None = None

    name = "map"
    needs_job_gpus = False

    @property
    def gpu_option(self) -> str:
        return "map_gpu:" + ",".join(map(str, self.gpus))

    @property
    def cpu_option(self) -> str:
        if self.numa is not None:
            return "map_ldom:" + ",".join(map(str, self.numa))
        return "mask_cpu:" + ",".join(cpu_mask(c) for c in self.cpus)

    @property
    def value(self) -> str:
        """Its canonical form in a cell (Cell.gpu_binding): the two srun values, e.g.
        "map_gpu:0,1,2,3 map_ldom:3,1,7,5" (CPU lists as masks: "mask_cpu:0xff,0xff00")."""
        return f"{self.gpu_option} {self.cpu_option}"

    def srun_options(self, ranks_per_node: int, job_gpus: int | None = None) -> list[str]:
        # every GPU of the node in the step: map_gpu names the node's own GPU indices, which
        # Slurm resolves among the step's GPUs (the exclusive job holds them all)
        return [
            f"--gpus-per-node={len(self.gpus)}",
            f"--gpu-bind={self.gpu_option}",
            f"--cpu-bind={self.cpu_option}",
        ]

    def gpu_of(self, local_rank: int) -> int:
        return self.gpus[local_rank % len(self.gpus)]

    def numa_of(self, local_rank: int) -> int | None:
        return None if self.numa is None else self.numa[local_rank % len(self.numa)]

    def cpus_of(self, local_rank: int) -> frozenset[int] | None:
        return None if self.cpus is None else self.cpus[local_rank % len(self.cpus)]


def promises(binding) -> tuple[str, str]:
    """(what the rank's GPUs must be, what its CPUs must be) of a named binding or a map."""
    if isinstance(binding, GpuMap):
        return SEES_MAPPED, CPUS_MAPPED
    return binding.gpus, binding.cpus


def map_problems(key: str, value, gpus_per_node, exclusive) -> list[str]:
    """What is wrong with an entry's map beyond its schema (which checks its keys and the types
    of its lists), each as `<entry>.gpu_binding...: why`, naming the allowed values: one of numa
    or cpus, one value per GPU of the node, GPU indices on the node and each once, NUMA nodes
    and CPU lists that can be, and a whole node (exclusive) for Slurm to honour it."""
    where = f"{key}.gpu_binding"
    if not isinstance(value, dict):
        return []
    problems = []
    count = gpus_per_node if isinstance(gpus_per_node, int) and gpus_per_node > 0 else None
    top = f"0..{count - 1}" if count else "0..gpus_per_node - 1"
    halves = [k for k in ("numa", "cpus") if k in value]
    if len(halves) != 1:
        problems.append(
            f"{where}: state the CPUs of each local rank with exactly one of numa (its NUMA "
            "node, e.g. numa: [3, 1, 7, 5]) or cpus (its CPU list, e.g. cpus: ['0-15', "
            f"'16-31']); got {' and '.join(halves) if halves else 'neither'}"
        )
    lists = {k: value[k] for k in ("gpus", *halves) if isinstance(value.get(k), list)}
    for name, items in lists.items():
        if count and len(items) != count:
            problems.append(
                f"{where}.{name}: lists {len(items)} value(s); it needs one per local rank: "
                f"{count} (the entry's gpus_per_node)"
            )
    gpus = [g for g in lists.get("gpus", []) if _is_int(g)]
    for i, g in enumerate(lists.get("gpus", [])):
        if _is_int(g) and not (0 <= g < (count or 1 << 30)):
            problems.append(
                f"{where}.gpus[{i}]: {g} is not a GPU index of the node (allowed: {top}, "
                f"gpus_per_node: {gpus_per_node})"
            )
    dup = sorted({g for g in gpus if gpus.count(g) > 1})
    if dup:
        problems.append(
            f"{where}.gpus: GPU(s) {', '.join(map(str, dup))} named more than once; each "
            f"local rank needs a GPU of its own (allowed: each of {top} once)"
        )
    for i, n in enumerate(lists.get("numa", [])):
        if _is_int(n) and not 0 <= n <= MAX_NUMA:
            problems.append(
                f"{where}.numa[{i}]: {n} is not a NUMA node (allowed: 0..{MAX_NUMA}, as "
                "`numactl --hardware` and /sys/devices/system/node number them)"
            )
    for i, c in enumerate(lists.get("cpus", [])):
        try:
            parse_cpu_list(c)
        except ValueError as exc:
            problems.append(
                f"{where}.cpus[{i}]: {exc} (allowed: a CPU list such as '0-15' or "
                f"'0-7,16-23', CPUs 0..{MAX_CPU})"
            )
    if exclusive is not True:
        problems.append(
            f"{where}: a map binds by the node's own GPU and CPU numbers, which Slurm honours "
            f"only when the job holds the whole node: set {key}.exclusive: true"
        )
    return problems


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def canonical(value) -> str:
    """A hardware entry's gpu_binding (a name, or a map the checks above passed) as a cell
    carries it: the name, or the map's canonical srun values (GpuMap.value)."""
    if value is None:
        return DEFAULT_GPU_BINDING
    if isinstance(value, str):
        return value
    cpus = value.get("cpus")
    return GpuMap(
        gpus=tuple(value["gpus"]),
        numa=tuple(value["numa"]) if "numa" in value else None,
        cpus=tuple(parse_cpu_list(c) for c in cpus) if cpus is not None else None,
    ).value


def binding_of(value: str | None):
    """The binding a cell's gpu_binding names (None: the default): a GpuBinding record or a
    GpuMap; ValueError naming the allowed forms where it is neither."""
    if value is None:
        return GPU_BINDINGS[DEFAULT_GPU_BINDING]
    if value in GPU_BINDINGS:
        return GPU_BINDINGS[value]
    found = _MAP_VALUE.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(
            f"gpu_binding: {value!r} is not a binding; allowed: {', '.join(GPU_BINDINGS)}, or "
            "a map (hardware.yaml gpu_binding: {gpus: [...], numa: [...]} or {gpus: [...], "
            "cpus: [...]}, in a cell 'map_gpu:0,1 map_ldom:0,1' or 'map_gpu:0,1 "
            "mask_cpu:0x1,0x2')"
        )
    gpus = tuple(int(g) for g in found["gpus"].split(","))
    if found["numa"] is not None:
        return GpuMap(gpus, numa=tuple(int(n) for n in found["numa"].split(",")))
    return GpuMap(gpus, cpus=tuple(mask_cpus(m) for m in found["masks"].split(",")))
