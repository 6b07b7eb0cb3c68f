"""Snakemake `script:` wrapper: render report.tex from the template (dlscale.outputs.report)."""

from dlscale.outputs.report import render_tex

render_tex(
    snakemake.output.tex,
    title=snakemake.params.title,  # noqa: F821 (Snakemake)
    figures=snakemake.params.figures,  # noqa: F821
    convergence_figures=snakemake.params.convergence_figures,  # noqa: F821
    attachment=snakemake.params.attachment,
)  # noqa: F821
