"""Snakemake `script:` wrapper: scaling table + references -> verdicts
(dlscale.decisions.regression_check)."""

from dlscale.decisions.regression_check import write_verdicts

write_verdicts(
    snakemake.input.scaling,  # noqa: F821 (injected by Snakemake)
    snakemake.input.status,  # noqa: F821
    snakemake.input.references,  # noqa: F821
    snakemake.output.verdicts,  # noqa: F821
    snakemake.output.table,  # noqa: F821
    schema=snakemake.params.schema,  # noqa: F821
    references_name=snakemake.params.name,  # noqa: F821
    log=snakemake.log[0],  # noqa: F821
)
