"""The study matrix: where a cell's parameters enter.

A *cell* (dlscale.study.cell.Cell) is one combination of the axes (hardware x framework x model x
policy x precision x nodes) and one repetition. Everything a rank needs to know about its cell
is derived here, once, from the validated config and hardware map; the workflow hands the
launcher the Cell, and the launcher hands it to the ranks, serialised whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from math import lcm
from pathlib import Path

from dlscale.frameworks import FRAMEWORKS, VARIANTS, environment_name
from dlscale.models import FRAMEWORK_PACKAGES, builds, cell_seq_len
from dlscale.study.cell import AXES, DEFAULT_PARALLELISM, Cell
from dlscale.study.config import (
    ConfigError,
    config_hash,
    environment_variant,
    hashed_hardware,
    load_config_file,
    load_schema,
    load_yaml,
    validate_config,
    validate_hardware,
)
from dlscale.study.parallel_dims import cell_microbatches, cell_pp_degree, cell_tp_degree


@dataclass
class Study:
    config: dict
    hardware: dict
    cells: list[Cell]
    config_hash: str

    def by_key(self) -> dict[tuple, Cell]:
        return {c.key: c for c in self.cells}

    def resource_classes(self) -> list[tuple[str, int]]:
        """The (hardware, nodes) pairs of the study. Every Slurm resource of a cell derives from
        these two (dlscale.study.resources, rules/train.smk), so the cells of one pair can share a
        job
        array."""
        return sorted({(c.hardware, c.nodes) for c in self.cells})

    def train_rules(self) -> list[tuple[str, str, int, str]]:
        """The (workload, hardware, nodes, parallelism) of the study: one train rule each
        (dlscale.study.cell.train_rule), its Slurm resources those of (hardware, nodes)."""
        return sorted({(c.workload, c.hardware, c.nodes, c.parallelism) for c in self.cells})

    def train_classes(self) -> list[tuple[str, str, int]]:
        """The (workload, hardware, nodes) triples of the study: one train rule each
        (dlscale.study.cell.TRAIN_RULES), its Slurm resources those of (hardware, nodes)."""
        return sorted({(c.workload, c.hardware, c.nodes) for c in self.cells})

    def cells_of(self, workload: str) -> list[Cell]:
        return [c for c in self.cells if c.workload == workload]

    def axis_values(self) -> dict[str, list]:
        """Every value each wildcard takes, over all workloads."""
        values = {axis: [] for axis in AXES}
        for axes in workload_axes(self.config).values():
            for axis in AXES:
                values[axis] += [v for v in axes[axis] if v not in values[axis]]
        values["rep"] = list(range(1, max(workload_repetitions(self.config).values()) + 1))
        values["study"] = [self.config["study"]]
        return values


# Datasets dlscale ships: written by the workflow (rules/data.smk) to SHIPPED_DATA_DIR in each
# format; their image shape (height, width, channels) and classes are known before any job.
SHIPPED_DATASETS = {"digits": {"image_shape": (32, 32, 3), "num_classes": 10}}
SHIPPED_DATA_DIR = "results/data/{dataset}/{format}"


def workload_axes(config: dict) -> dict[str, dict]:
    """workload -> the axes its cells span: the study's `axes` for throughput; for convergence
    `convergence.axes`, an axis left out (null) taking the study's value."""
    out = {}
    if "throughput" in config["workloads"]:
        out["throughput"] = config["axes"]
    if "convergence" in config["workloads"]:
        own = config["convergence"]["axes"]
        out["convergence"] = {
            a: own[a] if own.get(a) is not None else config["axes"][a] for a in AXES
        }
        # a convergence cell trains data parallel (its adapters' epochs and evaluation)
        out["convergence"]["parallelism"] = [DEFAULT_PARALLELISM]
    return out


def workload_repetitions(config: dict) -> dict[str, int]:
    reps = {"throughput": config["repetitions"]}
    reps["convergence"] = config["convergence"]["repetitions"] or config["repetitions"]
    return {w: reps[w] for w in workload_axes(config)}


def workload_batches(config: dict, workload: str) -> tuple[int, int | None]:
    """(per_rank_batch, global_batch) setting of a workload's cells (global: strong policy)."""
    if workload == "convergence":
        conv = config["convergence"]
        return conv["per_rank_batch"] or config["per_rank_batch"], conv["global_batch"]
    return config["per_rank_batch"], config["global_batch"]


