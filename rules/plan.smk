# The scaling model and the planner: per series a fitted model of throughput against
# node count (dlscale.analysis.scaling_model: predictions with intervals, leave-one-node-count-out errors),
# then the plan for the `plan:` jobs on the hardware file's partitions (dlscale.decisions.planner, PuLP/CBC).
# Both read only the cell table: `snakemake --forcerun scaling_model` replans without any cell;
# `python -m dlscale.decisions.planner results/<study>` plans from an existing results folder by hand.
# (the fitting and solving modules are imported in the jobs, not at every parse: scipy.optimize
# and pulp stay out of each Slurm job's snakemake start-up)
from dlscale.decisions.plan_jobs import plan_problems
from dlscale.study.partitions import partitions_from_hardware

PLAN_CONFIG = STUDY.config["plan"]
# The default jobs (none in plan.jobs: one per model, plan.default_samples each) are the models
# of the study's throughput cells, the only ones the planner plans from: a study without
# throughput cells (convergence only) has none, whatever its axes.model.
# A script's cells are a throughput series too (their model, in the script's unit).
PLAN_MODELS = STUDY.throughput_models() + list(
    dict.fromkeys(c.model for c in STUDY.cells_of("script"))
)
PARTITIONS = partitions_from_hardware(STUDY.hardware)
# The planner's node counts per partition (hardware file: nodes_available, else max_nodes).
PLAN_NODES = {p.name: p.nodes_available for p in PARTITIONS}

# The planner's refusals that the study's settings alone decide (a job in tokens for a vision
# model, a model or filter no cell measures, ...: dlscale.decisions.plan_jobs) when the workflow
# is parsed, before any job, with the planner's own messages, not after every cell has run.
_plan_problems = plan_problems(
    PLAN_CONFIG,
    PLAN_MODELS,
    STUDY.cells_of("throughput") + STUDY.cells_of("script"),
    PARTITIONS,
)
if _plan_problems:
    raise WorkflowError(
        "dlscale: the plan: section cannot be planned:\n"
        + "\n".join(f"  - plan: {problem}" for problem in _plan_problems)
        + "\nNo job was started."
    )


rule scaling_model:
    input:
        cells=RULE_OUT["cells"],
    output:
        fits=RULE_OUT["model_fit"],
        predictions=RULE_OUT["predictions"],
    log:
        f"{RULE_OUT['logs']}/scaling_model.log",
    params:
        predict_nodes=PLAN_CONFIG["predict_nodes"],
        max_extrapolation=PLAN_CONFIG["max_extrapolation"],
        max_extrapolation_unvalidated=PLAN_CONFIG["max_extrapolation_unvalidated"],
        plan_nodes=PLAN_NODES,
    run:
        from dlscale.analysis.scaling_model import write_model_tables

        write_model_tables(
            input.cells,
            output.fits,
            output.predictions,
            predict_nodes=params.predict_nodes,
            max_extrapolation=params.max_extrapolation,
            plan_nodes=params.plan_nodes,
            max_extrapolation_unvalidated=params.max_extrapolation_unvalidated,
        )


rule plan:
    input:
        fits=RULE_OUT["model_fit"],
        predictions=RULE_OUT["predictions"],
        # the cells that ran out of memory (does_not_fit): never offered
        status=RULE_OUT["status"],
    output:
        plan=RULE_OUT["plan"],
        alternatives=RULE_OUT["plan_alternatives"],
        constraints=RULE_OUT["plan_constraints"],
        figure=RULE_OUT["plan_figure"],
        macros=RULE_OUT["plan_macros"],
        tables=RULE_OUT["plan_tables"],
    log:
        f"{RULE_OUT['logs']}/plan.log",
    params:
        plan=PLAN_CONFIG,
        hardware=STUDY.hardware,
        models=PLAN_MODELS,
        width_in=STUDY.config["report"]["column_width_in"],
    run:
        from dlscale.decisions.planner import run_plan_rule

        run_plan_rule(
            input.predictions,
            input.fits,
            params.plan,
            params.hardware,
            params.models,
            {
                "plan": output.plan,
                "plan_figure": output.figure,
                "plan_macros": output.macros,
                "plan_tables": output.tables,
            },
            width_in=params.width_in,
            status_csv=input.status,
        )
