"""The end of a run that succeeded (dlscale.workflow.finalize.report_message): a run whose jobs
hold the study's report names where to read it; a run of other targets says nothing."""

from __future__ import annotations

import os

from dlscale.workflow.finalize import report_message
from dlscale.workflow.paths import output_paths


def test_a_run_that_builds_the_report_ends_naming_the_pdf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = output_paths("results/tiny", "tiny")
    study = [out["cells"], out["tex"], out["pdf"], f"{out['figures']}/cpu/throughput.pdf"]
    os.makedirs(os.path.dirname(out["pdf"]))
    open(out["pdf"], "w").close()
    assert report_message(out, study) == (
        "dlscale: the study's report: results/tiny/report/report.pdf (tables in "
        "results/tiny/tables/, figures in results/tiny/figures/)"
    )
    assert report_message(out, [f"./{p}" for p in study]).endswith("figures/)")  # as Snakemake
    # without TeX the PDF is no target: the sources, and why there is no PDF
    line = report_message(out, study[:2])
    assert line.startswith("dlscale: the study's report sources: results/tiny/report/report.tex")
    assert "no PDF was built here (TeX not on PATH" in line
    # a run of other targets (check, a figure alone, an archive): nothing
    assert report_message(out, [out["verdicts"], out["archive"]]) is None
