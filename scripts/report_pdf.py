"""Snakemake `script:` wrapper: compile report.tex with latexmk (dlscale.outputs.report)."""

from dlscale.outputs.report import compile_pdf

compile_pdf(snakemake.input.tex, log=snakemake.log[0])  # noqa: F821 (injected by Snakemake)
