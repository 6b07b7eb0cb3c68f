"""What each workload of a study spans, before any cell is built: its axes, repetitions and batch
settings, the ranks a node runs, a strong-scaling global batch, and where a convergence cell reads
its dataset. Read by the matrix (dlscale.study.matrix), its checks and the resources."""

from __future__ import annotations

from dlscale.study.cell import AXES, DEFAULT_PARALLELISM

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
        # a convergence cell trains data parallel (its adapters' epochs and evaluation), with
        # its hardware's default ranks per node
        out["convergence"]["parallelism"] = [DEFAULT_PARALLELISM]
        out["convergence"]["ranks_per_node"] = None
    if "script" in config["workloads"]:  # a user's script (dlscale.study.script_workload)
        out["script"] = script_axes(config)
    return out


def script_axes(config: dict) -> dict:
    """The axes the script workload's cells span: script.axes, each null taking the study's
    axes (framework: every script; model: the models of those scripts; mode: eager)."""
    own, study = (config.get("script") or {}).get("axes") or {}, config["axes"]
    scripts = (config.get("script") or {}).get("scripts") or {}
    axes = {a: own[a] if own.get(a) is not None else study.get(a) for a in AXES}
    axes["framework"] = own.get("framework") or list(scripts)
    axes["model"] = list(
        dict.fromkeys(
            (scripts.get(label) or {}).get("model", "script") for label in axes["framework"]
        )
    )
    axes["mode"] = ["eager"]
    axes["ranks_per_node"] = (
        own["ranks_per_node"]
        if own.get("ranks_per_node") is not None
        else study.get("ranks_per_node")
    )
    return axes


def workload_repetitions(config: dict) -> dict[str, int]:
    reps = {"throughput": config["repetitions"]}
    reps["convergence"] = config["convergence"]["repetitions"] or config["repetitions"]
    reps["script"] = (config.get("script") or {}).get("repetitions") or config["repetitions"]
    return {w: reps[w] for w in workload_axes(config)}


def workload_batches(config: dict, workload: str) -> tuple[int, int | None]:
    """(per_rank_batch, global_batch) setting of a workload's cells (global: strong policy)."""
    if workload == "convergence":
        conv = config["convergence"]
        return conv["per_rank_batch"] or config["per_rank_batch"], conv["global_batch"]
    if workload == "script":
        own = config.get("script") or {}
        return (
            own.get("per_rank_batch") or config["per_rank_batch"],
            own["global_batch"] if own.get("global_batch") is not None else config["global_batch"],
        )
    return config["per_rank_batch"], config["global_batch"]


SETTING_PREFIX = {"throughput": "", "convergence": "convergence.", "script": "script."}


def axis_key(config: dict, workload: str, axis: str) -> str:
    """How a message names the setting a workload's axis comes from."""
    if workload == "convergence" and config["convergence"]["axes"].get(axis) is None:
        return f"convergence.axes.{axis} (null: axes.{axis})"
    if workload == "script" and (config.get("script") or {}).get("axes", {}).get(axis) is None:
        return f"script.axes.{axis} (null: axes.{axis})"
    return f"{SETTING_PREFIX[workload]}axes.{axis}"


def data_path(config: dict) -> str:
    """Where a convergence cell's ranks read its dataset: a shipped dataset's folder in its
    format (SHIPPED_DATA_DIR), else the configured folder."""
    conv = config["convergence"]
    if conv["dataset"] in SHIPPED_DATASETS:
        return SHIPPED_DATA_DIR.format(dataset=conv["dataset"], format=conv["data_format"])
    return conv["dataset"]


def ranks_per_node(config: dict, hw: dict) -> int:
    """A hardware entry's default ranks per node: GPU hardware runs one rank per GPU; CPU
    hardware uses config.ranks_per_node."""
    return hw["gpus_per_node"] if hw["device"] == "cuda" else config["ranks_per_node"]


def ranks_per_node_values(config: dict, hw: dict, workload: str = "throughput") -> list[int]:
    """The ranks per node a workload's cells on this hardware span: config axes.ranks_per_node
    (on GPU hardware one rank per GPU, so 1..gpus_per_node: dlscale.study.matrix_checks), else
    the hardware's default (ranks_per_node)."""
    axis = workload_axes(config).get(workload, config["axes"]).get("ranks_per_node")
    return list(axis) if axis else [ranks_per_node(config, hw)]


def strong_global_batch(config: dict, hw: dict, workload: str = "throughput") -> int:
    """The global batch of a workload's strong-scaling cells: stated, else the per-rank batch
    times the smallest world size (fewest ranks per node x fewest nodes: the baseline)."""
    per_rank, global_batch = workload_batches(config, workload)
    if global_batch is not None:
        return global_batch
    axes = workload_axes(config).get(workload, config["axes"])
    return per_rank * min(ranks_per_node_values(config, hw, workload)) * min(axes["nodes"])


def excluded(combo: dict, exclude: list[dict]) -> bool:
    """Whether an exclude entry matches this combination of axis values."""
    return any(all(combo[k] == v for k, v in entry.items()) for entry in exclude)
