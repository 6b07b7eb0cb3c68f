"""The bad-input corpus: study files, hardware files and command-line settings that
must each be refused before any job, with a precise message, in bounded time and memory,
without touching an existing results/ folder.

Each case is (id, setup, expected): `setup(ws)` writes its files into a workspace (a miniature
checkout: config/, envs/ and a results/ folder with a measured cell, see `make_workspace`) and
returns what the command line would give (`cli`: Snakemake's --config; `configfiles`:
--configfile paths); `expected` is a fragment of the message. Run by
tests/unit/study/test_bad_input_corpus.py (each case: the message, the time, results/ checksums) and
benchmarks/bad_inputs.py (each case in a fresh process: time and peak memory).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

from dlscale.registry import frameworks

ROOT = Path(__file__).resolve().parents[2]
MEASURED_CELL = "results/demo/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1"


def make_workspace(ws: Path) -> Path:
    """config/ (the demo study and the site hardware map), envs/ and results/ with one measured
    cell (its metrics file a hard link into its measurements/ folder), tables and a report."""
    (ws / "config").mkdir(parents=True)
    (ws / "config" / "schemas").symlink_to(ROOT / "config" / "schemas")
    shutil.copy2(ROOT / "config" / "config.yaml", ws / "config" / "config.yaml")
    shutil.copy2(ROOT / "config" / "hardware.yaml", ws / "config" / "hardware.yaml")
    (ws / "envs").symlink_to(ROOT / "envs")
    cell = ws / MEASURED_CELL
    folder = cell / "measurements" / "20250101T000000Z-pid1"
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text('{"event": "run_start"}\n')
    os.link(folder / "metrics.jsonl", cell / "metrics.jsonl")
    tables = ws / "results" / "demo" / "tables"
    tables.mkdir(parents=True)
    (tables / "cells.csv").write_text("cell,throughput\nx,1.0\n")
    return ws


def results_checksums(ws: Path) -> dict[str, str]:
    """Every path under results/ with its content hash (files), 'dir' or its link target."""
    out = {}
    for path in sorted((ws / "results").rglob("*")):
        rel = str(path.relative_to(ws))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            st = path.stat()
            out[rel] = (
                f"{hashlib.sha256(path.read_bytes()).hexdigest()} {st.st_mode:o} {st.st_nlink}"
            )
    return out


# ---- setups -------------------------------------------------------------------------------


def cli(**over) -> Callable:
    """Command-line settings (--config) over the valid demo study."""

    def setup(ws):
        return {"cli": over}

    return setup


def config_text(text: str | bytes) -> Callable:
    """config/config.yaml replaced by this text."""

    def setup(ws):
        path = ws / "config" / "config.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return {}

    return setup


def study_text(text: str | bytes, name: str = "my-study.yaml") -> Callable:
    """A study file given with --config study_file=..."""

    def setup(ws):
        (ws / name).write_bytes(text if isinstance(text, bytes) else text.encode())
        return {"cli": {"study_file": name}}

    return setup


def configfile_text(text: str) -> Callable:
    """A file given with Snakemake's --configfile (dlscale reads it again)."""

    def setup(ws):
        (ws / "other.yaml").write_text(text)
        return {"configfiles": [str(ws / "other.yaml")]}

    return setup


def hardware(**over) -> Callable:
    """A hardware file whose `cpu` entry has these values."""
    return hardware_map({"cpu": {"device": "cpu", "max_nodes": 2, **over}})


def hardware_map(entries: dict) -> Callable:
    def setup(ws):
        (ws / "hw.yaml").write_text(yaml.safe_dump(entries))
        return {"cli": {"hardware_file": "hw.yaml"}}

    return setup


