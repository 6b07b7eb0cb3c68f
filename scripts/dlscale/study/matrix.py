"""The study matrix: where a cell's parameters enter.

A *cell* (dlscale.study.cell.Cell) is one combination of the axes (hardware x framework x model x
policy x precision x nodes) and one repetition. Everything a rank needs to know about its cell
is derived here, once, from the validated config and hardware map (the fields beyond the axes'
own values: dlscale.study.cell_fields); the workflow hands the launcher the Cell, and the
launcher hands it to the ranks, serialised whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from dlscale.models import cell_seq_len
from dlscale.registry.frameworks import FRAMEWORKS, VARIANTS, environment_name
from dlscale.registry.parallel_dims import cell_tp_degree
from dlscale.study import script_workload
from dlscale.study.cell import AXES, Cell
from dlscale.study.cell_fields import (
    cell_compile_scope,
    cell_tp_plan,
    fsdp_mixed_precision,
    llm_step_fields,
    one_device_mixed_precision,
    optimizer_fields,
    pipeline_fields,
    placement_fields,
)
from dlscale.study.config import (
    ConfigError,
    load_config_file,
    load_schema,
    load_yaml,
    validate_config,
)
from dlscale.study.container_image import ImageError, container_problems, image_digest
from dlscale.study.container_image import environment_id as container_environment_id
from dlscale.study.container_image import spec as container_spec
from dlscale.study.hardware import environment_variant, validate_hardware
from dlscale.study.hashes import config_hash, hashed_hardware
from dlscale.study.matrix_checks import semantic_problems
from dlscale.study.study_models import apply as apply_study_models
from dlscale.study.study_models import study_models as check_study_models
from dlscale.study.study_size import cell_count_problem
from dlscale.study.workloads import (
    data_path,
    excluded,
    ranks_per_node,
    ranks_per_node_values,
    strong_global_batch,
    workload_axes,
    workload_batches,
    workload_repetitions,
)


@dataclass
class Study:
    config: dict
    hardware: dict
    cells: list[Cell]
    config_hash: str
    # what a study file left out of its convergence section and took from config/config.yaml
    # (key paths under `convergence`; workflow_settings), said in the dry run and the driver's
    # first lines (inherited_notice)
    inherited: tuple[str, ...] = ()
    source: str = "config/config.yaml"  # the study file (or --configfile) that names the study

    def by_key(self) -> dict[tuple, Cell]:
        return {c.key: c for c in self.cells}

    def resource_classes(self) -> list[tuple[str, int]]:
        """The (hardware, nodes) pairs of the study. Every Slurm resource of a cell derives from
        these two (dlscale.study.resources, rules/train.smk), so the cells of one pair can share a
        job
        array."""
        return sorted({(c.hardware, c.nodes) for c in self.cells})

    def train_rules(self) -> list[tuple[str, str, int, str, int | None]]:
        """The (workload, hardware, nodes, parallelism, ranks per node named in the path) of the
        study: one train rule each (dlscale.study.cell.train_rule), its Slurm resources those
        of (hardware, nodes, ranks per node). The last is None for cells of their hardware's
        default ranks per node (every cell of a study without axes.ranks_per_node)."""
        return sorted(
            {
                (c.workload, c.hardware, c.nodes, c.parallelism, c.ranks_per_node)
                if c.ranks_in_path
                else (c.workload, c.hardware, c.nodes, c.parallelism, None)
                for c in self.cells
            },
            key=lambda rule: (*rule[:4], rule[4] or 0),
        )

    def train_classes(self) -> list[tuple[str, str, int]]:
        """The (workload, hardware, nodes) triples of the study: one train rule each
        (dlscale.study.cell.TRAIN_RULES), its Slurm resources those of (hardware, nodes)."""
        return sorted({(c.workload, c.hardware, c.nodes) for c in self.cells})

    def cells_of(self, workload: str) -> list[Cell]:
        return [c for c in self.cells if c.workload == workload]

    def throughput_models(self) -> list[str]:
        """The models of the study's throughput cells, in axes.model's order: the planner's
        default jobs (rules/plan.smk), the only models it plans from; none for a study without
        throughput cells, whatever axes.model says."""
        measured = {c.model for c in self.cells_of("throughput")}
        return [m for m in self.config["axes"]["model"] if m in measured]

    def axis_values(self) -> dict[str, list]:
        """Every value each wildcard takes, over all workloads."""
        values = {axis: [] for axis in AXES}
        for axes in workload_axes(self.config).values():
            for axis in AXES:
                values[axis] += [v for v in axes[axis] if v not in values[axis]]
        values["ranks_per_node"] = sorted({c.ranks_per_node for c in self.cells})
        values["rep"] = list(range(1, max(workload_repetitions(self.config).values()) + 1))
        values["study"] = [self.config["study"]]
        return values


def _short_hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


def requirements_text(path: Path) -> str:
    """A pip requirements file with its `-r` includes inlined (what the environment's identity
    hashes: a change in an included file changes the environment)."""
    text = path.read_text()
    if not any(line.strip().startswith("-r ") for line in text.splitlines()):
        return text  # as hashed before includes were inlined
    out = []
    for line in text.splitlines():
        if line.strip().startswith("-r "):
            out.append(requirements_text(path.parent / line.strip()[3:].strip()))
        else:
            out.append(line)
    return "\n".join(out)


def environment_ids(workflow_dir: str | Path) -> dict[tuple[str, str], str]:
    """(framework, variant or CUDA line) -> `<environment>:<hash of its pinned requirements>`
    (envs/<environment>.txt, `-r` includes inlined; PyTorch's CPU build runs in the driver
    environment, envs/pytorch.txt): what a cell's framework versions are, as far as they are
    known before it runs. The CPU variant's ids are what they were before variants existed;
    a CUDA line's (PyTorch's cu128, ...: its record's cuda_lines) is its own environment's."""
    out = {}
    for (framework, key), env in _environment_names().items():
        req = Path(workflow_dir) / "envs" / f"{env}.txt"
        digest = _short_hash(requirements_text(req)) if req.exists() else "unknown"
        out[framework, key] = f"{env}:{digest}"
    return out


def _environment_names() -> dict[tuple[str, str], str]:
    """(framework, variant or CUDA line) -> the environment's name (the driver's: pytorch)."""
    out = {}
    for name, record in FRAMEWORKS.items():
        for variant in VARIANTS:
            out[name, variant] = environment_name(name, variant) or "pytorch"
        for line, env in zip(record.cuda_lines[1:], record.line_environments(), strict=True):
            out[name, line] = env
    # float8 cells: the environment with torchao beside each PyTorch CUDA environment
    for (name, key), env in list(out.items()):
        if "float8" in FRAMEWORKS[name].capabilities and key != "cpu":
            out[name, float8_key(key)] = float8_environment(env)
    return out


def float8_key(key: str) -> str:
    """The environment_ids key of a float8 cell's environment (its variant's or line's)."""
    return f"{key}+float8"


