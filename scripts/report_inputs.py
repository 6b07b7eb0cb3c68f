"""Snakemake `script:` wrapper: tables -> report macros and LaTeX tables (dlscale.report)."""
import pandas as pd

from dlscale.report import build_macros, write_cell_summary, write_macros, \
    write_quarantine_table, write_status_table

cells = pd.read_csv(snakemake.input.cells)  # noqa: F821 (injected by Snakemake)
scaling = pd.read_csv(snakemake.input.scaling)  # noqa: F821
quarantine = pd.read_csv(snakemake.input.quarantine)  # noqa: F821
status = pd.read_csv(snakemake.input.status)  # noqa: F821
write_macros(build_macros(snakemake.params.config, cells, scaling, quarantine, status,  # noqa: F821
                          n_planned=snakemake.params.n_planned),  # noqa: F821
             snakemake.output.macros)  # noqa: F821
write_cell_summary(scaling, status, snakemake.output.cells_table)  # noqa: F821
write_quarantine_table(quarantine, snakemake.output.quarantine_table)  # noqa: F821
write_status_table(status, snakemake.output.status_table)  # noqa: F821
