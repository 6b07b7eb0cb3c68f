"""Snakemake `script:` wrapper: one convergence figure file from the time-to-accuracy tables
(dlscale.outputs.plotting; the layout entry comes from CONVERGENCE_LAYOUT in rules/common.smk)."""

import pandas as pd

from dlscale.outputs.convergence_plots import plot_convergence_figure

plot_convergence_figure(
    pd.read_csv(snakemake.input.time_to_accuracy),  # noqa: F821 (injected by Snakemake)
    pd.read_csv(snakemake.input.epochs),  # noqa: F821
    pd.read_csv(snakemake.input.convergence),  # noqa: F821
    spec=snakemake.params.spec,  # noqa: F821
    out=snakemake.output.pdf,  # noqa: F821
)