def hardware_text(text: str | bytes) -> Callable:
    def setup(ws):
        (ws / "hw.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
        return {"cli": {"hardware_file": "hw.yaml"}}

    return setup


def hardware_path(make: Callable[[Path], str]) -> Callable:
    """hardware_file set to the path `make(ws)` returns (after creating whatever it is)."""

    def setup(ws):
        return {"cli": {"hardware_file": make(ws)}}

    return setup


def study_path(make: Callable[[Path], str]) -> Callable:
    def setup(ws):
        return {"cli": {"study_file": make(ws)}}

    return setup


def _fifo(ws: Path) -> str:
    os.mkfifo(ws / "fifo.yaml")
    return "fifo.yaml"


def _sparse(size: int) -> Callable[[Path], str]:
    def make(ws):
        with open(ws / "big.yaml", "wb") as fh:
            fh.truncate(size)
        return "big.yaml"

    return make


def _symlink_to(target: str) -> Callable[[Path], str]:
    def make(ws):
        (ws / "link.yaml").symlink_to(target)
        return "link.yaml"

    return make


def _dir(ws: Path) -> str:
    (ws / "adir").mkdir()
    return "adir"


BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(8)]
)
# 25 MB of plain YAML would take minutes to parse; refused by size before a byte is parsed
BIG_LINES = "# padding\n" * 100_001
YTE = (
    "__use_yte__: true\n"
    "study: demo\n"
    "?if __import__('pathlib').Path('PWNED').touch() is None:\n"
    "  steps: 5\n"
)
DEEP = "x: " + "[" * 40 + "]" * 40 + "\n"
VERY_DEEP = "x: " + "[" * 200_000 + "]" * 200_000 + "\n"


def _launcher(executor: str, launcher: str, in_allocation: bool = False) -> Callable:
    """Not a file: the executor/launcher agreement the train rules check."""

    def setup(ws):
        return {"launcher": (executor, launcher, in_allocation)}

    return setup


def _many_gpu_keys(ws: Path) -> dict:
    entries = {
        f"g{i}": {"device": "cuda", "gpus_per_node": 4, "max_nodes": 4096} for i in range(64)
    }
    (ws / "hw.yaml").write_text(yaml.safe_dump(entries))
    return {
        "cli": {
            "hardware_file": "hw.yaml",
            "axes": {
                "framework": frameworks.names(),
                "model": ["resnet50", "resnet34", "resnet18", "cnn_small", "transformer_small"],
                "hardware": sorted(entries),
                "nodes": [2**i for i in range(12)] + list(range(3, 100, 2))[:52],
                "policy": ["weak"],
                "precision": ["fp32", "bf16", "fp16"],
            },
            "repetitions": 100,
        }
    }


# ---- the corpus -------------------------------------------------------------------------

NUMBERS = [
    ("nodes-float", cli(axes={"nodes": [2.0]}), "axes.nodes[0]: 2.0 must be an integer"),
    ("nodes-minus-zero", cli(axes={"nodes": [-0.0]}), "axes.nodes[0]: -0.0 must be an integer"),
    ("nodes-bool", cli(axes={"nodes": [True]}), "axes.nodes[0]: True is a boolean"),
    ("nodes-inf", cli(axes={"nodes": [1, float("inf")]}), "axes.nodes[1]: inf is not a finite"),
    ("nodes-overflow", config_text("axes:\n  nodes: [1.0e+400]\n"), "axes.nodes[0]: inf"),
    ("repetitions-float", cli(repetitions=2.0), "repetitions: 2.0 must be an integer"),
    ("repetitions-bool", cli(repetitions=True), "repetitions: True is a boolean"),
    ("steps-exponent", config_text("steps: 1.0e+3\n"), "steps: 1000.0 must be an integer"),
    ("warmup-bool", cli(warmup_steps=False), "warmup_steps: False is a boolean"),
    ("per-rank-batch-float", cli(per_rank_batch=32.0), "per_rank_batch: 32.0 must be an integer"),
    ("ranks-per-node-inf", cli(ranks_per_node=float("inf")), "ranks_per_node: inf is not a"),
    ("global-batch-float", cli(global_batch=64.0), "global_batch: 64.0 must be an integer"),
    (
        "straggler-nan",
        config_text("straggler_threshold: .nan\n"),
        "straggler_threshold: nan is not a finite number; it must be a number",
    ),
    ("straggler-inf", cli(straggler_threshold=float("inf")), "straggler_threshold: inf is not"),
    ("straggler-minus-inf", config_text("straggler_threshold: -.inf\n"), "-inf is not a finite"),
    ("straggler-bool", cli(straggler_threshold=True), "straggler_threshold: True is a boolean"),
    ("column-width-nan", cli(report={"column_width_in": float("nan")}), "column_width_in: nan"),
    ("column-width-inf", cli(report={"column_width_in": float("inf")}), "column_width_in: inf"),
    ("learning-rate-nan", cli(optimizer={"learning_rate": float("nan")}), "learning_rate: nan"),
    ("momentum-nan", cli(optimizer={"momentum": float("nan")}), "optimizer.momentum: nan is not"),
    ("momentum-bool", cli(optimizer={"momentum": True}), "optimizer.momentum: True is a boolean"),
    ("max-cells-float", cli(max_cells=1.5), "max_cells: 1.5 must be an integer"),
    ("exclude-nodes-float", cli(exclude=[{"nodes": 2.0}]), "exclude[0].nodes: 2.0 must be an"),
    ("hw-gpus-float", hardware(gpus_per_node=4.0), "cpu.gpus_per_node: 4.0 must be an integer"),
    ("hw-cpus-bool", hardware(cpus_per_rank=True), "cpu.cpus_per_rank: True is a boolean"),
    ("hw-mem-nan", hardware(mem_mb_per_rank=float("nan")), "cpu.mem_mb_per_rank: nan is not"),
    ("hw-max-nodes-float", hardware(max_nodes=2.0), "cpu.max_nodes: 2.0 must be an integer"),
    ("hw-runtime-minus-zero", hardware(runtime_min=-0.0), "cpu.runtime_min: -0.0 must be an"),
    ("hw-exclusive-int", hardware(exclusive=1), "cpu.exclusive: 1 must be true or false"),
    ("remeasure-string", cli(remeasure="yes"), "remeasure: 'yes' must be true or false"),
    ("hw-runtime-huge", hardware(runtime_min=10**9), "cpu.runtime_min: 1000000000 must be <="),
]

