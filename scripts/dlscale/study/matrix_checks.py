"""The matrix's refusals before any job: axes a hardware entry cannot run, strategies and degrees
the frameworks and models do not support, models without a builder, exclusions naming no axis
value, and a launcher its Snakemake executor cannot use. Each message names the setting, what
is wrong and what is allowed. A study over max_cells: dlscale.study.study_size."""

from __future__ import annotations

from math import lcm

from dlscale.models import builds, cell_seq_len
from dlscale.registry import launchers
from dlscale.registry.frameworks import FRAMEWORKS, offering, with_capability
from dlscale.registry.parallel_dims import cell_tp_degree
from dlscale.registry.strategies import STRATEGIES
from dlscale.study.cell import DEFAULT_PARALLELISM
from dlscale.study.workloads import (
    SETTING_PREFIX,
    SHIPPED_DATASETS,
    axis_key,
    ranks_per_node_values,
    strong_global_batch,
    workload_axes,
)


def _axes_problems(
    config: dict, workload: str, axes: dict, hardware: dict, hardware_source: str
) -> list[str]:
    problems = []
    key = lambda axis: axis_key(config, workload, axis)  # noqa: E731
    batch_key = f"{SETTING_PREFIX[workload]}global_batch"
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
        problems += _ranks_per_node_problems(axes, hw_key, hw, config["exclude"])
        if "strong" in axes["policy"]:
            gb = strong_global_batch(config, hw, workload)
            worlds = sorted(
                {n * rpn for n in axes["nodes"] for rpn in ranks_per_node_values(config, hw)}
            )
            bad = [world for world in worlds if gb % world]
            if bad:
                problems.append(
                    f"{batch_key}: {gb} (policy 'strong', hardware {hw_key!r}) is not divisible "
                    f"by world size(s) {bad}; choose a multiple of {lcm(*worlds)}"
                )
    if workload != "script":  # a script's parallelism is a placeholder (script_workload)
        problems += _parallelism_problems(config, axes, hardware)
    return problems


def _ranks_per_node_problems(axes: dict, hw_key: str, hw: dict, exclude: list) -> list[str]:
    """axes.ranks_per_node on GPU hardware: one rank per GPU, so at most the entry's GPUs
    (unless `exclude` leaves that hardware's cells of the value out)."""
    too_many = [
        v
        for v in axes.get("ranks_per_node") or ()
        if v > hw["gpus_per_node"]
        and not _excluded_pair({"hardware": hw_key, "ranks_per_node": v}, exclude)
    ]
    if hw["device"] != "cuda" or not too_many:
        return []
    return [
        f"axes.ranks_per_node: {too_many} exceed the {hw['gpus_per_node']} GPUs per node of "
        f"hardware {hw_key!r} (gpus_per_node; one rank per GPU); allowed: "
        f"1..{hw['gpus_per_node']} (or exclude {{hardware: {hw_key}, ranks_per_node: "
        f"{too_many[0]}}})"
    ]