def float8_environment(env: str | None) -> str:
    """The environment a float8 cell runs in: `<environment>-float8`, its pins and torchao
    (envs/<environment>-float8.txt; never envs/pytorch.txt, which every PyTorch cell's identity
    holds)."""
    return f"{env or 'pytorch'}-float8"


def cell_environment_key(combo: dict, hw: dict) -> tuple[str, str]:
    """A cell's environment_ids key: its framework's (environment_key), or the float8
    environment beside it for a float8 cell."""
    framework, key = environment_key(combo["framework"], hw)
    if combo["precision"] == "float8" and "float8" in FRAMEWORKS[framework].capabilities:
        return framework, float8_key(key)
    return framework, key


def environment_key(framework: str, hw: dict) -> tuple[str, str]:
    """The key of a cell's environment in environment_ids: its hardware's variant, or the CUDA
    line the entry's stated driver runs (Framework.line_for)."""
    variant = environment_variant(hw)
    return framework, FRAMEWORKS[framework].line_for(variant, hw) or variant


def _fixed_fields(config: dict, by_workload: dict) -> dict[str, dict]:
    """workload -> the Cell fields every cell of that workload shares."""
    fixed = {
        "throughput": {
            "warmup_steps": config["warmup_steps"],
            "steps": config["steps"],
            "learning_rate": config["optimizer"]["learning_rate"],
            # a deadline, in no cell's identity (dlscale.study.cell.NOT_IDENTITY)
            "first_step_timeout_s": config["first_step_timeout_s"],
        },
    }
    if "convergence" in by_workload:
        conv = config["convergence"]
        # a convergence cell trains by epochs: no warm-up or timed steps
        fixed["convergence"] = {
            "warmup_steps": 0,
            "steps": 0,
            "learning_rate": conv["learning_rate"],
            "workload": "convergence",
            "dataset": conv["dataset"],
            "data_format": conv["data_format"],
            "data_path": data_path(config),
            "target_accuracy": conv["target_accuracy"],
            "max_epochs": conv["max_epochs"],
            "lr_rule": conv["lr_rule"],
            "warmup_epochs": conv["warmup_epochs"],
            "loader_workers": conv["loader_workers"],
        }
    return fixed


