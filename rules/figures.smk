# One rule draws every figure file: results/<study>/figures/{hardware}/{figure}.pdf, where
# {figure} is a family (dlscale.outputs.figure_layout.FAMILIES) or {family}-{part} when a hardware key needs more than one
# file (the list is FIGURE_LAYOUT in common.smk, by dlscale.workflow.figure_files; params.spec
# says what the file holds). It reads only the scaling table, so figures regenerate without
# touching any cell:
# `snakemake --profile profiles/local --forcerun figure`.
# In Snakemake's report (`--report`) each file is filed under its family and hardware and
# labelled by the axis values it shows (dlscale.outputs.snakemake_report); its caption is the layout's.
from dlscale.outputs.figure_layout import CONVERGENCE_FIGURE_NAME_PATTERN, FIGURE_NAME_PATTERN
from dlscale.outputs.snakemake_report import figure_category, figure_labels, figure_subcategory


rule figure:
    input:
        scaling=RULE_OUT["scaling"],
        predictions=RULE_OUT["predictions"],  # dashed predicted extensions (rules/plan.smk)
    output:
        pdf=report(
            f"{RULE_OUT['figures']}/{{hardware}}/{{figure}}.pdf",
            caption="../report/figure.rst",
            category=figure_category,
            subcategory=figure_subcategory,
            labels=figure_labels,
        ),
    log:
        f"{RULE_OUT['logs']}/figures/{{hardware}}/{{figure}}.log",
    wildcard_constraints:
        figure=FIGURE_NAME_PATTERN,
    params:
        spec=figure_spec,
    run:
        import pandas as pd
        from dlscale.outputs.plotting import plot_figure

        plot_figure(
            pd.read_csv(input.scaling),
            spec=params.spec,
            out=output.pdf,
            predictions=pd.read_csv(input.predictions),
        )


# The convergence workload's figures (dlscale.outputs.figure_layout.CONVERGENCE_FAMILIES): one rule for every
# file of results/<study>/figures/{hardware}/convergence/, from the time-to-accuracy tables only
# (rules/collect.smk), so they regenerate without touching any cell:
# `snakemake --profile profiles/local --forcerun convergence_figure`.
rule convergence_figure:
    input:
        time_to_accuracy=RULE_OUT["time_to_accuracy"],
        epochs=RULE_OUT["epochs"],
        convergence=RULE_OUT["convergence"],
    output:
        pdf=report(
            f"{RULE_OUT['figures']}/{{hardware}}/convergence/{{figure}}.pdf",
            caption="../report/convergence_figure.rst",
            category=figure_category,
            subcategory=figure_subcategory,
            labels=figure_labels,
        ),
    log:
        f"{RULE_OUT['logs']}/figures/{{hardware}}/convergence/{{figure}}.log",
    wildcard_constraints:
        figure=CONVERGENCE_FIGURE_NAME_PATTERN,
    params:
        spec=convergence_figure_spec,
    run:
        from dlscale.outputs.convergence_plots import plot_convergence_tables

        plot_convergence_tables(
            input.time_to_accuracy, input.epochs, input.convergence, params.spec, output.pdf
        )
