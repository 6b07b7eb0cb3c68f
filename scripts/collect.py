"""Snakemake `script:` wrapper: all cells' metrics -> tidy tables (dlscale.collect)."""
from dlscale.collect import write_tables

write_tables(
    [str(p) for p in snakemake.input.metrics],  # noqa: F821 (injected by Snakemake)
    ranks_csv=snakemake.output.ranks,  # noqa: F821
    cells_csv=snakemake.output.cells,  # noqa: F821
    scaling_csv=snakemake.output.scaling,  # noqa: F821
    quarantine_csv=snakemake.output.quarantine,  # noqa: F821
    status_csv=snakemake.output.status,  # noqa: F821
    straggler_threshold=snakemake.params.straggler_threshold,  # noqa: F821
)
