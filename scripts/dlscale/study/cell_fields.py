"""The fields of a cell that the matrix (dlscale.study.matrix.build_matrix) derives from the
config and the cell's axes beyond their own values: its optimizer, pipeline, mixed precision,
tensor-parallel plan, compile scope and LLM step. Each keeps the value every earlier cell had
where the study does not change what the cell runs, so the cell keeps its identity
(dlscale.study.cell.LATER_FIELDS, CHANGED_DEFAULTS)."""

from __future__ import annotations

from dlscale.registry.frameworks import FRAMEWORKS
from dlscale.registry.gpu_bindings import canonical as canonical_binding
from dlscale.registry.optimizers import optimizer_for
from dlscale.registry.parallel_dims import (
    DEFAULT_PIPELINE_SCHEDULE,
    PIPELINED,
    cell_microbatches,
    cell_pp_degree,
    cell_tp_degree,
    pipeline_batch,
)
from dlscale.registry.strategies import STRATEGIES


def optimizer_fields(config: dict, model: str) -> dict:
    """A cell's optimizer fields: config optimizer.name (`auto` resolved by the model's family:
    dlscale.registry.optimizers.optimizer_for) and, for AdamW, its settings and clipping norm.
    An SGD cell gets none beyond `momentum` (every cell's), so it keeps its identity."""
    from dlscale.models import get_spec

    settings = config["optimizer"]
    name = optimizer_for(settings["name"], get_spec(model).family)
    if name != "adamw":
        return {"optimizer": name}
    beta1, beta2 = settings["betas"]
    return {
        "optimizer": name,
        "adam_beta1": float(beta1),
        "adam_beta2": float(beta2),
        "adam_eps": float(settings["eps"]),
        "weight_decay": float(settings["weight_decay"]),
        "grad_clip_norm": None
        if settings["grad_clip_norm"] is None
        else float(settings["grad_clip_norm"]),
    }


def pipeline_fields(
    config: dict, parallelism: str, world: int, rpn: int, per_rank_batch: int
) -> dict:
    """A cell's pipeline stages, micro-batches and schedule (1, 1 and GPipe, the fields'
    defaults, unless its strategy pipelines: then the config's pp_degree, microbatches and
    pp_schedule, the micro-batches by default the fewest of at least twice the stages)."""
    if parallelism not in PIPELINED:
        return {}
    tp = cell_tp_degree(parallelism, rpn, config["tp_degree"])
    pp = cell_pp_degree(parallelism, world, config["pp_degree"], tp)
    schedule = config.get("pp_schedule", DEFAULT_PIPELINE_SCHEDULE)
    batch = pipeline_batch(per_rank_batch, pp, tp)
    return {
        "pp_degree": pp,
        "microbatches": cell_microbatches(parallelism, pp, config["microbatches"], batch, schedule),
        "pp_schedule": schedule,
    }


def fsdp_mixed_precision(parallelism: str, precision: str) -> bool:
    """Whether a cell's bf16 or fp16 comes from FSDP2's MixedPrecisionPolicy (a strategy that
    wraps the model in fully_shard) rather than autocast (Cell.fsdp_mixed_precision)."""
    return STRATEGIES[parallelism].sharded and precision != "fp32"


def cell_tp_plan(parallelism: str, model: str) -> str:
    """A cell's tensor-parallel plan (Cell.tp_plan): a tp or fsdp+tp cell runs the complete
    plan where its model offers one (dlscale.models.parallelize), every other cell "blocks"
    (the value of every cell measured before; no tensor parallel at all but under tp). A
    pipeline's stages (pp+tp, pp+fsdp+tp) are split by the blocks plan: the complete plan's
    sequence-sharded activations and vocabulary-sharded loss across stages are not built yet."""
    from dlscale.models import get_spec, names
    from dlscale.models.parallelize import plan_for

    record = STRATEGIES[parallelism]
    if not record.splits_layers or record.pipeline or model not in names():
        return "blocks"
    return plan_for(get_spec(model).arch).best_tp_plan


def cell_compile_scope(framework: str, mode: str, model: str) -> str:
    """What a cell's mode "compiled" compiles (Cell.compile_scope): each block in a pytorch
    cell whose model names its blocks (torchtitan's per-block compile), else the model as
    every cell measured before."""
    from dlscale.models import get_spec, names
    from dlscale.models.parallelize import plan_for

    if (
        "block_compile" in FRAMEWORKS[framework].capabilities
        and mode == "compiled"
        and model in names()
        and plan_for(get_spec(model).arch).fsdp_units
    ):
        return "block"
    return "model"


def llm_step_fields(config: dict, combo: dict, world: int) -> dict:
    """A pytorch cell's attention kernel, compiled loss and world-size-1 program (config
    attention, compile_loss, single_device), each set only where it changes what the cell runs
    (a compiled cell's loss; a cell of world size 1), so a study that sets them keeps every
    other cell's identity; the precision float8 and single_device fully_shard take FSDP2's
    mixed precision at world size 1 (fsdp_mixed_precision)."""
    if "llm_step" not in FRAMEWORKS[combo["framework"]].capabilities:
        return {}
    out = {}
    if config.get("attention") is not None:
        out["attention"] = config["attention"]
    if config.get("compile_loss") and combo["mode"] == "compiled":
        out["compile_loss"] = True
    if world == 1 and config.get("single_device", "plain") != "plain":
        out["single_device"] = config["single_device"]
    return out


def one_device_mixed_precision(config: dict, combo: dict, world: int) -> bool:
    """A bf16/fp16 pytorch cell of world size 1 under single_device fully_shard: its precision
    from FSDP2's MixedPrecisionPolicy (Cell.fsdp_mixed_precision), as a sharded cell's."""
    return (
        "llm_step" in FRAMEWORKS[combo["framework"]].capabilities
        and world == 1
        and config.get("single_device", "plain") == "fully_shard"
        and combo["precision"] != "fp32"
    )


def placement_fields(
    hw_key: str, hw: dict, shared: dict, env_key, rpn: int, per_rank: int, global_batch: int
) -> dict:
    """What a cell of every workload takes from its hardware entry and its place in the matrix:
    the device, ranks per node, batch sizes and CPUs per rank, the entry's hash, the environment
    identity (a container's image digest, else the venv's requirements hash under `env_key`,
    dlscale.study.matrix.cell_environment_key), the container, the GPU binding of a cuda entry,
    and the entry's modules, env and srun_options. `shared`: the study's planning facts
    (hardware_hashes, containers, environments)."""
    container = shared["containers"].get(hw_key)
    return {
        "device": hw["device"],
        "ranks_per_node": rpn,
        "per_rank_batch": per_rank,
        "global_batch": global_batch,
        "cpus_per_rank": hw["cpus_per_rank"],
        "hardware_hash": shared["hardware_hashes"][hw_key],
        "environment": container[1] if container else shared["environments"][env_key],
        "container": container[0] if container else (),
        "gpu_binding": canonical_binding(hw["gpu_binding"]) if hw["device"] == "cuda" else None,
        "modules": hw.get("modules", ()),
        "env": hw.get("env", {}),
        "srun_options": hw.get("srun_options", ()),
    }
