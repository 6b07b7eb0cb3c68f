# The scaling model and the planner (issue 16): per series a fitted model of throughput against
# node count (dlscale.analysis.scaling_model: predictions with intervals, leave-one-node-count-out errors),
# then the plan for the `plan:` jobs on the hardware file's partitions (dlscale.decisions.planner, PuLP/CBC).
# Both read only the cell table: `snakemake --forcerun scaling_model` replans without any cell;
# `python -m dlscale.decisions.planner results/<study>` plans from an existing results folder by hand.
# (the fitting and solving modules are imported in the jobs, not at every parse: scipy.optimize
# and pulp stay out of each Slurm job's snakemake start-up)
from dlscale.study.partitions import partitions_from_hardware

OUT.update(
    {
        "model_fit": f"{RESULTS}/tables/model_fit.csv",
        "predictions": f"{RESULTS}/tables/predictions.csv",
        "plan": f"{RESULTS}/plan/plan.csv",
        "plan_alternatives": f"{RESULTS}/plan/alternatives.csv",
        "plan_constraints": f"{RESULTS}/plan/constraints.csv",
        "plan_figure": f"{RESULTS}/plan/plan.pdf",
        "plan_macros": f"{RESULTS}/report/plan_macros.tex",
        "plan_tables": f"{RESULTS}/report/plan_tables.tex",
    }
)
PLAN_CONFIG = STUDY.config["plan"]
# The planner's node counts per partition (hardware file: nodes_available, else max_nodes).
PLAN_NODES = {p.name: p.nodes_available for p in partitions_from_hardware(STUDY.hardware)}


rule scaling_model:
    input:
        cells=OUT["cells"],
    output:
        fits=OUT["model_fit"],
        predictions=OUT["predictions"],
    log:
        f"{LOGS}/scaling_model.log",
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
        fits=OUT["model_fit"],
        predictions=OUT["predictions"],
        # the cells that ran out of memory (does_not_fit): never offered
        status=OUT["status"],
    output:
        plan=OUT["plan"],
        alternatives=OUT["plan_alternatives"],
        constraints=OUT["plan_constraints"],
        figure=OUT["plan_figure"],
        macros=OUT["plan_macros"],
        tables=OUT["plan_tables"],
    log:
        f"{LOGS}/plan.log",
    params:
        plan=PLAN_CONFIG,
        hardware=STUDY.hardware,
        models=STUDY.config["axes"]["model"],
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
