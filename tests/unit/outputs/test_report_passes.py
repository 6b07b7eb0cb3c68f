"""The report's PDF in as few pdflatex runs as its content needs
(dlscale.outputs.report.compile_pdf): a report with an attached table and cross-references
settles in 2 runs, where latexmk took a third, identical one when attachfile2's record (.atfi)
first appeared in the second run."""

from __future__ import annotations

import re

import pytest

from dlscale.outputs.report import compile_pdf, tex_missing

pytestmark = pytest.mark.skipif(tex_missing(), reason="no TeX on PATH (latexmk, pdflatex)")

# the report's own packages around what needs a second run: a label referenced before it, an
# outline entry (hyperref's .out) and an attached file (attachfile2's .atfi)
TEX = r"""\documentclass{article}
\usepackage{attachfile2}
\usepackage{hyperref}
\begin{document}
\section{Cells}\label{s:cells}
See Section~\ref{s:more}; the table: \textattachfile[mimetype=text/csv]{cells.csv}{cells.csv}.
\section{More}\label{s:more}
Back to Section~\ref{s:cells}.
\end{document}
"""


def pdflatex_runs(log: str) -> int:
    return len(re.findall(r"^Run number \d+ of rule 'pdflatex'", log, re.M))


def test_a_report_with_an_attachment_compiles_in_two_runs(tmp_path):
    (tmp_path / "cells.csv").write_text("cell,throughput\na,1\n")
    tex = tmp_path / "report.tex"
    tex.write_text(TEX)
    log = tmp_path / "logs/report_pdf.log"
    compile_pdf(str(tex), str(log))
    assert (tmp_path / "report.pdf").stat().st_size > 0
    assert pdflatex_runs(log.read_text()) == 2, log.read_text()[-2000:]
