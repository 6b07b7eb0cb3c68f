"""Snakemake `script:` wrapper: one figure file of the layout from the scaling table
(dlscale.outputs.plotting; the layout entry comes from FIGURE_LAYOUT in rules/common.smk)."""

import pandas as pd

from dlscale.outputs.plotting import plot_figure

plot_figure(
    pd.read_csv(snakemake.input.scaling),  # noqa: F821 (injected by Snakemake)
    spec=snakemake.params.spec,  # noqa: F821
    out=snakemake.output.pdf,  # noqa: F821
    predictions=pd.read_csv(snakemake.input.predictions)  # noqa: F821
    if "predictions" in snakemake.input.keys()  # noqa: F821
    else None,
)
