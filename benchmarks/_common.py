"""Shared helpers of the workflow benchmarks (planning.py, noop_rerun.py).

- study_config(): a valid dlscale study config of (exactly, where possible) N cells over the
  real axes (all frameworks and models, hardware keys of config/hardware.yaml, both policies,
  node counts from the power-of-two ladder 1..max_nodes, repetitions, exclusions);
- bench_checkout(): a user's checkout in a temporary directory (tests/helpers/checkout.py's
  copy_workflow, the one copy the tests make too: its own dlscale package on PYTHONPATH, .venvs
  linked from the source tree) with stand-ins for the CUDA environments;
- the bare Snakefiles the planning benchmarks compare against: benchmarks/_bare.py;
- run_child(): wall time, CPU time and peak RSS (os.wait4 rusage of the child) of one command;
- stats()/report(): the printed medians, ranges and ratios.

Only the CLI, the config format, dlscale.study.matrix.load_study/Cell and dlscale.store.metrics
(make_record, rank_summary, assemble, write_atomic) are relied on here, never the rules' internals.
The set-up the tests share comes from tests/helpers/ (imported as helpers.<module>): the workflow
copy (helpers.checkout), cells (helpers.cells) and synthetic metrics files of real cells
(helpers.synthetic_metrics.cell_records, written with dlscale.store.metrics.write_atomic).
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from math import lcm
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "tests"))  # the helpers the tests share (helpers.<module>)
from dlscale.registry import frameworks as registry_frameworks  # noqa: E402

from helpers.checkout import NOT_COPIED, WORKFLOW_PARTS, copy_workflow  # noqa: E402

FRAMEWORKS = registry_frameworks.names()
MODELS = ["resnet50", "resnet18", "cnn_small", "transformer_small"]
HARDWARE = ["cpu", "v100", "a100", "h100"]  # keys of config/hardware.yaml
POLICIES = ["weak", "strong"]
PRECISIONS = [["fp32"], ["fp32", "bf16"]]  # bf16 runs on CPU and GPU, fp16 on GPU only
MAX_REPETITIONS = 100  # config.schema.json
HARDWARE_FILE = "config/hardware.bench.yaml"  # written into the copy: max_nodes raised


# ---------------------------------------------------------------------------------- the study
@dataclass
class StudyShape:
    nodes: list[int]
    precision: list[str]
    repetitions: int
    excluded: list[tuple[str, int]]  # (hardware, nodes) pairs left out

    @property
    def cells(self) -> int:
        pairs = len(HARDWARE) * len(self.nodes) - len(self.excluded)
        return (
            len(FRAMEWORKS)
            * len(MODELS)
            * len(POLICIES)
            * len(self.precision)
            * self.repetitions
            * pairs
        )


def _exclusion_order(nodes: list[int]) -> list[tuple[str, int]]:
    """Which (hardware, nodes) pairs go first when the matrix must shrink: the largest node
    counts of the smallest hardware first (CPU cells stop scaling early, V100 next); every
    hardware keeps its smallest node count."""
    return [(hw, n) for hw in HARDWARE for n in sorted(nodes, reverse=True)[:-1]]


def study_shape(n_cells: int, max_nodes: int = 128) -> StudyShape:
    """The shape whose cell count is closest to n_cells (exact where the axes allow: counts are
    multiples of 40 = frameworks x models x policies); ties: fewer exclusions, fewer repetitions."""
    nodes = [2**i for i in range(max_nodes.bit_length()) if 2**i <= max_nodes]
    order = _exclusion_order(nodes)
    best, best_key = None, None
    for precision in PRECISIONS:
        for reps in range(1, MAX_REPETITIONS + 1):
            for k in range(len(order) + 1):
                shape = StudyShape(nodes, precision, reps, order[:k])
                key = (abs(shape.cells - n_cells), k, reps)
                if best_key is None or key < best_key:
                    best, best_key = shape, key
    return best


def study_config(shape: StudyShape, hardware: dict, name: str) -> dict:
    """A complete study config (every key of config/config.yaml) of the given shape."""
    # strong scaling: the global batch must be divisible by every world size of every hardware
    world = [
        n * (hardware[hw]["gpus_per_node"] if hardware[hw]["device"] == "cuda" else 1)
        for hw in HARDWARE
        for n in shape.nodes
    ]
    return {
        "study": name,
        "axes": {
            "framework": list(FRAMEWORKS),
            "model": list(MODELS),
            "hardware": list(HARDWARE),
            "nodes": list(shape.nodes),
            "policy": list(POLICIES),
            "precision": list(shape.precision),
        },
        "repetitions": shape.repetitions,
        "ranks_per_node": 1,
        "per_rank_batch": 32,
        "global_batch": max(lcm(*world), 32),
        "warmup_steps": 1,
        "steps": 5,
        "straggler_threshold": 0.1,
        "exclude": [{"hardware": hw, "nodes": n} for hw, n in shape.excluded],
        "hardware_file": HARDWARE_FILE,
        "launcher": "local",
        "report": {"title": None, "column_width_in": 3.5},
    }


def describe(shape: StudyShape, config: dict) -> str:
    excl = ", ".join(f"{hw}@n{n}" for hw, n in shape.excluded) or "none"
    return (
        f"{len(FRAMEWORKS)} frameworks x {len(MODELS)} models x hardware "
        f"{'/'.join(HARDWARE)} x nodes {shape.nodes} x policies {'/'.join(POLICIES)} x "
        f"precision {'/'.join(shape.precision)} x {shape.repetitions} repetitions, "
        f"excluding {len(shape.excluded)} (hardware, nodes) pairs [{excl}]; "
        f"global_batch {config['global_batch']}; hardware file {HARDWARE_FILE} = "
        f"config/hardware.yaml with max_nodes raised to {max(shape.nodes)}"
    )


def write_study(workdir: Path, n_cells: int, max_nodes: int = 128) -> tuple[Path, dict, StudyShape]:
    """Write the study config (config/bench-<N>.yaml) and the benchmark hardware file into a
    workflow copy; return the config path, the config and its shape."""
    shape = study_shape(n_cells, max_nodes)
    hardware = yaml.safe_load((workdir / "config" / "hardware.yaml").read_text())
    for hw in HARDWARE:
        hardware[hw]["max_nodes"] = max(hardware[hw].get("max_nodes", 1), max(shape.nodes))
        # every framework on every hardware, no compute-capability check: MXNet's CUDA build cannot
        # drive compute capability 9.0, and the study would be refused on h100
        hardware[hw].pop("compute_capability", None)
    (workdir / HARDWARE_FILE).write_text(
        "# config/hardware.yaml with max_nodes raised and compute_capability left out for the "
        "benchmark study (benchmarks/)\n" + yaml.safe_dump(hardware, sort_keys=False)
    )
    config = study_config(shape, hardware, name=f"bench{n_cells}")
    path = workdir / "config" / f"bench-{n_cells}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, config, shape


# ----------------------------------------------------------------------- the workflow copies
def default_venvs(workflow_dir: Path) -> Path:
    """The framework environments: the checkout's own .venvs, else this repository's."""
    own = workflow_dir / ".venvs"
    return own if own.is_dir() else REPO / ".venvs"


def bench_checkout(src: Path, dest: Path, venvs: Path) -> Path:
    """A user's checkout in miniature at `dest` (a new folder): the workflow files of `src` with
    its own dlscale package under scripts/, .venvs linking each framework environment of
    `venvs`, and stand-ins for the CUDA environments a GPU study's parse checks."""
    dest.mkdir(parents=True)
    copy_workflow(dest, src=src, package=True, venvs=venvs)
    cuda_standins(dest / ".venvs")
    return dest