def mark_traced(config: dict, cells: list) -> list:
    """The cells with the first one config `trace` names (a glob over its place: cell_label)
    given its trace steps (Cell.trace_steps, trace_nsys: in no identity or hash)."""
    import dataclasses
    import fnmatch

    from dlscale.study.cell import cell_label

    trace = config.get("trace")
    if not trace:
        return cells
    for i, cell in enumerate(cells):
        if fnmatch.fnmatchcase(cell_label(cell.as_dict()), trace.get("cell", "*")):
            cells[i] = dataclasses.replace(
                cell, trace_steps=trace.get("steps", 3), trace_nsys=bool(trace.get("nsys"))
            )
            return cells
    example = cell_label(cells[0].as_dict()) if cells else "none"
    raise ConfigError(
        "config",
        [
            f"trace.cell: {trace.get('cell')!r} matches no cell of the study; allowed values: a "
            f"glob over a cell's place, e.g. {example!r}"
        ],
    )


def _combo_cells(
    config: dict,
    hardware: dict,
    workload: str,
    axes: dict,
    combo: dict,
    shared: dict,
    reps: int,
) -> list[Cell]:
    """The cells (one per repetition) of one combination of axis values, its ranks per node
    included. `shared`: the fields every cell of the workload has (_fixed_fields, momentum,
    launcher, study), plus `hardware_hashes` and `environments`."""
    per_rank_setting, _ = workload_batches(config, workload)
    combo = dict(combo)
    rpn = combo.pop("ranks_per_node")
    hw = hardware[combo["hardware"]]
    world = combo["nodes"] * rpn
    if combo["policy"] == "weak":
        per_rank, global_batch = per_rank_setting, per_rank_setting * world
    else:
        global_batch = strong_global_batch(config, hw, workload)
        per_rank = global_batch // world
    extra = dict(shared["fields"])
    if workload == "convergence":
        extra["stage_dir"] = hw.get("stage_dir")
        # the base learning rate's batch: stated, or the global batch at the smallest
        # node count (the cells' own strong global batch by default)
        extra["reference_batch"] = config["convergence"]["reference_batch"] or (
            per_rank_setting * rpn * min(axes["nodes"])
        )
    if rpn != ranks_per_node(config, hw):  # the path names it (only where the axis is set)
        extra["ranks_in_path"] = True
    return [
        Cell(
            **combo,
            rep=rep,
            **placement_fields(
                combo["hardware"],
                hw,
                shared,
                cell_environment_key(combo, hw),
                rpn,
                per_rank,
                global_batch,
            ),
            tp_degree=cell_tp_degree(combo["parallelism"], rpn, config["tp_degree"]),
            **pipeline_fields(config, combo["parallelism"], world, rpn, per_rank),
            seq_len=cell_seq_len(combo["model"], config.get("seq_len")),
            fsdp_mixed_precision=fsdp_mixed_precision(combo["parallelism"], combo["precision"])
            or one_device_mixed_precision(config, combo, world),
            tp_plan=cell_tp_plan(combo["parallelism"], combo["model"]),
            compile_scope=cell_compile_scope(combo["framework"], combo["mode"], combo["model"]),
            activation_checkpointing=config.get("activation_checkpointing", "none"),
            **llm_step_fields(config, combo, world),
            **optimizer_fields(config, combo["model"]),
            **shared["common"],
            **extra,
        )
        for rep in range(1, reps + 1)
    ]


