"""A cell: one point of the study matrix and one repetition, as one typed value.

This neutral module is the only place that names the axes, the cell's path pattern, a study's
results folder and the files in a cell's folder. Everything else derives from it: the matrix
(dlscale.study.matrix) makes Cells, the workflow's rules take their output and log patterns from it,
the launcher hands a cell's ranks one serialised Cell (`Cell.to_json`, read back by
`Cell.from_json`), and the analysis side (status, collect, report) reads axis values back from
paths with `parse_cell_path`. Pure Python: importable in every framework environment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from dlscale.registry.frameworks import DEFAULT_WORKLOAD, WORKLOADS  # noqa: F401 (re-exported)
from dlscale.registry.optimizers import DEFAULT_OPTIMIZER
from dlscale.registry.strategies import DEFAULT_STRATEGY
from dlscale.study.protocol import FIRST_STEP_TIMEOUT_S

# The matrix axes, in the order of a cell's path, its wildcards and the tables' columns.
AXES = ("hardware", "framework", "model", "policy", "precision", "mode", "parallelism", "nodes")
# How a cell's ranks share the model: the strategies' records (dlscale.registry.strategies). The
# default (ddp, every cell measured before the axis existed) is no segment of a cell's path
# (PARALLEL_AXIS_PATH adds one for the others), so every earlier cell keeps its path.
DEFAULT_PARALLELISM = DEFAULT_STRATEGY
# What a cell measures. `throughput`: timed steps on one fixed synthetic batch per rank (the
# scaling study); `convergence`: training on a real dataset until a target validation accuracy
# or an epoch cap (time-to-accuracy). A key of every cell, but not a segment of its axis path:
# it names the folder its cells live in (WORKLOAD_DIRS), so adding it moved no measured cell.
# WORKLOADS and DEFAULT_WORKLOAD come from dlscale.registry.frameworks (each framework's record
# says which it runs).
# A cell's key within a study: its workload, the axes, its ranks per node and the repetition.
# Ranks per node (config axes.ranks_per_node) is no scaling axis: a series runs over node counts
# and ranks per node alike (its world size; dlscale.analysis.stats.GROUP has neither).
KEY = ("workload", *AXES, "ranks_per_node", "rep")
_PLACE = (*AXES, "ranks_per_node", "rep")  # the part of the key its axis path names
_INT_KEYS = ("nodes", "ranks_per_node", "rep")
# path segments n2, rpn1, r1: a number never stands alone
_PATH_PREFIX = {"nodes": "n", "ranks_per_node": "rpn", "rep": "r"}


def _place(parallel: bool, ranks: bool) -> tuple:
    """The key's part a cell's path names: every axis but the parallelism of a ddp cell (the
    default), and its ranks per node only where they differ from its hardware's default (one
    rank per GPU; config ranks_per_node on CPU): Cell.ranks_in_path."""
    return tuple(
        k for k in _PLACE if (parallel or k != "parallelism") and (ranks or k != "ranks_per_node")
    )


_DDP_PLACE = _place(False, False)


def _axis_path(place: tuple) -> str:
    return "/".join(_PATH_PREFIX.get(k, "") + "{" + k + "}" for k in place)


# One folder per cell, naming every axis and the repetition: {hardware}/.../n{nodes}/r{rep};
# a cell of another parallelism than ddp has it after its mode: .../{mode}/fsdp/n{nodes}/r{rep};
# a cell with other ranks per node than its hardware's default has them after its node count:
# .../n{nodes}/rpn{ranks_per_node}/r{rep} (so every cell measured before the axis keeps its path)
AXIS_PATH = _axis_path(_DDP_PLACE)
PARALLEL_AXIS_PATH = _axis_path(_place(True, False))
# (parallel, ranks_in_path) -> the axis path
_AXIS_PATHS = {(p, r): _axis_path(_place(p, r)) for p in (False, True) for r in (False, True)}

# Every study has its own results folder: its cells, tables, figures, report and logs, so any
# number of studies live side by side in one checkout.
STUDY_DIR = "results/{study}"
# What else lives directly under results/, no study's name: dlscale.study.results_layout.
METRICS_FILE = "metrics.jsonl"
# Each workload's cells in their own folder of the study: throughput cells in runs/, where
# every cell lived before workloads existed (their paths, hashes and measurements are unchanged),
# convergence cells in convergence/.
WORKLOAD_DIRS = {"throughput": "runs", "convergence": "convergence", "script": "script"}
# The workloads a study's cells may have: the adapters' (dlscale.registry.frameworks) and a
# user's own training script (`script`: dlscale.study.script_workload; no adapter runs it).
WORKLOADS = (*WORKLOADS, "script")
# A cell's metrics file: the train rules' output; wildcard names == PATH_KEY == column names.
CELL_PATTERNS = {w: f"{STUDY_DIR}/{d}/{AXIS_PATH}/{METRICS_FILE}" for w, d in WORKLOAD_DIRS.items()}
CELL_PATTERN = CELL_PATTERNS[DEFAULT_WORKLOAD]
PATH_KEY = ("study", *_DDP_PLACE)  # the wildcards of every ddp cell pattern, in order
# The same for a cell of another parallelism (its own train rules; dlscale.study.cell.train_rule).
PARALLEL_CELL_PATTERNS = {
    w: f"{STUDY_DIR}/{d}/{PARALLEL_AXIS_PATH}/{METRICS_FILE}" for w, d in WORKLOAD_DIRS.items()
}
# every wildcard any cell pattern has
_ALL_PATH_KEYS = ("study", *_PLACE)
# The launcher's log of a cell (the train rules' `log:`).
TRAIN_LOG_PATTERNS = {
    "throughput": f"{STUDY_DIR}/logs/train/{AXIS_PATH}.log",
    "convergence": f"{STUDY_DIR}/logs/convergence/{AXIS_PATH}.log",
    "script": f"{STUDY_DIR}/logs/script/{AXIS_PATH}.log",
}
# The executor plugin's logs (profiles/slurm `dlscale-logdir`), shared by all studies: a job's
# folder is named by its wildcards, the study's name first.
SLURM_LOGS = "results/logs/slurm"
# The train rule of a resource class and workload (rules/train.smk); the executor plugin writes
# its logs under SLURM_LOGS/rule_<name>/.
TRAIN_RULES = {
    "throughput": "train_{hardware}_n{nodes}",
    "convergence": "converge_{hardware}_n{nodes}",
    "script": "script_{hardware}_n{nodes}",
}
TRAIN_RULE = TRAIN_RULES[DEFAULT_WORKLOAD]


def _axis_path_of(parallelism: str, ranks_in_path: bool) -> str:
    return _AXIS_PATHS[parallelism != DEFAULT_PARALLELISM, bool(ranks_in_path)]


def cell_pattern(
    workload: str = DEFAULT_WORKLOAD,
    parallelism: str = DEFAULT_PARALLELISM,
    ranks_in_path: bool = False,
) -> str:
    """The metrics pattern of a workload's cells of one parallelism (with the ranks-per-node
    segment where `ranks_in_path`)."""
    return CELL_PATTERNS[workload].replace(AXIS_PATH, _axis_path_of(parallelism, ranks_in_path))


def train_log_pattern(
    workload: str = DEFAULT_WORKLOAD,
    parallelism: str = DEFAULT_PARALLELISM,
    ranks_in_path: bool = False,
) -> str:
    """The launcher's log pattern of a workload's cells of one parallelism."""
    pattern = TRAIN_LOG_PATTERNS[workload]
    return pattern.replace(AXIS_PATH, _axis_path_of(parallelism, ranks_in_path))


def train_rule(
    workload: str = DEFAULT_WORKLOAD,
    parallelism: str = DEFAULT_PARALLELISM,
    ranks_per_node: int | None = None,
) -> str:
    """The train rule's name pattern of a workload's cells of one parallelism: TRAIN_RULES for
    ddp, with the parallelism appended for the others (train_cpu_n2_fsdp, ..._fsdp_tp), and the
    ranks per node of cells whose path names them (`ranks_per_node`; train_a100_n1_rpn2): each
    asks Slurm for its own GPUs."""
    rule = TRAIN_RULES[workload]
    if parallelism != DEFAULT_PARALLELISM:
        rule = f"{rule}_{re.sub(r'[^A-Za-z0-9]+', '_', parallelism)}"
    if ranks_per_node is not None:
        rule = f"{rule}_rpn{int(ranks_per_node)}"
    return rule


def path_key(parallelism: str = DEFAULT_PARALLELISM, ranks_in_path: bool = False) -> tuple:
    """The wildcards of a cell's pattern, in order (PATH_KEY for a ddp cell, the parallelism after
    the mode for any other, and either with ranks_per_node where `ranks_in_path`)."""
    return ("study", *_place(parallelism != DEFAULT_PARALLELISM, bool(ranks_in_path)))


# What every cell rule's name starts with (the rules that measure; the rest aggregate).
CELL_RULE_PREFIXES = tuple(rule.split("{")[0] for rule in TRAIN_RULES.values())

# Files in a cell's folder besides the metrics file.
# Every measurement of a cell is kept in its own folder, measurements/<time>-<job>/, with the
# ranks' logs and its Slurm job; the cell's metrics.jsonl is a hard link to the current one, so
# when Snakemake removes it to re-measure the cell (--forcerun, a re-measure the user asked
# for), the earlier measurement stays where it is.
MEASUREMENTS_DIR = "measurements"
RANK_DIR = ".ranks"  # the ranks' part files and logs while the cell runs
CELL_SPEC_FILE = "cell.json"  # in RANK_DIR: the Cell the ranks read (Cell.to_json)
# in RANK_DIR: the modules loaded and env set for the ranks (dlscale.run.site_env.SiteEnv.record),
# where the cell's hardware entry has any; each rank records it with what it saw
SITE_ENV_FILE = "site_env.json"
FAILURE_FILE = "failure.json"  # why the cell failed (dlscale.run.launch.record_failure)
# Which Slurm job runs the cell, written when the launcher starts (before any rank): the status
# table finds the job's state and log with it even when the job is killed outright, and for
# array tasks, whose logs are named <array job>_<task>.log rather than by the cell.
SLURM_JOB_FILE = "slurm_job.json"

# The package lists of the environments a study's ranks ran in: one file per distinct list,
# named by its sha256 (dlscale.rank.node_probes.PACKAGES_FILE), in the study's folder (the launcher
# keeps them; each cell's metrics name theirs by hash).
ENVIRONMENTS_DIR = "environments"
# Folders between a study's folder and a cell's metrics file (runs/<axes...>/<rep>).
_CELL_DEPTH = CELL_PATTERN.count("/") - STUDY_DIR.count("/")


def study_dir_of(metrics_path: str | Path) -> Path | None:
    """The study folder (STUDY_DIR) a cell's metrics path lies in (relative or absolute), or
    None for a metrics file outside a study's layout."""
    parts = Path(metrics_path).parts
    # a ddp cell's path, another parallelism's or one naming its ranks per node, and both
    for depth in (_CELL_DEPTH, _CELL_DEPTH + 1, _CELL_DEPTH + 2):
        if len(parts) < depth + 2:
            return None
        try:  # match the pattern from its results/ folder on
            parse_cell_path(Path(*parts[-(depth + 2) :]).as_posix())
        except ValueError:
            continue
        return Path(metrics_path).parents[depth - 1]
    return None