STRINGS = [
    ("study-newline", cli(study="demo\n"), "study: 'demo\\n' is not a valid name"),
    ("study-cr", cli(study="demo\r"), "study: 'demo\\r' is not a valid name"),
    ("study-non-ascii", cli(study="démo"), "study: 'démo' is not a valid name"),
    ("axis-hardware-newline", cli(axes={"hardware": ["cpu\n"]}), "axes.hardware[0]: 'cpu\\n'"),
    (
        "hw-key-newline",
        hardware_map({"cpu\n": {"device": "cpu"}}),
        "(top level): 'cpu\\n' is not a valid name",
    ),
    ("hw-partition-newline", hardware(partition="gpu\n"), "cpu.partition: 'gpu\\n' is not"),
    ("hw-partition-empty", hardware(partition=""), "cpu.partition: '' is not a valid name"),
    ("hw-gpu-type-newline", hardware(gpu_type="a100\n"), "cpu.gpu_type: 'a100\\n' is not"),
    ("hw-constraint-newline", hardware(constraint="h100\n"), "cpu.constraint: 'h100\\n' is not"),
    ("hw-constraint-semicolon", hardware(constraint="a;reboot"), "cpu.constraint: 'a;reboot'"),
    ("hw-constraint-subshell", hardware(constraint="$(id)"), "cpu.constraint: '$(id)' is not"),
    ("hw-constraint-space", hardware(constraint="a --wrap=id"), "cpu.constraint: 'a --wrap=id'"),
    ("hw-constraint-quote", hardware(constraint="a'b"), 'cpu.constraint: "a\'b" is not'),
    ("hw-constraint-backtick", hardware(constraint="`id`"), "cpu.constraint: '`id`' is not"),
    ("hw-constraint-long", hardware(constraint="a" * 300), "cpu.constraint: longer than 256"),
    ("hw-description-newline", hardware(description="a\nb"), "cpu.description: 'a\\nb' is not"),
    ("hw-device-model-nul", hardware(device_model="x\x00"), "cpu.device_model: 'x\\x00' is not"),
    ("title-newline", cli(report={"title": "a\nb"}), "report.title: 'a\\nb' is not allowed"),
    ("title-tab", cli(report={"title": "a\tb"}), "report.title: 'a\\tb' is not allowed"),
    ("title-emoji", cli(report={"title": "Scaling 😀"}), "report.title: 'Scaling 😀' is not"),
    ("title-cjk", cli(report={"title": "日本語"}), "no other scripts or emoji"),
    ("title-unsupported-latin", cli(report={"title": "Ħello"}), "report.title: 'Ħello' is not"),
    ("title-long", cli(report={"title": "x" * 500}), "report.title: longer than 200"),
    ("hardware-file-newline", cli(hardware_file="config/hardware.yaml\n"), "hardware_file: '"),
    ("study-file-empty", cli(study_file=""), "study_file: '' must name a YAML file"),
    ("study-file-not-string", cli(study_file=3), "study_file: 3 must name a YAML file"),
    ("exclude-newline", cli(exclude=[{"model": "cnn_small\n"}]), "exclude[0].model: 'cnn_small"),
    ("exclude-long", cli(exclude=[{"model": "x" * 100}]), "exclude[0].model: longer than 64"),
    ("launcher-unknown", cli(launcher="mpirun"), "launcher: 'mpirun' is not allowed"),
    ("long-value-truncated", cli(study="x" * 100_000), "study: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxx"),
]