def build_matrix(
    config: dict,
    hardware: dict,
    hardware_source: str = "hardware file",
    environments: dict[str, str] | None = None,
    workflow_dir: str | Path | None = None,
) -> Study:
    """Expand validated config + hardware into the list of cells (product minus exclusions).
    `environments`: framework -> environment id (environment_ids; default: the name only);
    `workflow_dir`: the checkout (the study's own models: their config files, environments; a
    script's relative paths: the script workload)."""
    too_many = cell_count_problem(config)
    if too_many:
        raise ConfigError("config", [too_many])
    # the study's own models (config `models:`), checked in their environments and registered
    study_models = check_study_models(
        config, hardware, workflow_dir, workload_axes(config), ranks_per_node_values
    )
    problems = semantic_problems(config, hardware, hardware_source)
    scripts = {}
    if script_workload.used(config):  # checked and hashed; nothing of a script runs here
        scripts, script_problems = script_workload.read_scripts(config, workflow_dir or ".")
        problems += script_problems
    if problems:
        raise ConfigError("config", problems)
    environments = environments or {
        key: f"{env}:unknown" for key, env in _environment_names().items()
    }
    # the planner's site facts (PLANNING_KEYS) change no measurement, and keys added later count
    # only away from their default (LATER_DEFAULTS): left out, so adding or editing them keeps
    # every measured cell current (dlscale.study.hashes.hashed_hardware)
    by_workload = workload_axes(config)
    hardware_hashes = {
        key: _short_hash(hashed_hardware(hardware[key]))
        for axes in by_workload.values()
        for key in axes["hardware"]
    }
    containers = _containers(config, hardware, hardware_source, by_workload)
    common = {
        "momentum": config["optimizer"]["momentum"],
        "launcher": config["launcher"],
        "study": config["study"],
    }
    fixed = _fixed_fields(config, by_workload)
    reps = workload_repetitions(config)
    cells = []
    for workload, axes in by_workload.items():
        shared = {
            "fields": fixed.get(workload, {}),
            "common": common,
            "hardware_hashes": hardware_hashes,
            "environments": environments,
            "containers": containers,
        }
        if workload == script_workload.SCRIPT_WORKLOAD:
            cells += script_workload.script_cells(
                config, hardware, axes, shared, reps[workload], scripts, cell_environment_key
            )
            continue
        for combo_values in itertools.product(*(axes[a] for a in AXES)):
            combo = dict(zip(AXES, combo_values))
            for rpn in ranks_per_node_values(config, hardware[combo["hardware"]], workload):
                combo["ranks_per_node"] = rpn
                if excluded(combo, config["exclude"]):
                    continue
                cells += _combo_cells(
                    config, hardware, workload, axes, combo, shared, reps[workload]
                )
    if not cells:
        raise ConfigError(
            "config", ["exclude: every cell of the matrix is excluded; nothing to run"]
        )
    cells = apply_study_models(cells, study_models, hardware, workflow_dir, requirements_text)
    cells = mark_traced(config, cells)
    return Study(
        config=config, hardware=hardware, cells=cells, config_hash=config_hash(config, hardware)
    )


def _containers(
    config: dict, hardware: dict, source: str, by_workload: dict
) -> dict[str, tuple[dict, str]]:
    """hardware key -> (the container as its cells carry it, their environment id) for each
    entry the study uses that names a container: the image's digest, computed (or read from the
    cache) once per entry (dlscale.study.container_image); an image that cannot be identified,
    or one the study's launcher cannot start, stops the study here."""
    out, problems = {}, []
    used = sorted({key for axes in by_workload.values() for key in axes["hardware"]})
    for key in used:
        c = hardware[key].get("container")
        if not c:
            continue
        problems += container_problems(key, hardware[key], config["launcher"])
        try:
            digest = image_digest(key, c)
        except ImageError as exc:
            problems.append(str(exc))
            continue
        carried = {**container_spec(hardware[key]), "digest": digest}
        out[key] = (carried, container_environment_id(c["engine"], digest))
    if problems:
        raise ConfigError(source, problems)
    return out


DEFAULT_STUDY_FILE = "config/config.yaml"
# A study file (`study_file`, or a --configfile) measures the workloads it names: `workloads` is
# never taken from config/config.yaml (the demo's convergence cells are the demo's), so a study
# file without it measures throughput only, the schema's default. A study file that lists
# convergence takes what its own `convergence` section leaves out from config/config.yaml's
# section, and the run says which keys (Study.inherited, inherited_notice). Every other key a
# study file leaves out is config/config.yaml's (docs/pages/configuration.md, "Study files").
NOT_INHERITED = ("workloads",)
SAID_WHEN_INHERITED = "convergence"


def merge_config(base: dict, over: dict) -> dict:
    """`over`'s keys replace `base`'s, mappings merged key by key, lists replaced whole
    (Snakemake's rule for --configfile and --config)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = value
    return out


def _resolve(workflow_dir: Path, path: str) -> Path:
    path = Path(path)
    return path if path.is_absolute() else workflow_dir / path


def workflow_config(
    cli_config: dict, workflow_dir: str | Path, configfiles: list[str | Path] = ()
) -> dict:
    """The study's configuration as the workflow sees it, read by dlscale only (bounded, strict
    YAML, never a template): config/config.yaml, then the `study_file` named on the command
    line (--config study_file=...), then the rest of the command line's --config. Files given
    with Snakemake's own --configfile (`configfiles`; Snakemake has read them already) are read
    again, so duplicate keys, templates and oversized files are refused all the same. A study
    given in a file takes no `workloads` from config/config.yaml (NOT_INHERITED)."""
    return workflow_settings(cli_config, workflow_dir, configfiles)[0]


def _leaves(mapping: dict, prefix: str = "") -> list[str]:
    """The key paths of a mapping's values, one level of nesting (convergence.axes.model)."""
    out = []
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out += [f"{prefix}{key}.{sub}" for sub in value]
        else:
            out.append(f"{prefix}{key}")
    return out