TAIL_LINES = 20  # log lines kept in failure records and the status table


@dataclass(frozen=True)
class Cell:
    """Everything a cell's ranks need, derived once from the validated config and hardware map
    (dlscale.study.matrix.build_matrix). Frozen: nothing downstream changes a cell."""

    # the key
    hardware: str
    framework: str
    model: str
    policy: str
    precision: str
    mode: str  # eager or compiled (torch.compile, XLA, hybridize)
    nodes: int
    rep: int
    # derived from the config and the hardware entry
    device: str
    ranks_per_node: int
    per_rank_batch: int
    global_batch: int
    cpus_per_rank: int
    warmup_steps: int
    steps: int
    learning_rate: float
    momentum: float
    launcher: str  # how its ranks start: local processes or srun
    hardware_hash: str  # of its hardware entry (partition, GPUs, constraint, ...)
    environment: str  # its framework environment: name:hash of its pinned packages
    # the study it belongs to (its results folder; not part of what is measured)
    study: str
    # What the cell measures (WORKLOADS). A convergence cell trains on a real dataset: the
    # fields below (None in a throughput cell); its learning_rate is the base rate its LR rule
    # scales with the global batch (dlscale.study.lr).
    workload: str = DEFAULT_WORKLOAD
    dataset: str | None = None  # a dataset dlscale ships (digits) or a dataset folder
    data_format: str | None = None  # its on-disk format (dlscale.data.FORMATS)
    data_path: str | None = None  # where the ranks read it (not identity: `dataset` names it)
    target_accuracy: float | None = None  # validation accuracy that ends training (0..1)
    max_epochs: int | None = None  # the epoch cap: training ends there, target reached or not
    lr_rule: str | None = None  # none, linear or sqrt (dlscale.study.lr.RULES)
    reference_batch: int | None = None  # the global batch the base learning rate is tuned at
    warmup_epochs: float | None = None  # linear warm-up from the base to the scaled rate
    loader_workers: int | None = None  # data-loading worker processes per rank
    stage_dir: str | None = None  # node-local folder its ranks stage the dataset to (hardware)
    # how the launcher binds a cuda cell's GPUs to its ranks (hardware.yaml gpu_binding,
    # dlscale.registry.gpu_bindings); None for a CPU cell
    gpu_binding: str | None = None
    # The job's software (hardware.yaml `modules`, `env`; dlscale.run.site_env): the modules the
    # launcher loads before the ranks start, and the variables set for the ranks after them, as
    # (name, value) pairs sorted by name (a mapping in the cell's JSON). Empty: none.
    modules: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # The site's own srun options for the ranks' step (hardware.yaml `srun_options`, normalised
    # tokens: dlscale.study.site_options), put before the launcher's own (dlscale.run.launch).
    # Empty: none. A list in the cell's JSON.
    srun_options: tuple[str, ...] = ()
    # The container its ranks run in (hardware.yaml `container`; dlscale.study.container_image):
    # engine, image, python, binds and the image's digest, as sorted (name, value) pairs (a
    # mapping in the cell's JSON). Where, not what: the digest is in `environment`. Empty: none.
    container: tuple[tuple[str, object], ...] = ()
    # A script cell's script (dlscale.study.script_workload.Script.carried): its argv template,
    # path, the sha256 of it and its files, its environment, launch and where its throughput
    # is read, as sorted (name, value) pairs (a mapping in the cell's JSON). Empty: no script.
    script: tuple[tuple[str, object], ...] = ()
    # How its ranks share the model (a record of dlscale.registry.strategies;
    # dlscale.registry.parallel_dims.ParallelDims)
    # and its tensor-parallel degree (config tp_degree; 1 but for tp and fsdp+tp)
    parallelism: str = DEFAULT_PARALLELISM
    tp_degree: int = 1
    # pipeline stages and micro-batches per step of a pp cell (config pp_degree, microbatches;
    # 1 for every other strategy)
    pp_degree: int = 1
    microbatches: int = 1
    # a pipelined cell's schedule (config pp_schedule; dlscale.registry.parallel_dims
    # PIPELINE_SCHEDULES): "gpipe", what every pp cell measured before the key existed (and
    # every other strategy's value), "1f1b" (a new study's default) or "interleaved_1f1b"
    pp_schedule: str = "gpipe"
    # A decoder model's sequence length in tokens (config seq_len, else the model's registry
    # default; dlscale.models.spec_for); None for every other model
    seq_len: int | None = None
    # A model of the study's own `models:` section (dlscale.models.zoo): its record as JSON
    # (the source, the definition as built, what its environment measured, the library's or the
    # package's name and version); None for a shipped model, as every cell measured before.
    model_source: str | None = None
    # The optimizer (config optimizer.name, `auto` resolved per model family:
    # dlscale.registry.optimizers): "sgd", the optimizer of every cell measured before the
    # choice existed, or "adamw" with its settings (None in an SGD cell) and the norm its
    # gradients are clipped to (None: no clipping).
    optimizer: str = DEFAULT_OPTIMIZER
    adam_beta1: float | None = None
    adam_beta2: float | None = None
    adam_eps: float | None = None
    weight_decay: float | None = None
    grad_clip_norm: float | None = None
    # A bf16 or fp16 cell of a strategy that wraps the model in fully_shard (fsdp, hsdp,
    # fsdp+tp): FSDP2's MixedPrecisionPolicy (parameters all-gathered in the precision,
    # gradients reduced in float32) and no autocast. False: autocast around the forward, the
    # float32 parameters communicated as they are, as every cell measured before it.
    fsdp_mixed_precision: bool = False
    # The tensor-parallel plan of a tp or fsdp+tp cell (dlscale.registry.strategies.TP_PLANS):
    # "complete" where the model's plan offers it (the embedding, sequence-parallel norms and
    # the output head under loss_parallel split too: torchtitan's), else "blocks", the blocks'
    # Linear layers only, which every cell measured before had (every other strategy keeps it).
    tp_plan: str = "blocks"
    # The blocks' activation checkpointing (config activation_checkpointing): none, selective
    # (every second block recomputed) or full (every block).
    activation_checkpointing: str = "none"
    # What mode "compiled" compiles (dlscale.frameworks.torch_model): "model", the wrapped
    # model's forward, as every cell measured before; "block", each block before fully_shard
    # (torchtitan's), in a compiled pytorch cell whose model names its blocks.
    compile_scope: str = "model"
    # The attention kernel a pytorch cell asks scaled_dot_product_attention for (config
    # attention; dlscale.registry.attention): None, PyTorch's own choice with the key/value heads
    # repeated, as every cell measured before the key; auto (a fixed order per device class),
    # cudnn, flash, efficient or math, with enable_gqa where that kernel takes it.
    attention: str | None = None
    # Mode "compiled" of a pytorch cell also compiles its loss (config compile_loss): the float32
    # cross-entropy over the vocabulary inside a compiled region. False: the loss eager, as
    # every cell measured before.
    compile_loss: bool = False
    # What a pytorch cell of world size 1 runs (config single_device): "plain", the plain
    # single-device program, as every cell measured before; "fully_shard", FSDP2 at degree 1
    # with its MixedPrecisionPolicy (bf16/fp16 compute without autocast's float32 detours, as
    # torchtitan trains on one GPU).
    single_device: str = "plain"
    # A profiler trace of this cell after its timed window (config trace: the cell it names):
    # how many steps (0: none) and whether nsys captures them too. Not what is measured: in no
    # identity or hash.
    trace_steps: int = 0
    trace_nsys: bool = False
    # How long the first warm-up step (compilation) may wait for its peers (config
    # first_step_timeout_s): a deadline, not what is measured, so in no identity or hash.
    first_step_timeout_s: int = FIRST_STEP_TIMEOUT_S
    # Whether its path names its ranks per node (.../n1/rpn2/r1): where config
    # axes.ranks_per_node gives it other ranks per node than its hardware's default (one per GPU
    # on GPU hardware, config ranks_per_node on CPU). Where, not what: in no identity or hash.
    ranks_in_path: bool = False

    def __post_init__(self):
        # the JSON form has a list and a mapping: kept as tuples, so a cell read back equals the
        # cell written and stays hashable
        if isinstance(self.modules, str):
            raise TypeError(f"modules: a list of module names, not one string {self.modules!r}")
        object.__setattr__(self, "modules", tuple(self.modules))
        if isinstance(self.srun_options, str):
            raise TypeError(f"srun_options: a list of tokens, not one string {self.srun_options!r}")
        object.__setattr__(self, "srun_options", tuple(self.srun_options))
        pairs = self.env.items() if isinstance(self.env, dict) else self.env
        object.__setattr__(self, "env", tuple(sorted((str(k), str(v)) for k, v in pairs)))
        pairs = self.script.items() if isinstance(self.script, dict) else self.script
        object.__setattr__(
            self,
            "script",
            tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in pairs)),
        )
        pairs = self.container.items() if isinstance(self.container, dict) else self.container
        object.__setattr__(
            self,
            "container",
            tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in pairs)),
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def key(self) -> tuple:
        return tuple(getattr(self, k) for k in KEY)

    @property
    def path(self) -> str:
        """The cell's metrics file (CELL_PATTERNS of its workload; PARALLEL_CELL_PATTERNS
        for a parallelism other than ddp)."""
        pattern = cell_pattern(self.workload, self.parallelism, self.ranks_in_path)
        return pattern.format(**self.key_dict(), study=self.study)

    def key_dict(self) -> dict:
        return {k: getattr(self, k) for k in KEY}

    def identity(self) -> dict:
        """Everything that changes what this cell measures: every field but the study's name
        and the dataset's location; fields added after cells were measured count only away
        from their default (LATER_FIELDS), so a throughput cell's identity and hash are what
        they were before workloads existed. A measured cell whose identity differs from the
        planned one is never re-measured silently (dlscale.store.measurements.changed_cells)."""
        return {k: v for k, v in self._fields().items() if k not in NOT_IDENTITY}

    def _fields(self) -> dict:
        """Every field as the cell's JSON has it (`modules` and `srun_options` lists, `env` a
        mapping: a measured cell's stored identity compares equal), the fields added later left
        out at their default."""
        return {
            k: _JSON_FORM.get(k, _same)(v)
            for k, v in vars(self).items()
            if not (k in LATER_FIELDS and v == LATER_FIELDS[k])
        }

    @property
    def config_hash(self) -> str:
        """Short hash of the cell's identity: the configuration its measurement depends on."""
        blob = json.dumps(self.identity(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        """Every field, the world size and the config hash (the `cell` of a metrics file's
        run_start)."""
        # a flat dataclass: vars() is the same as dataclasses.asdict at a fraction of its cost
        # (called once per job while a 10,000-cell study is planned); fields added later are
        # left out at their default, so a throughput cell serialises (and its job's params read)
        # as before they existed
        d = self._fields()
        d["world_size"] = self.world_size
        d["config_hash"] = self.config_hash
        return d

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> Cell:
        """The inverse of as_dict; derived keys (world_size) are checked, unknown keys refused."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields - set(DERIVED))
        missing = sorted(fields - set(d) - set(LATER_FIELDS))
        if unknown or missing:
            raise ValueError(f"not a dlscale cell: unknown keys {unknown}, missing keys {missing}")
        cell = cls(**{k: d[k] for k in fields if k in d})
        # config_hash is recomputed from the fields (a hand-edited cell gets its own)
        if "world_size" in d and d["world_size"] != cell.world_size:
            raise ValueError(
                f"cell says world_size {d['world_size']}, but nodes x ranks_per_node "
                f"is {cell.world_size}"
            )
        return cell

    @classmethod
    def from_json(cls, text: str) -> Cell:
        return cls.from_dict(json.loads(text))

    @classmethod
    def read(cls, path: str | Path) -> Cell:
        return cls.from_json(Path(path).read_text())


def _same(value):
    return value


# fields kept as tuples in a Cell (hashable, frozen) and written as JSON has them
_JSON_FORM = {
    "modules": list,
    "env": dict,
    "srun_options": list,
    "container": lambda pairs: {k: list(v) if isinstance(v, tuple) else v for k, v in pairs},
    "script": lambda pairs: {k: list(v) if isinstance(v, tuple) else v for k, v in pairs},
}
# where, not what; and deadlines, which change no measurement
NOT_IDENTITY = (
    "study",
    "data_path",
    "stage_dir",
    "first_step_timeout_s",
    "ranks_in_path",
    "container",
    "trace_steps",
    "trace_nsys",
)
DERIVED = ("world_size", "config_hash")  # in as_dict, computed from the fields
# Fields added after cells were measured, with the value every earlier cell had: at that value
# they are left out of the identity (and the hash), and a serialised cell may omit them.
LATER_FIELDS = {
    f.name: f.default for f in dataclasses.fields(Cell) if f.default is not dataclasses.MISSING
}
# Later fields that a study's default now sets away from their LATER_FIELDS value for some
# cells (docs/pages/decisions/changed-defaults.md): `auto` trains the decoders with AdamW,
# bf16/fp16 cells under fully_shard use FSDP2's mixed precision, pp cells run 1F1B, tp and
# fsdp+tp cells of a model with a complete plan run it (tp_plan), and compiled pytorch cells of
# a model with blocks compile each block (compile_scope). A measured cell's file without them
# was measured at their LATER_FIELDS value, so dlscale.store.measurements.changed_cells
# compares them as that (the other later fields are not compared where the file lacks them).
CHANGED_DEFAULTS = ("optimizer", "fsdp_mixed_precision", "pp_schedule", "tp_plan", "compile_scope")


def key_of(values, workload: str | None = None, ranks_per_node: int | None = None) -> tuple:
    """A cell's key from a mapping of key names to values, strings or not (wildcards, which
    name no workload: `workload`, else the default; and no ranks per node where the cell's path
    does not: `ranks_per_node`, its hardware's default)."""
    values = {
        "workload": workload or DEFAULT_WORKLOAD,
        "parallelism": DEFAULT_PARALLELISM,
        "ranks_per_node": ranks_per_node,
        **values,
    }
    return tuple(int(values[k]) if k in _INT_KEYS else str(values[k]) for k in KEY)


def format_key(pattern: str, cell: dict) -> str:
    """A pattern over PATH_KEY (CELL_PATTERNS, TRAIN_LOG_PATTERNS, TRAIN_RULES) for a cell's
    values."""
    return pattern.format(**{k: cell[k] for k in _ALL_PATH_KEYS if k in cell})


def cell_label(cell: dict) -> str:
    """A cell's place in its study, as tables and the report name it: its axis path, under its
    workload's folder for any workload but the default (throughput)."""
    parallelism = cell.get("parallelism", DEFAULT_PARALLELISM)
    place = format_key(_axis_path_of(parallelism, _ranks_in_path(cell)), cell)
    workload = cell.get("workload", DEFAULT_WORKLOAD)
    return place if workload == DEFAULT_WORKLOAD else f"{WORKLOAD_DIRS[workload]}/{place}"


def _ranks_in_path(cell: dict) -> bool:
    """Whether a cell (a Cell's dict, a table's row, parse_cell_path's values) names its ranks
    per node in its path; a row of a table written before the axis does not."""
    # True, numpy's True (a table's row); None or NaN: a cell or table from before the axis
    return str(cell.get("ranks_in_path")) == "True"


def path_ranks(cell: dict) -> int | None:
    """The ranks per node a cell's path names (train_rule's `ranks_per_node`), None where it
    names none (its hardware's default)."""
    return int(cell["ranks_per_node"]) if _ranks_in_path(cell) else None


def _pattern_re(pattern: str) -> re.Pattern:
    return re.compile(
        re.escape(pattern)
        .replace(r"\{", "{")
        .replace(r"\}", "}")
        .format(**{k: f"(?P<{k}>[^/]+)" for k in _ALL_PATH_KEYS})
    )


# Every cell pattern: a ddp cell's is one folder shorter than another parallelism's or one
# naming its ranks per node; those two are told apart by their literal prefixes (n, rpn), so
# no path matches two
_CELL_RES = [
    (w, ranks, _pattern_re(CELL_PATTERNS[w].replace(AXIS_PATH, _AXIS_PATHS[parallel, ranks])))
    for ranks in (False, True)
    for parallel in (False, True)
    for w in WORKLOAD_DIRS
]


def parse_cell_path(path: str) -> dict:
    """Study, workload and key values named by a cell's metrics path (the inverse of
    Cell.path)."""
    for workload, ranks, regex in _CELL_RES:
        m = regex.fullmatch(str(path))
        if m:
            d = m.groupdict()
            return {
                "study": d["study"],
                "workload": workload,
                "parallelism": DEFAULT_PARALLELISM,
                **d,
                **{k: int(d[k]) for k in _INT_KEYS if k in d},
                **({"ranks_in_path": True} if ranks else {}),
            }
    raise ValueError(f"not a cell metrics path: {path}")


def tail_lines(path: Path, n: int = TAIL_LINES, missing: str = "(no log)") -> str:
    """The last n lines of a log, or `missing` when it cannot be read."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return missing