_PREFIX = {"throughput": "", "convergence": "convergence."}


def axis_key(config: dict, workload: str, axis: str) -> str:
    """How a message names the setting a workload's axis comes from."""
    if workload == "convergence" and config["convergence"]["axes"].get(axis) is None:
        return f"convergence.axes.{axis} (null: axes.{axis})"
    return f"{_PREFIX[workload]}axes.{axis}"


def data_path(config: dict) -> str:
    """Where a convergence cell's ranks read its dataset: a shipped dataset's folder in its
    format (SHIPPED_DATA_DIR), else the configured folder."""
    conv = config["convergence"]
    if conv["dataset"] in SHIPPED_DATASETS:
        return SHIPPED_DATA_DIR.format(dataset=conv["dataset"], format=conv["data_format"])
    return conv["dataset"]


def ranks_per_node(config: dict, hw: dict) -> int:
    """GPU hardware runs one rank per GPU; CPU hardware uses config.ranks_per_node."""
    return hw["gpus_per_node"] if hw["device"] == "cuda" else config["ranks_per_node"]


def strong_global_batch(config: dict, hw: dict, workload: str = "throughput") -> int:
    per_rank, global_batch = workload_batches(config, workload)
    if global_batch is not None:
        return global_batch
    nodes = workload_axes(config)[workload]["nodes"] if workload != "throughput" else None
    return per_rank * ranks_per_node(config, hw) * min(nodes or config["axes"]["nodes"])


def _axes_problems(
    config: dict, workload: str, axes: dict, hardware: dict, hardware_source: str
) -> list[str]:
    problems = []
    key = lambda axis: axis_key(config, workload, axis)  # noqa: E731
    batch_key = f"{_PREFIX[workload]}global_batch"
    for i, hw_key in enumerate(axes["hardware"]):
        if hw_key not in hardware:
            problems.append(
                f"{key('hardware')}[{i}]: {hw_key!r} is not defined in {hardware_source}; "
                f"allowed values: {', '.join(sorted(hardware))}"
            )
            continue
        hw = hardware[hw_key]
        too_many = [n for n in axes["nodes"] if n > hw["max_nodes"]]
        if too_many:
            problems.append(
                f"{key('nodes')}: {too_many} exceed max_nodes={hw['max_nodes']} of hardware "
                f"{hw_key!r} ({hardware_source}); allowed: 1..{hw['max_nodes']}"
            )
        if hw["device"] == "cpu" and "fp16" in axes["precision"]:
            problems.append(
                f"{key('precision')}: 'fp16' needs a GPU, but hardware {hw_key!r} is a CPU; "
                "allowed on CPU: fp32, bf16 (or exclude the combination)"
            )
        if "strong" in axes["policy"]:
            gb = strong_global_batch(config, hw, workload)
            rpn = ranks_per_node(config, hw)
            bad = [n * rpn for n in axes["nodes"] if gb % (n * rpn)]
            if bad:
                problems.append(
                    f"{batch_key}: {gb} (policy 'strong', hardware {hw_key!r}) is not divisible "
                    f"by world size(s) {bad}; choose a multiple of "
                    f"{lcm(*(n * rpn for n in axes['nodes']))}"
                )
    problems += _parallelism_problems(config, axes, hardware)
    return problems


