"""Snakemake `script:` wrapper: this study (B) against another study's results (A), cell by
cell (dlscale.decisions.compare)."""

from pathlib import Path

from dlscale.decisions.compare import compare_outputs

table, summary = compare_outputs(
    Path(snakemake.input.baseline_cells).parents[1],  # noqa: F821 (injected by Snakemake)
    Path(snakemake.input.cells).parents[1],  # noqa: F821
    Path(snakemake.output.table).parent,  # noqa: F821
)
Path(snakemake.log[0]).write_text(summary)  # noqa: F821