FILES = [
    ("hw-directory", hardware_path(_dir), "adir is a directory, not a regular YAML file"),
    ("hw-empty-path", cli(hardware_file=""), "hardware_file: must not be empty"),
    ("hw-blank-path", cli(hardware_file="   "), "the path is empty; name a YAML file"),
    ("hw-dev-urandom", cli(hardware_file="/dev/urandom"), "is a character device, not a regular"),
    ("hw-dev-zero", cli(hardware_file="/dev/zero"), "/dev/zero is a character device"),
    ("hw-fifo", hardware_path(_fifo), "fifo.yaml is a FIFO (named pipe), not a regular"),
    ("hw-link-urandom", hardware_path(_symlink_to("/dev/urandom")), "is a character device"),
    (
        "hw-proc-file",
        cli(hardware_file="/proc/self/environ"),
        "not valid YAML: unacceptable character #x0000",
    ),
    ("hw-missing", cli(hardware_file="nope.yaml"), "file not found"),
    ("hw-invalid-utf8", hardware_text(b"cpu:\n  device: cpu\n  description: \xff\xfe\n"), "UTF-8"),
    ("hw-utf16", hardware_text("cpu:\n  device: cpu\n".encode("utf-16")), "is not UTF-8 text"),
    ("hw-bomb", hardware_text(BOMB), "expands to more than 100,000 values"),
    ("hw-duplicate-key", hardware_text("cpu:\n  device: cpu\n  device: cuda\n"), "duplicate key"),
    (
        "hw-duplicate-entry",
        hardware_text("cpu:\n  device: cpu\ncpu:\n  device: cuda\n"),
        "duplicate key 'cpu' (line 1 and again at line 3)",
    ),
    ("hw-not-mapping", hardware_text("- cpu\n"), "(top level): must be a mapping of hardware"),
    ("hw-empty-file", hardware_text(""), "(top level): must be a mapping of hardware keys"),
    ("hw-python-tag", hardware_text("cpu: !!python/object/apply:os.system [id]\n"), "not valid"),
    ("hw-big", hardware_path(_sparse(50_000_000)), "is 50,000,000 bytes; a configuration file"),
    ("hw-tabs", hardware_text("cpu:\n\tdevice: cpu\n"), "not valid YAML"),
    (
        "hw-yte",
        hardware_text("__use_yte__: true\n"),
        "(top level): '__use_yte__' is not a valid name",
    ),
    ("config-invalid-utf8", config_text(b"study: d\xe9mo\n"), "is not UTF-8 text"),
    ("config-bomb", config_text(BOMB), "expands to more than 100,000 values"),
    ("config-big", config_text(BIG_LINES), "a configuration file may have at most 1,000,000"),
    (
        "config-duplicate",
        config_text("study: demo\nsteps: 10\nsteps: 20\n"),
        "duplicate key 'steps' (line 2 and again at line 3)",
    ),
    ("config-duplicate-nested", config_text("axes:\n  nodes: [1]\n  nodes: [2]\n"), "'nodes'"),
    ("config-not-mapping", config_text("[1, 2]\n"), "(top level): must be a mapping of keys"),
    ("config-scalar", config_text("hello\n"), "got str"),
    ("config-two-documents", config_text("study: a\n---\nstudy: b\n"), "single document"),
    ("config-int-key", config_text("1: x\n"), "the key 1 is not a string"),
    ("config-bool-key", config_text("on: x\n"), "the key True is not a string"),
    ("config-deep", config_text(DEEP), "nests deeper than 32 levels"),
    ("config-very-deep", config_text(VERY_DEEP), "nests deeper than 32 levels"),
    ("config-nul", config_text("study: demo\x00\n"), "not valid YAML"),
    ("config-python-tag", config_text("study: !!python/name:os.system\n"), "not valid YAML"),
    ("study-file-missing", cli(study_file="nope.yaml"), "file not found"),
    ("study-file-directory", study_path(_dir), "adir is a directory, not a regular YAML file"),
    ("study-file-fifo", study_path(_fifo), "is a FIFO (named pipe)"),
    ("study-file-urandom", cli(study_file="/dev/urandom"), "is a character device"),
    ("study-file-bomb", study_text(BOMB), "expands to more than 100,000 values"),
    ("study-file-big", study_path(_sparse(50_000_000)), "is 50,000,000 bytes"),
    ("study-file-duplicate", study_text("steps: 1\nsteps: 2\n"), "duplicate key 'steps'"),
    ("study-file-nested", study_text("study_file: other.yaml\n"), "cannot name another one"),
    ("study-file-invalid-utf8", study_text(b"\xc3\x28: 1\n"), "is not UTF-8 text"),
    ("configfile-duplicate", configfile_text("steps: 1\nsteps: 2\n"), "--configfile"),
]