def _parallelism_problems(config: dict, axes: dict, hardware: dict) -> list[str]:
    """Strategies the frameworks do not declare, tensor parallel of a model without a plan,
    and degrees that do not fit the ranks per node (dlscale.study.parallel_dims): refused before
    any job,
    unless `exclude` leaves the combination out."""
    from dlscale.models import get_spec
    from dlscale.study.parallel_dims import TENSOR_PARALLEL, TP_PLANS, degree_problems

    problems = []
    exclude = config["exclude"]
    for strategy in axes.get("parallelism", [DEFAULT_PARALLELISM]):
        for framework in axes["framework"]:
            if strategy in FRAMEWORKS[framework].strategies or _excluded_pair(
                {"framework": framework, "parallelism": strategy}, exclude
            ):
                continue
            able = [f.name for f in FRAMEWORKS.values() if strategy in f.strategies]
            problems.append(
                f"axes.parallelism: {strategy!r} is not supported by framework {framework!r} "
                f"(it supports: {', '.join(FRAMEWORKS[framework].strategies)}); "
                f"frameworks that run "
                f"{strategy}: {', '.join(able)} (or exclude "
                f"{{framework: {framework}, parallelism: {strategy}}})"
            )
        if strategy == "pp":
            problems += [p for p in _pipeline_problems(config, axes, hardware) if p not in problems]
        if strategy not in TENSOR_PARALLEL:
            continue
        for model in axes["model"]:
            arch = get_spec(model).arch if model in models_names() else None
            if arch in TP_PLANS or _excluded_pair(
                {"model": model, "parallelism": strategy}, exclude
            ):
                continue
            able = [m for m in models_names() if get_spec(m).arch in TP_PLANS]
            problems.append(
                f"axes.parallelism: {strategy!r} needs a model with a tensor-parallel plan "
                f"(dlscale.study.parallel_dims.TP_PLANS), and model {model!r} has none; "
                "allowed models: "
                f"{', '.join(able)} (or exclude {{model: {model}, parallelism: {strategy}}})"
            )
        for hw_key in axes["hardware"]:
            if hw_key not in hardware:
                continue
            rpn = ranks_per_node(config, hardware[hw_key])
            tp = cell_tp_degree(strategy, rpn, config["tp_degree"])
            for model in axes["model"]:
                heads = (
                    get_spec(model).arch_kwargs.get("num_heads")
                    if model in models_names()
                    else None
                )
                if heads and get_spec(model).arch == "gpt" and heads % tp:
                    problems.append(
                        f"axes.parallelism: {strategy!r} splits the attention heads of model "
                        f"{model!r} ({heads} heads) over tensor-parallel degree {tp} (hardware "
                        f"{hw_key!r}); allowed tp_degree: a divisor of both "
                        f"{heads} and ranks_per_node {rpn} above 1"
                    )
            for nodes in axes["nodes"]:
                problems += [
                    p
                    for p in degree_problems(
                        strategy, nodes, rpn, config["tp_degree"], f"hardware {hw_key!r}"
                    )
                    if p not in problems
                ]
    return problems


