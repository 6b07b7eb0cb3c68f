"""Snakemake `script:` wrapper: one figure family from the scaling table (dlscale.plotting)."""
import pandas as pd

from dlscale.plotting import plot_family

plot_family(
    pd.read_csv(snakemake.input.scaling),  # noqa: F821 (injected by Snakemake)
    family=snakemake.wildcards.figure,  # noqa: F821
    out=snakemake.output.pdf,  # noqa: F821
    column_width_in=snakemake.params.column_width_in,  # noqa: F821
)
