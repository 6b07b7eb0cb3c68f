"""Snakemake `script:` wrapper: tables -> report macros and LaTeX tables
(dlscale.outputs.report)."""

from dlscale.outputs.report import write_report_inputs

write_report_inputs(
    {
        **dict(snakemake.input.items()),  # noqa: F821 (injected by Snakemake)
        **dict(snakemake.output.items()),
    },  # noqa: F821
    config=snakemake.params.config,  # noqa: F821
    n_planned=snakemake.params.n_planned,
)  # noqa: F821
