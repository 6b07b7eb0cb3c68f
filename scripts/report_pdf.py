"""Snakemake `script:` wrapper: compile report.tex with latexmk (dlscale.report)."""

from dlscale.report import compile_pdf

compile_pdf(snakemake.input.tex, log=snakemake.log[0])  # noqa: F821 (injected by Snakemake)