def _parallelism_problems(config: dict, axes: dict, hardware: dict) -> list[str]:
    """Strategies the frameworks do not declare, a model whose plan lacks what a strategy needs
    (dlscale.models.parallelize), and degrees that do not fit the ranks per node
    (dlscale.registry.parallel_dims): refused before any job, unless `exclude` leaves the
    combination out."""
    from dlscale.models import STUDY_SPECS, get_spec
    from dlscale.models.parallelize import plan_for
    from dlscale.registry.parallel_dims import degree_problems

    problems = []
    exclude = config["exclude"]
    for strategy in axes.get("parallelism", [DEFAULT_PARALLELISM]):
        for framework in axes["framework"]:
            if strategy in FRAMEWORKS[framework].strategies or _excluded_pair(
                {"framework": framework, "parallelism": strategy}, exclude
            ):
                continue
            able = offering(strategy)
            problems.append(
                f"axes.parallelism: {strategy!r} is not supported by framework {framework!r} "
                f"(it supports: {', '.join(FRAMEWORKS[framework].strategies)}); "
                f"frameworks that run "
                f"{strategy}: {', '.join(able)} (or exclude "
                f"{{framework: {framework}, parallelism: {strategy}}})"
            )
        record = STRATEGIES[strategy]
        if record.pipeline:
            problems += [
                p for p in _pipeline_problems(strategy, config, axes, hardware) if p not in problems
            ]
        if not record.splits_layers:
            continue
        for model in axes["model"]:
            arch = get_spec(model).arch if model in models_names() else None
            if (
                (arch and plan_for(arch).tp)
                or model in STUDY_SPECS  # its own plan: dlscale.study.study_models checks it
                or _excluded_pair({"model": model, "parallelism": strategy}, exclude)
            ):
                continue
            able = [m for m in models_names() if plan_for(get_spec(m).arch).tp]
            problems.append(
                f"axes.parallelism: {strategy!r} needs a model with a tensor-parallel plan "
                f"(dlscale.models.parallelize.<arch>.PLAN), and model {model!r} has none; "
                "allowed models: "
                f"{', '.join(able)} (or exclude {{model: {model}, parallelism: {strategy}}})"
            )
        for hw_key, rpn in _hardware_ranks(config, axes, hardware):
            tp = cell_tp_degree(strategy, rpn, config["tp_degree"])
            for model in axes["model"]:
                arch_kwargs = get_spec(model).arch_kwargs if model in models_names() else {}
                heads = arch_kwargs.get("num_heads")
                kv_heads = arch_kwargs.get("num_kv_heads")  # grouped-query attention
                splits_heads = (
                    model in models_names() and plan_for(get_spec(model).arch).splits_heads
                )
                seq_len = (
                    cell_seq_len(model, config.get("seq_len")) if model in models_names() else None
                )
                plan = plan_for(get_spec(model).arch) if model in models_names() else None
                if plan and plan.sequence_parallel and seq_len and seq_len % tp:
                    problems.append(
                        f"axes.parallelism: {strategy!r} runs model {model!r}'s complete "
                        f"tensor-parallel plan, which splits the sequence ({seq_len} tokens) "
                        f"over tensor-parallel degree {tp} (hardware {hw_key!r}); allowed "
                        f"tp_degree: a divisor of {seq_len}, or seq_len: a multiple of {tp}"
                    )
                if heads and splits_heads and (heads % tp or (kv_heads and kv_heads % tp)):
                    counts = f"{heads} heads" + (f", {kv_heads} KV heads" if kv_heads else "")
                    divisible = f"{heads}, {kv_heads}" if kv_heads else f"both {heads}"
                    problems.append(
                        f"axes.parallelism: {strategy!r} splits the attention heads of model "
                        f"{model!r} ({counts}) over tensor-parallel degree {tp} (hardware "
                        f"{hw_key!r}); allowed tp_degree: a divisor of {divisible} and "
                        f"ranks_per_node {rpn} above 1"
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


def _pipeline_problems(strategy: str, config: dict, axes: dict, hardware: dict) -> list[str]:
    """A pipeline strategy: a model the pipeline can split (its plan's `pipeline`), stages that
    divide the ranks and do not outnumber the layers, micro-batches that divide a pipeline's
    batch."""
    from dlscale.models import get_spec
    from dlscale.models.parallelize import plan_for
    from dlscale.registry.parallel_dims import DEFAULT_PIPELINE_SCHEDULE, pipeline_problems

    problems = []
    if "compiled" in axes["mode"] and not _excluded_pair(
        {"mode": "compiled", "parallelism": strategy}, config["exclude"]
    ):
        problems.append(
            f"axes.mode: 'compiled' with parallelism {strategy!r}: the pipeline runs its stages "
            "eagerly (torch.distributed.pipelining), so a compiled pp cell would not be one; "
            f"allowed with {strategy}: eager (exclude {{mode: compiled, parallelism: {strategy}}})"
        )
    schedule = config.get("pp_schedule", DEFAULT_PIPELINE_SCHEDULE)
    for model in axes["model"]:
        spec = get_spec(model) if model in models_names() else None
        if spec is None or _excluded_pair(
            {"model": model, "parallelism": strategy}, config["exclude"]
        ):
            continue
        plan = plan_for(spec.arch)
        able = [
            m
            for m in models_names()
            if plan_for(get_spec(m).arch).pipeline
            and not get_spec(m).arch_kwargs.get("tie_embeddings")
        ]
        if plan.pipeline and spec.arch_kwargs.get("tie_embeddings"):
            problems.append(
                f"axes.parallelism: {strategy!r} cannot cut model {model!r} into stages: its "
                "head is tied to its token embedding, which two stages cannot share; allowed "
                f"models: {', '.join(able)} (or exclude {{model: {model}, parallelism: "
                f"{strategy}}})"
            )
            continue
        if not plan.pipeline:
            why = f": {plan.why_not_pipeline}" if plan.why_not_pipeline else ""
            problems.append(
                f"axes.parallelism: {strategy!r} needs a model the pipeline can split into "
                f"stages, and model {model!r} ({spec.arch}) is not one{why}; allowed models: "
                f"{', '.join(able)} (or exclude {{model: {model}, parallelism: {strategy}}})"
            )
            continue
        for hw_key, rpn in _hardware_ranks(config, axes, hardware):
            for nodes in axes["nodes"]:
                for policy in axes["policy"]:
                    where = {
                        "model": model,
                        "parallelism": strategy,
                        "hardware": hw_key,
                        "nodes": nodes,
                        "policy": policy,
                    }
                    if _excluded_pair(where, config["exclude"]):
                        continue  # exclude leaves these cells out
                    world = nodes * rpn
                    per_rank = config["per_rank_batch"]
                    if policy == "strong":
                        per_rank = max(1, strong_global_batch(config, hardware[hw_key]) // world)
                    problems += [
                        p
                        for p in pipeline_problems(
                            world,
                            config["pp_degree"],
                            config["microbatches"],
                            per_rank,
                            spec.arch_kwargs.get("num_layers"),
                            f"hardware {hw_key!r} at {nodes} node(s)",
                            schedule,
                            cell_tp_degree(strategy, rpn, config["tp_degree"]),
                        )
                        if p not in problems
                    ]
    return problems


def _hardware_ranks(config: dict, axes: dict, hardware: dict) -> list[tuple[str, int]]:
    """(hardware key, ranks per node) of every defined hardware entry of the axes."""
    return [
        (hw_key, rpn)
        for hw_key in axes["hardware"]
        if hw_key in hardware
        for rpn in ranks_per_node_values(config, hardware[hw_key])
    ]


def _excluded_pair(pair: dict, exclude: list[dict]) -> bool:
    """Whether an exclude entry naming only these axes leaves every such cell out."""
    return any(set(e) <= set(pair) and all(pair[k] == v for k, v in e.items()) for e in exclude)


def _convergence_problems(config: dict, axes: dict) -> list[str]:
    """What only a convergence cell needs: frameworks that declare the workload, and (for a
    shipped dataset, whose shape is known now) models that fit the dataset."""
    from dlscale.models import get_spec
    from dlscale.registry.frameworks import supporting

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
    are built by PyTorch's adapters only; the Llama family by the pytorch adapter alone, its
    spec's `frameworks`), unless `exclude` leaves the pair out."""
    from dlscale.models import get_spec

    problems = []
    for framework in axes["framework"]:
        for model in axes["model"]:
            pair = {"framework": framework, "model": model}
            if builds(framework, model) or any(
                set(e) <= set(pair) and all(pair[k] == v for k, v in e.items())
                for e in config["exclude"]
            ):
                continue
            able = [f for f in FRAMEWORKS if builds(f, model)]
            spec = get_spec(model)
            why = f" ({spec.frameworks_why})" if spec.frameworks is not None else ""
            problems.append(
                f"{axis_key(config, workload, 'model')}: framework {framework!r} has no builder "
                f"for model {model!r}{why}; frameworks that build it: {', '.join(able)} (or "
                f"exclude {{framework: {framework}, model: {model}}})"
            )
    return problems


def _optimizer_problems(config: dict, axes: dict) -> list[str]:
    """Cells whose optimizer (config optimizer.name, `auto` resolved by the model's family:
    dlscale.registry.optimizers) their framework's adapter does not build (its record's
    `optimizers`), unless `exclude` leaves the pair out."""
    from dlscale.models import SPECS
    from dlscale.registry.optimizers import AUTO, optimizer_for

    name = config["optimizer"]["name"]
    problems = []
    for framework in axes["framework"]:
        for model in axes["model"]:
            if model not in SPECS:
                continue  # refused by the schema's enum
            wanted = optimizer_for(name, SPECS[model].family)
            pair = {"framework": framework, "model": model}
            if wanted in FRAMEWORKS[framework].optimizers or _excluded_pair(
                pair, config["exclude"]
            ):
                continue
            able = [f for f in FRAMEWORKS if wanted in FRAMEWORKS[f].optimizers]
            why = f" (auto: {wanted} for the {SPECS[model].family} models)" if name == AUTO else ""
            problems.append(
                f"optimizer.name: {name!r}{why} trains model {model!r} with {wanted}, which "
                f"framework {framework!r} does not run (it runs: "
                f"{', '.join(FRAMEWORKS[framework].optimizers)}); frameworks that run {wanted}: "
                f"{', '.join(able)} (or set optimizer.name: sgd, or exclude "
                f"{{framework: {framework}, model: {model}}})"
            )
    return problems


def _checkpointing_problems(config: dict, axes: dict) -> list[str]:
    """activation_checkpointing other than none: every framework of the study checkpoints
    (the pytorch adapter), and every model names its blocks (its plan's fsdp_units)."""
    from dlscale.models import get_spec
    from dlscale.models.parallelize import plan_for

    mode = config.get("activation_checkpointing", "none")
    if mode == "none":
        return []
    problems = []
    exclude = config["exclude"]
    able = [m for m in models_names() if plan_for(get_spec(m).arch).fsdp_units]
    able_frameworks = with_capability("activation_checkpointing")
    for framework in axes["framework"]:
        if framework not in able_frameworks:
            problems.append(
                f"activation_checkpointing: {mode!r} is run by framework(s) "
                f"{', '.join(able_frameworks)}, not {framework!r}; allowed values "
                f"for a study with {framework}: none"
            )
    for strategy in axes.get("parallelism", [DEFAULT_PARALLELISM]):
        if STRATEGIES[strategy].pipeline and not _excluded_pair({"parallelism": strategy}, exclude):
            problems.append(
                f"activation_checkpointing: {mode!r} with parallelism {strategy!r}: the pipeline "
                "runs its stages without checkpointing; allowed values for a study with "
                f"{strategy}: none (or exclude {{parallelism: {strategy}}})"
            )
    for model in axes["model"]:
        if model not in models_names() or _excluded_pair({"model": model}, exclude):
            continue
        if not plan_for(get_spec(model).arch).fsdp_units:
            problems.append(
                f"activation_checkpointing: {mode!r} checkpoints a model's blocks, and model "
                f"{model!r} names none (dlscale.models.parallelize.<arch>.PLAN fsdp_units); "
                f"models with blocks: {', '.join(able)}; allowed values for a study with "
                f"{model}: none"
            )
    return problems


def semantic_problems(config: dict, hardware: dict, hardware_source: str) -> list[str]:
    problems = []
    by_workload = workload_axes(config)
    for workload, axes in by_workload.items():
        problems += _axes_problems(config, workload, axes, hardware, hardware_source)
        if workload == "script":  # its framework is a label, its model the script's own
            continue
        problems += _builder_problems(config, workload, axes)
        problems += [p for p in _optimizer_problems(config, axes) if p not in problems]
        problems += [p for p in _checkpointing_problems(config, axes) if p not in problems]
        problems += [p for p in llm_step_problems(config, axes, hardware) if p not in problems]
    if "convergence" in by_workload:
        problems += _convergence_problems(config, by_workload["convergence"])
    for i, entry in enumerate(config["exclude"]):
        for axis, value in entry.items():
            allowed = []
            for axes in by_workload.values():
                allowed += [v for v in axes[axis] or () if v not in allowed]
            if value not in allowed:
                problems.append(
                    f"exclude[{i}].{axis}: {value!r} is not a value of axes.{axis}; "
                    f"allowed values: {', '.join(map(str, allowed))}"
                )
    return problems


def launcher_problem(
    executor: str | None, launcher: str, *, in_allocation: bool, command_with_launcher=None
) -> str | None:
    """Why the configured launcher cannot run cells under this Snakemake executor, with the
    fix: `command_with_launcher(L)` is the run's own command with launcher=L in its one
    --config (dlscale.workflow.advice); None when they agree. Which launcher an executor needs
    and whether a launcher's ranks are a Slurm step are the launchers' records
    (dlscale.registry.launchers); an executor none of them names (a site's own plugin) is not
    checked."""

    def fix(wanted: str) -> str:
        if command_with_launcher is None:
            return f"--config launcher={wanted} (with your other --config entries)"
        return command_with_launcher(wanted)

    needed = launchers.for_executor(executor)
    if needed is None or needed.name == launcher:
        return None
    if needed.slurm_step:
        return (
            f"Snakemake's executor is {executor!r} but launcher is {launcher!r}: every cell would "
            "start its ranks as local processes on one node. A --config on the command line "
            f"replaces the profile's whole `config:` list ({needed.profile} sets "
            f"launcher={needed.name}). Add launcher={needed.name} to your --config:\n"
            f"  {fix(needed.name)}"
        )
    if launchers.on_slurm(launcher) and not in_allocation:
        return (
            f"Snakemake's executor is {executor!r} but launcher is {launcher!r}, outside any Slurm "
            f"allocation: {launcher} has nothing to start the ranks in. Use --profile "
            f"{launchers.launcher(launcher).profile}, run inside salloc, or run the ranks "
            f"locally:\n  {fix(needed.name)}"
        )
    return None


# FP8 tensor cores: compute capability 8.9 (Ada) and 9.0 (Hopper) and newer
FLOAT8_MIN_CAPABILITY = 8.9


def llm_step_problems(config: dict, axes: dict, hardware: dict) -> list[str]:
    """The keys of the LLM step (attention, compile_loss, single_device, the precision float8)
    where a cell of the study cannot run them, each naming the key and its allowed values:
    another framework than pytorch (unless excluded); attention cudnn or efficient on a CPU
    entry (PyTorch 2.13 runs flash and math there); compile_loss with a tensor-parallel or
    pipelined strategy (the loss runs under loss_parallel or in the pipeline's stages); float8
    on an entry without FP8 tensor cores (compute capability below 8.9, or not stated, or a
    CPU)."""
    from dlscale.registry.attention import allowed_on

    problems, exclude = [], config["exclude"]
    settings = {
        "attention": (config.get("attention"), None, "null"),
        "compile_loss": (config.get("compile_loss", False), False, "false"),
        "single_device": (config.get("single_device", "plain"), "plain", "plain"),
    }
    asked = {k: v for k, (v, default, _) in settings.items() if v != default}
    llm_step, float8 = with_capability("llm_step"), with_capability("float8")
    for framework in axes["framework"]:
        if _excluded_pair({"framework": framework}, exclude):
            continue
        if framework not in llm_step:
            problems += [
                f"{key}: {value!r} is run by framework(s) {', '.join(llm_step)}, not "
                f"{framework!r}; allowed values for a study with {framework}: "
                f"{settings[key][2]} (or exclude {{framework: {framework}}})"
                for key, value in asked.items()
            ]
        if (
            framework not in float8
            and "float8" in axes["precision"]
            and not _excluded_pair({"framework": framework, "precision": "float8"}, exclude)
        ):
            problems.append(
                f"axes.precision: 'float8' (torchao's float8 linears) is run by framework(s) "
                f"{', '.join(float8)}, not {framework!r}; allowed values for "
                f"{framework}: fp32, bf16, fp16 (or exclude {{framework: {framework}, "
                "precision: float8}})"
            )
    attention = config.get("attention")
    for hw_key in axes["hardware"]:
        entry = hardware.get(hw_key) or {}
        device = entry.get("device", "cpu")
        if attention is not None and attention not in allowed_on(device):
            problems.append(
                f"attention: {attention!r} does not run on hardware {hw_key!r} (device "
                f"{device}: PyTorch runs the flash and math kernels there); allowed values: "
                f"null, {', '.join(allowed_on(device))}"
            )
        if "float8" in axes["precision"] and not _excluded_pair(
            {"hardware": hw_key, "precision": "float8"}, exclude
        ):
            capability = entry.get("compute_capability")
            if device != "cuda" or capability is None or capability < FLOAT8_MIN_CAPABILITY:
                why = (
                    f"a {device} device has no FP8 tensor cores"
                    if device != "cuda"
                    else "its compute_capability is not stated"
                    if capability is None
                    else f"compute capability {capability} has no FP8 tensor cores"
                )
                problems.append(
                    f"axes.precision: 'float8' on hardware {hw_key!r}: {why} (FP8 needs "
                    f"compute capability {FLOAT8_MIN_CAPABILITY} or newer: H100, H200, L40S); "
                    f"allowed values there: fp32, bf16{', fp16' if device == 'cuda' else ''} "
                    f"(or exclude {{hardware: {hw_key}, precision: float8}})"
                )
    if config.get("compile_loss"):
        for strategy in axes.get("parallelism", [DEFAULT_PARALLELISM]):
            record = STRATEGIES[strategy]
            if (record.splits_layers or record.pipeline) and not _excluded_pair(
                {"parallelism": strategy}, exclude
            ):
                problems.append(
                    f"compile_loss: true with parallelism {strategy!r}: its loss runs under "
                    "loss_parallel or in the pipeline's stages, eagerly; allowed values for a "
                    f"study with {strategy}: false (or exclude {{parallelism: {strategy}}})"
                )
    return problems
