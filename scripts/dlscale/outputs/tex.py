"""Whether TeX is here to compile the report's PDF, and what a run without it says.

The report PDF is compiled by latexmk with pdflatex (Debian's TeX Live, or a site's
`module load texlive`). A login node often has neither: the workflow then asks for everything but
the PDF (the tables, figures, Snakemake's report and the report's LaTeX sources) and says so once,
at the start of the run, with the one command that builds the PDF later wherever TeX exists
(rules/common.smk, decided when the workflow is parsed). Standard library only: read at parse time.
"""

from __future__ import annotations

import shutil

TEX_TOOLS = ("latexmk", "pdflatex")


def tex_missing(which=shutil.which) -> list[str]:
    """The TeX tools the report PDF needs that are not on PATH (none: the PDF can be built)."""
    return [tool for tool in TEX_TOOLS if which(tool) is None]


def no_tex_notice(missing: list[str], pdf: str, tex: str, command: str) -> str:
    """The notice of a run without TeX: what it builds, what it leaves out, and how to build the
    PDF later (`command`: the run's own command with the PDF as its target)."""
    return (
        f"dlscale: TeX not found on PATH ({', '.join(missing)} missing): this run builds the "
        f"study's tables, figures and report sources ({tex}) but not {pdf}. Build the PDF later, "
        "wherever TeX exists (TeX Live on PATH, e.g. after `module load texlive`), with:\n"
        f"  {command}"
    )