# The files dlscale.workflow.capability reads to tell a CUDA build (relative to site-packages).
CUDA_MARKERS = {
    "pytorch-cuda": {"torch/version.py": "__version__ = '2.13.0'\ncuda = '13.0'\n"},
    "tensorflow-cuda": {
        "tensorflow/python/platform/build_info.py": "build_info = {'is_cuda_build': True}\n",
        "nvidia_cudnn_cu12-9.3.0.75.dist-info/METADATA": "Name: nvidia-cudnn-cu12\n",
    },
    "horovod-cuda": {
        "torch/version.py": "__version__ = '2.13.0'\ncuda = '13.0'\n",
        "horovod/torch/mpi_lib_v2.so": "ncclAllReduce\n",
    },
    "mxnet-cuda": {"mxnet_cu117-1.9.1.dist-info/METADATA": "Name: mxnet-cu117\n"},
}


def cuda_standins(venvs: Path) -> None:
    """Stand-ins for the CUDA environments a GPU study needs (scripts/setup.sh <env>-cuda builds
    the real ones on a GPU site; they are GBs): folders laid out as each installs, holding only
    the files the parse-time capability check reads, so the planning benchmarks measure that
    check as a user's parse pays it. No cell runs in them."""
    for name, files in CUDA_MARKERS.items():
        if (venvs / name).exists():
            continue
        (venvs / name / "bin").mkdir(parents=True)
        (venvs / name / "bin" / "python").symlink_to(sys.executable)
        sp = venvs / name / "lib" / "python3.11" / "site-packages"
        for rel, text in files.items():
            (sp / rel).parent.mkdir(parents=True, exist_ok=True)
            (sp / rel).write_text(text)