def _is_set(mapping: dict, path: str) -> bool:
    node = mapping
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def workflow_settings(
    cli_config: dict, workflow_dir: str | Path, configfiles: list[str | Path] = ()
) -> tuple[dict, str, tuple[str, ...]]:
    """workflow_config's configuration, the file that names the study (the `study_file`, else
    the last --configfile, else config/config.yaml) and the key paths a study file that lists
    convergence took from config/config.yaml's `convergence` section (empty for the default
    study, or a study that measures no convergence cells)."""
    workflow_dir = Path(workflow_dir)
    for path in configfiles:
        load_config_file(path, source=f"--configfile {path}")
    base = load_config_file(workflow_dir / DEFAULT_STUDY_FILE, source=DEFAULT_STUDY_FILE)
    cli_config = dict(cli_config)
    study_file = cli_config.get("study_file")
    study: dict = {}
    source = str(configfiles[-1]) if configfiles else DEFAULT_STUDY_FILE
    if study_file is not None:
        if not isinstance(study_file, str) or not study_file.strip():
            raise ConfigError("--config", [f"study_file: {study_file!r} must name a YAML file"])
        study = load_config_file(_resolve(workflow_dir, study_file), source=study_file)
        if "study_file" in study:
            raise ConfigError(study_file, ["study_file: a study file cannot name another one"])
        source = study_file
    if source == DEFAULT_STUDY_FILE:
        return merge_config(base, cli_config), source, ()
    # a study file's own: Snakemake's config holds the --configfile files and --config
    own = merge_config(study, cli_config)
    config = merge_config(
        merge_config({k: v for k, v in base.items() if k not in NOT_INHERITED}, study), cli_config
    )
    inherited: tuple[str, ...] = ()
    section = base.get(SAID_WHEN_INHERITED)
    workloads = config.get("workloads")
    if isinstance(section, dict) and isinstance(workloads, list) and "convergence" in workloads:
        inherited = tuple(
            path for path in _leaves(section, f"{SAID_WHEN_INHERITED}.") if not _is_set(own, path)
        )
    return config, source, inherited


def inherited_notice(study: Study) -> str | None:
    """The line the dry run and the driver print when a study file took convergence settings
    from config/config.yaml: which keys, and what they gave (its convergence cells)."""
    if not study.inherited:
        return None
    prefix = f"{SAID_WHEN_INHERITED}."
    keys = ", ".join(path.removeprefix(prefix) for path in study.inherited)
    cells = study.cells_of("convergence")
    hardware = ", ".join(sorted({c.hardware for c in cells}))
    return (
        f"study {study.config['study']!r} ({study.source}) lists convergence and takes these "
        f"keys of its `convergence` section from {DEFAULT_STUDY_FILE}: {keys} ({len(cells)} "
        f"convergence cell(s), hardware {hardware}). Set them in {study.source} to change them."
    )


def load_workflow_study(
    cli_config: dict, workflow_dir: str | Path, configfiles: list[str | Path] = ()
) -> Study:
    """What rules/common.smk calls: workflow_settings, then load_study (the study remembers
    its file and what it took from config/config.yaml's convergence section)."""
    config, source, inherited = workflow_settings(cli_config, workflow_dir, configfiles)
    study = load_study(config, workflow_dir)
    study.source, study.inherited = source, inherited
    return study


def load_study(config: dict, workflow_dir: str | Path) -> Study:
    """Validate config + hardware map (schemas under config/schemas) and build the matrix."""
    workflow_dir = Path(workflow_dir)
    schemas = workflow_dir / "config" / "schemas"
    config = validate_config(config, load_schema(schemas / "config.schema.json"))
    if not config["hardware_file"].strip():
        raise ConfigError("config", ["hardware_file: the path is empty; name a YAML file"])
    hw_path = _resolve(workflow_dir, config["hardware_file"])
    hardware = validate_hardware(
        load_yaml(hw_path, source=str(config["hardware_file"])),
        load_schema(schemas / "hardware.schema.json"),
        source=str(config["hardware_file"]),
    )
    return build_matrix(
        config,
        hardware,
        hardware_source=str(config["hardware_file"]),
        environments=environment_ids(workflow_dir),
        workflow_dir=workflow_dir,
    )