SIZE = [
    (
        "cells-29-million",
        _many_gpu_keys,
        "the study plans 29,280,004 cells (64 hardware x 5 framework",  # + 4 convergence cells
    ),
    ("cells-over-limit", cli(max_cells=10), "the study plans 20 cells"),  # 16 + 4 convergence
    ("cells-limit-named", cli(max_cells=10), "the limit is 10."),
    ("max-cells-zero", cli(max_cells=0), "max_cells: 0 must be >= 1"),
    ("max-cells-huge", cli(max_cells=10**9), "max_cells: 1000000000 must be <= 1000000"),
    ("hardware-list-long", cli(axes={"hardware": [f"h{i}" for i in range(65)]}), "at most 64"),
    ("nodes-list-long", cli(axes={"nodes": list(range(1, 66))}), "lists 65 values; at most 64"),
    ("exclude-list-long", cli(exclude=[{"nodes": 1}] * 1001), "at most 1000 are allowed"),
    (
        "hardware-keys-many",
        hardware_map({f"h{i}": {"device": "cpu"} for i in range(257)}),
        "(top level): names 257 keys; at most 256 are allowed",
    ),
]

TEMPLATES = [
    ("yte-config", config_text(YTE), "__use_yte__: a study file is plain YAML"),
    ("yte-study-file", study_text(YTE), "dlscale never evaluates it as a template"),
    ("yte-false", study_text("__use_yte__: false\n"), "__use_yte__: a study file is plain"),
    ("yte-configfile", configfile_text(YTE), "--configfile"),
    ("yte-hardware", hardware_text(YTE), "(top level): '__use_yte__' is not a valid name"),
]

PROFILES = [
    ("slurm-with-local", _launcher("slurm", "local"), "Add launcher=srun to your --config"),
    ("local-with-srun", _launcher("local", "srun"), "outside any Slurm allocation"),
]

SEMANTICS = [
    ("nodes-over-max", cli(axes={"nodes": [1, 4]}), "exceed max_nodes=2 of hardware 'cpu'"),
    ("fp16-on-cpu", cli(axes={"precision": ["fp16"]}), "'fp16' needs a GPU"),
    ("hardware-undefined", cli(axes={"hardware": ["tpu"]}), "'tpu' is not defined in"),
    ("exclude-everything", cli(exclude=[{"nodes": 1}, {"nodes": 2}]), "every cell of the matrix"),
    ("global-batch-indivisible", cli(global_batch=15), "not divisible by world size(s) [2]"),
    ("cuda-without-gpus", hardware(device="cuda"), "needs gpus_per_node >= 1"),
    ("misspelt-key", cli(step=10), "unknown key 'step' (did you mean 'steps'?)"),
]

CORPUS: list[tuple[str, Callable, str]] = (
    NUMBERS + STRINGS + FILES + SIZE + TEMPLATES + PROFILES + SEMANTICS
)


def reject(ws: Path, setup: Callable) -> str:
    """Run one case in workspace `ws` (the working directory) and return the refusal's
    message; raises AssertionError when the input is accepted."""
    from dlscale.study.config import ConfigError
    from dlscale.study.matrix import load_workflow_study
    from dlscale.study.matrix_checks import launcher_problem

    given = setup(ws)
    if "launcher" in given:
        executor, launcher, in_allocation = given["launcher"]
        problem = launcher_problem(executor, launcher, in_allocation=in_allocation)
        assert problem is not None, "accepted"
        return problem
    try:
        load_workflow_study(given.get("cli", {}), ws, given.get("configfiles", []))
    except ConfigError as exc:
        return str(exc)
    raise AssertionError("accepted")


def summary(rows: list[dict]) -> str:
    return json.dumps(rows, indent=1)