def tree_hash(src: Path) -> str:
    """Content hash of the workflow files copy_workflow copies (a cached setup is reused only
    for the same workflow)."""
    h = hashlib.sha256()
    for part in WORKFLOW_PARTS:
        files = [src / part] if (src / part).is_file() else sorted((src / part).rglob("*"))
        for f in files:
            copied = not any(fnmatch.fnmatch(p, pattern) for p in f.parts for pattern in NOT_COPIED)
            if f.is_file() and copied:
                h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def child_env(workdir: Path, snakemake: Path, shim: Path | None = None) -> dict:
    """The copy's own dlscale package first on the path (so an older checkout is measured with
    its own code, not the editable install of this one), the driver venv first on PATH, and
    before it the scontrol shim (no_slurm_probe) where given."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(workdir / "scripts"), env.get("PYTHONPATH")])
    )
    env["PATH"] = os.pathsep.join(
        filter(None, [str(shim) if shim else "", str(snakemake.parent), env.get("PATH", "")])
    )
    return env


def no_slurm_probe(root: Path) -> Path:
    """A directory holding an `scontrol` that fails at once. snakemake-executor-plugin-slurm
    (imported by every snakemake run, whatever the executor) runs `scontrol show config` at
    import to choose its status command's help text; with no answering slurmctld that costs
    ~9 s (its retries, up to the plugin's 10 s timeout) in every run. The shim makes the plugin
    skip the question, as on a host without Slurm; nothing else in a dry or no-op run calls
    scontrol."""
    shim = root / "no-slurm-probe"
    shim.mkdir(parents=True, exist_ok=True)
    exe = shim / "scontrol"
    exe.write_text(
        "#!/bin/sh\n# dlscale benchmarks: no Slurm controller query from snakemake's "
        "plugin import\nexit 1\n"
    )
    exe.chmod(0o755)
    return shim


def snakemake_version(snakemake: Path) -> str:
    out = subprocess.run([str(snakemake), "--version"], capture_output=True, text=True)
    return out.stdout.strip() or f"? ({out.stderr.strip()[-200:]})"


def describe_checkout(path: Path) -> str:
    """git commit of a checkout, '+dirty' with uncommitted changes to tracked files."""
    head = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        return "not a git checkout"
    dirty = subprocess.run(
        ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
    )
    files = [line[3:] for line in dirty.stdout.splitlines()]
    return f"commit {head.stdout.strip()}" + (
        f" + uncommitted changes to {', '.join(files)}" if files else ", clean"
    )


def import_dlscale(workflow_dir: Path):
    """Import the dlscale package of workflow_dir (not necessarily this repository's)."""
    scripts = str((workflow_dir / "scripts").resolve())
    if "dlscale" in sys.modules:
        loaded = Path(sys.modules["dlscale"].__file__).resolve()
        if not str(loaded).startswith(scripts + os.sep):
            raise RuntimeError(f"dlscale already imported from {loaded}, not {scripts}")
    sys.path.insert(0, scripts)
    importlib.invalidate_caches()
    dlscale = importlib.import_module("dlscale")
    loaded = Path(dlscale.__file__).resolve()
    if not str(loaded).startswith(scripts + os.sep):
        raise RuntimeError(f"dlscale imported from {loaded}, expected {scripts}")
    return dlscale


# ----------------------------------------------------------------------------- measurement
@dataclass
class Run:
    wall_s: float
    maxrss_mib: float
    rc: int
    log: Path
    cpu_s: float = 0.0  # user + system CPU time of the child and the descendants it waited for

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]


def run_child(cmd: list[str], cwd: Path, env: dict, log: Path) -> Run:
    """Run cmd; wall time from spawn to reaping, peak RSS from the child's own rusage (wait4:
    the child and the descendants it waited for, never this process)."""
    with log.open("w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    cpu = usage.ru_utime + usage.ru_stime
    return Run(wall, usage.ru_maxrss / 1024, proc.returncode, log, cpu)  # ru_maxrss: KiB on Linux


def check(run: Run, what: str, expect: str | None = None) -> None:
    text = run.log.read_text(errors="replace")
    if run.rc != 0 or (expect is not None and expect not in text):
        raise SystemExit(
            f"{what} failed (exit {run.rc}; expected {expect!r} in its output); "
            f"log {run.log}:\n{text[-3000:]}"
        )


def job_stats(log_text: str) -> dict[str, int]:
    """Jobs per rule of the first 'Job stats' table in a snakemake log (without the total)."""
    m = re.search(r"Job stats:\n.*?\n-+\s+-+\n(.*?)\n\s*\n", log_text + "\n\n", re.S)
    rows = re.findall(r"^(\S+)\s+(\d+)\s*$", m.group(1), re.M) if m else []
    return {rule: int(count) for rule, count in rows if rule != "total"}


def train_jobs(log_text: str) -> int:
    """Cell jobs planned: rules named train or train_<anything> (the rule may be split)."""
    return sum(
        count
        for rule, count in job_stats(log_text).items()
        if rule == "train" or rule.startswith("train_")
    )


def alternate(rounds: int, variants: dict, on_run=None) -> dict[str, list[Run]]:
    """Run every variant once per round, alternating which goes first."""
    names = list(variants)
    out = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            run = variants[name](r)
            out[name].append(run)
            if on_run:
                on_run(r, name, run)
    return out


def stats(values: list[float], unit: str, fmt: str = ".2f") -> str:
    return (
        f"median {statistics.median(values):{fmt}} {unit} (min {min(values):{fmt}}, "
        f"max {max(values):{fmt}}, n={len(values)})"
    )


def ratio_line(
    project: list[float], bare: list[float], what: str, name: str = "project", base: str = "bare"
) -> str:
    per_round = [p / b for p, b in zip(project, bare)]
    of_medians = statistics.median(project) / statistics.median(bare)
    return (
        f"  ratio {name}/{base} {what}: {of_medians:.2f}"
        f" (ratio of medians; per round median {statistics.median(per_round):.2f}, "
        f"min {min(per_round):.2f}, max {max(per_round):.2f})"
    )


def report(results: dict[str, list[Run]]) -> list[str]:
    """Each variant's wall, CPU time and peak RSS; project/bare for each; then project/<other
    bare> for another baseline (a name starting with "bare-"), <variant>/bare for any other
    variant (planning.py --ablate). CPU time (user + system) is the less noisy figure on a
    shared machine, whose other tenants lengthen the wall but not the work."""
    lines = []
    for name, runs in results.items():
        lines.append(
            f"  {name:13s} wall {stats([r.wall_s for r in runs], 's')}; "
            f"CPU {stats([r.cpu_s for r in runs], 's')}; "
            f"peak RSS {stats([r.maxrss_mib for r in runs], 'MiB', '.0f')}"
        )
    p, b = results["project"], results["bare"]
    lines.append(ratio_line([r.wall_s for r in p], [r.wall_s for r in b], "wall"))
    lines.append(ratio_line([r.cpu_s for r in p], [r.cpu_s for r in b], "CPU"))
    lines.append(ratio_line([r.maxrss_mib for r in p], [r.maxrss_mib for r in b], "peak RSS"))
    for name, runs in results.items():
        if name in ("project", "bare"):
            continue
        for what in ("wall_s", "cpu_s"):
            label = "wall" if what == "wall_s" else "CPU"
            mine = [getattr(r, what) for r in runs]
            if name.startswith("bare-"):
                theirs = [getattr(r, what) for r in p]
                lines.append(ratio_line(theirs, mine, label, base=name))
            else:
                lines.append(ratio_line(mine, [getattr(r, what) for r in b], label, name))
    return lines


def machine_note() -> str:
    load = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def cell_count_check(study, expected: int) -> None:
    if len(study.cells) != expected:
        raise SystemExit(
            f"dlscale planned {len(study.cells)} cells, the generator expected {expected}"
        )


def start(a, prefix: str) -> tuple[Path, Path, Path, Path | None]:
    """The checkout to measure, its .venvs, the work folder and the scontrol shim (None with
    --slurm-probe), with the header every benchmark prints (checkout, snakemake, machine)."""
    src = a.workflow_dir.resolve()
    venvs = (a.venvs or default_venvs(src)).resolve()
    root = (a.workdir or Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))).resolve()
    root.mkdir(parents=True, exist_ok=True)
    shim = None if a.slurm_probe else no_slurm_probe(root)
    import_dlscale(src)
    print(f"workflow: {src} ({describe_checkout(src)}); .venvs -> {venvs}")
    print(
        f"snakemake {snakemake_version(a.snakemake)}; {machine_note()}; "
        f"Slurm plugin probe: {'real scontrol' if a.slurm_probe else 'skipped (scontrol shim)'}"
        f"; work in {root}"
    )
    return src, venvs, root, shim