def _pipeline_problems(config: dict, axes: dict, hardware: dict) -> list[str]:
    """pp: a model the pipeline can split (PIPELINE_ARCHS), stages that divide the ranks and
    do not outnumber the layers, micro-batches that divide a pipeline's batch."""
    from dlscale.models import get_spec
    from dlscale.study.parallel_dims import PIPELINE_ARCHS, pipeline_problems

    problems = []
    if "compiled" in axes["mode"] and not _excluded_pair(
        {"mode": "compiled", "parallelism": "pp"}, config["exclude"]
    ):
        problems.append(
            "axes.mode: 'compiled' with parallelism 'pp': the pipeline runs its stages eagerly "
            "(torch.distributed.pipelining), so a compiled pp cell would not be one; allowed "
            "with pp: eager (exclude {mode: compiled, parallelism: pp})"
        )
    for model in axes["model"]:
        spec = get_spec(model) if model in models_names() else None
        if spec is None or _excluded_pair({"model": model, "parallelism": "pp"}, config["exclude"]):
            continue
        if spec.arch not in PIPELINE_ARCHS:
            able = [m for m in models_names() if get_spec(m).arch in PIPELINE_ARCHS]
            problems.append(
                f"axes.parallelism: 'pp' needs a model the pipeline can split into stages, and "
                f"model {model!r} ({spec.arch}) is not one; allowed models: {', '.join(able)} "
                f"(or exclude {{model: {model}, parallelism: pp}})"
            )
            continue
        for hw_key in axes["hardware"]:
            if hw_key not in hardware:
                continue
            rpn = ranks_per_node(config, hardware[hw_key])
            for nodes in axes["nodes"]:
                for policy in axes["policy"]:
                    world = nodes * rpn
                    per_rank = config["per_rank_batch"]
                    if policy == "strong":
                        per_rank = max(1, strong_global_batch(config, hardware[hw_key]) // world)
                    problems += pipeline_problems(
                        world,
                        config["pp_degree"],
                        config["microbatches"],
                        per_rank,
                        spec.arch_kwargs.get("num_layers"),
                        f"hardware {hw_key!r} at {nodes} node(s)",
                    )
    return problems


def _excluded_pair(pair: dict, exclude: list[dict]) -> bool:
    """Whether an exclude entry naming only these axes leaves every such cell out."""
    return any(set(e) <= set(pair) and all(pair[k] == v for k, v in e.items()) for e in exclude)


def _convergence_problems(config: dict, axes: dict) -> list[str]:
    """What only a convergence cell needs: frameworks that declare the workload, and (for a
    shipped dataset, whose shape is known now) models that fit the dataset."""
    from dlscale.frameworks import supporting
    from dlscale.models import get_spec

    problems = []
    able = supporting("convergence")
    for i, framework in enumerate(axes["framework"]):
        if framework not in able:
            problems.append(
                f"{axis_key(config, 'convergence', 'framework')}[{i}]: {framework!r} does not "
                "support the convergence workload (its adapter declares no convergence method); "
                f"allowed values: {', '.join(able)}"
            )
    conv = config["convergence"]
    shipped = SHIPPED_DATASETS.get(conv["dataset"])
    if shipped is not None:
        height, width, channels = shipped["image_shape"]
        for i, name in enumerate(axes["model"]):
            spec = get_spec(name)
            if (
                spec.family != "vision"
                or tuple(spec.input_shape) != (channels, height, width)
                or (spec.num_classes != shipped["num_classes"])
            ):
                fits = [
                    m
                    for m in models_names()
                    if get_spec(m).family == "vision"
                    and tuple(get_spec(m).input_shape) == (channels, height, width)
                    and get_spec(m).num_classes == shipped["num_classes"]
                ]
                problems.append(
                    f"{axis_key(config, 'convergence', 'model')}[{i}]: {name!r} does not fit "
                    f"dataset {conv['dataset']!r} ({height}x{width}x{channels} images, "
                    f"{shipped['num_classes']} classes); allowed values: {', '.join(fits)}"
                )
    return problems


def models_names() -> list[str]:
    from dlscale.models import names

    return names()


def _builder_problems(config: dict, workload: str, axes: dict) -> list[str]:
    """Models a framework of the study has no builder for (dlscale.models.builds: the decoders
    are built by PyTorch's adapters only), unless `exclude` leaves the pair out."""
    problems = []
    for framework in axes["framework"]:
        for model in axes["model"]:
            pair = {"framework": framework, "model": model}
            if builds(framework, model) or any(
                set(e) <= set(pair) and all(pair[k] == v for k, v in e.items())
                for e in config["exclude"]
            ):
                continue
            able = [f for f in FRAMEWORK_PACKAGES if builds(f, model)]
            problems.append(
                f"{axis_key(config, workload, 'model')}: framework {framework!r} has no builder "
                f"for model {model!r}; frameworks that build it: {', '.join(able)} (or exclude "
                f"{{framework: {framework}, model: {model}}})"
            )
    return problems


def _semantic_problems(config: dict, hardware: dict, hardware_source: str) -> list[str]:
    problems = []
    by_workload = workload_axes(config)
    for workload, axes in by_workload.items():
        problems += _axes_problems(config, workload, axes, hardware, hardware_source)
        problems += _builder_problems(config, workload, axes)
    if "convergence" in by_workload:
        problems += _convergence_problems(config, by_workload["convergence"])
    for i, entry in enumerate(config["exclude"]):
        for axis, value in entry.items():
            allowed = []
            for axes in by_workload.values():
                allowed += [v for v in axes[axis] if v not in allowed]
            if value not in allowed:
                problems.append(
                    f"exclude[{i}].{axis}: {value!r} is not a value of axes.{axis}; "
                    f"allowed values: {', '.join(map(str, allowed))}"
                )
    return problems


def _excluded(combo: dict, exclude: list[dict]) -> bool:
    return any(all(combo[k] == v for k, v in entry.items()) for entry in exclude)


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
    """(framework, variant) -> `<environment>:<hash of its pinned requirements>`
    (envs/<environment>.txt, `-r` includes inlined; PyTorch's CPU build runs in the driver
    environment, envs/pytorch.txt): what a cell's framework versions are, as far as they are
    known before it runs. The CPU variant's ids are what they were before variants existed."""
    out = {}
    for framework in FRAMEWORKS:
        for variant in VARIANTS:
            env = environment_name(framework, variant) or "pytorch"
            req = Path(workflow_dir) / "envs" / f"{env}.txt"
            digest = _short_hash(requirements_text(req)) if req.exists() else "unknown"
            out[framework, variant] = f"{env}:{digest}"
    return out


def planned_cell_count(config: dict) -> tuple[int, bool]:
    """(cells, exact): the number of cells a validated config plans over its workloads,
    computed without building them. Exact when nothing is excluded or the axes' product is
    small enough to count; otherwise the product (an upper bound) and False."""
    total, exact = 0, True
    reps = workload_repetitions(config)
    for workload, axes in workload_axes(config).items():
        product = math.prod(len(axes[a]) for a in AXES)
        if config["exclude"] and product <= _COUNT_EXACTLY_UP_TO:
            product = sum(
                not _excluded(dict(zip(AXES, combo)), config["exclude"])
                for combo in itertools.product(*(axes[a] for a in AXES))
            )
        elif config["exclude"]:
            exact = False
        total += product * reps[workload]
    return total, exact


# Axes products up to this size are counted exactly (exclusions applied) before the cap check.
_COUNT_EXACTLY_UP_TO = 200_000


def cell_count_problem(config: dict) -> str | None:
    """The refusal of a study larger than `max_cells`, with its count and the limit."""
    count, exact = planned_cell_count(config)
    limit = config["max_cells"]
    if count <= limit:
        return None
    reps = workload_repetitions(config)
    sizes = " + ".join(
        " x ".join(f"{len(axes[a])} {a}" for a in AXES)
        + f" x {reps[w]} repetitions"
        + ("" if w == "throughput" else f" ({w})")
        for w, axes in workload_axes(config).items()
    )
    how = "" if exact else " before `exclude`"
    return (
        f"max_cells: the study plans {count:,} cells{how} ({sizes}); the limit is {limit:,}. "
        "Shrink the axes or exclude combinations, or raise max_cells (e.g. --config "
        "max_cells=N) if the cluster can take it"
    )


def build_matrix(
    config: dict,
    hardware: dict,
    hardware_source: str = "hardware file",
    environments: dict[str, str] | None = None,
) -> Study:
    """Expand validated config + hardware into the list of cells (product minus exclusions).
    `environments`: framework -> environment id (environment_ids; default: the name only)."""
    too_many = cell_count_problem(config)
    if too_many:
        raise ConfigError("config", [too_many])
    problems = _semantic_problems(config, hardware, hardware_source)
    if problems:
        raise ConfigError("config", problems)
    environments = environments or {
        (f, v): f"{environment_name(f, v) or 'pytorch'}:unknown"
        for f in FRAMEWORKS
        for v in VARIANTS
    }
    # the planner's site facts (PLANNING_KEYS) change no measurement, and keys added later count
    # only away from their default (LATER_DEFAULTS): left out, so adding or editing them keeps
    # every measured cell current (dlscale.study.config.hashed_hardware)
    by_workload = workload_axes(config)
    hardware_hashes = {
        key: _short_hash(hashed_hardware(hardware[key]))
        for axes in by_workload.values()
        for key in axes["hardware"]
    }
    common = {
        "momentum": config["optimizer"]["momentum"],
        "launcher": config["launcher"],
        "study": config["study"],
    }
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
    reps = workload_repetitions(config)
    cells = []
    for workload, axes in by_workload.items():
        per_rank_setting, _ = workload_batches(config, workload)
        for combo_values in itertools.product(*(axes[a] for a in AXES)):
            combo = dict(zip(AXES, combo_values))
            if _excluded(combo, config["exclude"]):
                continue
            hw = hardware[combo["hardware"]]
            rpn = ranks_per_node(config, hw)
            world = combo["nodes"] * rpn
            if combo["policy"] == "weak":
                per_rank, global_batch = per_rank_setting, per_rank_setting * world
            else:
                global_batch = strong_global_batch(config, hw, workload)
                per_rank = global_batch // world
            extra = dict(fixed[workload])
            if workload == "convergence":
                extra["stage_dir"] = hw.get("stage_dir")
                # the base learning rate's batch: stated, or the global batch at the smallest
                # node count (the cells' own strong global batch by default)
                extra["reference_batch"] = config["convergence"]["reference_batch"] or (
                    per_rank_setting * rpn * min(axes["nodes"])
                )
            for rep in range(1, reps[workload] + 1):
                cells.append(
                    Cell(
                        **combo,
                        rep=rep,
                        device=hw["device"],
                        ranks_per_node=rpn,
                        per_rank_batch=per_rank,
                        global_batch=global_batch,
                        cpus_per_rank=hw["cpus_per_rank"],
                        hardware_hash=hardware_hashes[combo["hardware"]],
                        environment=environments[combo["framework"], environment_variant(hw)],
                        gpu_binding=hw["gpu_binding"] if hw["device"] == "cuda" else None,
                        tp_degree=cell_tp_degree(combo["parallelism"], rpn, config["tp_degree"]),
                        pp_degree=cell_pp_degree(combo["parallelism"], world, config["pp_degree"]),
                        microbatches=cell_microbatches(
                            combo["parallelism"],
                            cell_pp_degree(combo["parallelism"], world, config["pp_degree"]),
                            config["microbatches"],
                        ),
                        seq_len=cell_seq_len(combo["model"], config.get("seq_len")),
                        **common,
                        **extra,
                    )
                )
    if not cells:
        raise ConfigError(
            "config", ["exclude: every cell of the matrix is excluded; nothing to run"]
        )
    return Study(
        config=config, hardware=hardware, cells=cells, config_hash=config_hash(config, hardware)
    )


DEFAULT_STUDY_FILE = "config/config.yaml"


def _merge(base: dict, over: dict) -> dict:
    """`over`'s keys replace `base`'s, mappings merged key by key, lists replaced whole
    (Snakemake's rule for --configfile and --config)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
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
    again, so duplicate keys, templates and oversized files are refused all the same."""
    workflow_dir = Path(workflow_dir)
    for path in configfiles:
        load_config_file(path, source=f"--configfile {path}")
    config = load_config_file(workflow_dir / DEFAULT_STUDY_FILE, source=DEFAULT_STUDY_FILE)
    cli_config = dict(cli_config)
    study_file = cli_config.get("study_file")
    if study_file is not None:
        if not isinstance(study_file, str) or not study_file.strip():
            raise ConfigError("--config", [f"study_file: {study_file!r} must name a YAML file"])
        study = load_config_file(_resolve(workflow_dir, study_file), source=study_file)
        if "study_file" in study:
            raise ConfigError(study_file, ["study_file: a study file cannot name another one"])
        config = _merge(config, study)
    return _merge(config, cli_config)


def load_workflow_study(
    cli_config: dict, workflow_dir: str | Path, configfiles: list[str | Path] = ()
) -> Study:
    """What rules/common.smk calls: workflow_config, then load_study."""
    return load_study(workflow_config(cli_config, workflow_dir, configfiles), workflow_dir)


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
    )


# The launcher each Snakemake executor needs (profiles/slurm sets launcher=srun, the default is
# local; `dlscale` is the project's Slurm executor plugin); other executors (e.g. a site's own
# plugin) are not checked.
EXECUTOR_LAUNCHERS = {"slurm": "srun", "dlscale": "srun", "local": "local"}


def launcher_problem(executor: str, launcher: str, *, in_allocation: bool) -> str | None:
    """Why the configured launcher cannot run cells under this Snakemake executor, with the
    fix; None when they agree."""
    if EXECUTOR_LAUNCHERS.get(executor) == "srun" and launcher != "srun":
        return (
            f"Snakemake's executor is {executor!r} but launcher is {launcher!r}: every cell would "
            "start its ranks as local processes on one node. A --config on the command line "
            "replaces the profile's whole `config:` list (profiles/slurm sets launcher=srun). "
            "Add launcher=srun to your --config, e.g. --config launcher=srun remeasure=True"
        )
    if executor == "local" and launcher == "srun" and not in_allocation:
        return (
            "Snakemake's executor is 'local' but launcher is 'srun', outside any Slurm "
            "allocation: srun has nothing to start the ranks in. Use --profile profiles/slurm, "
            "or --config launcher=local (or run inside salloc)"
        )
    return None
