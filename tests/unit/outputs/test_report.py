"""The report's cell table is a bounded summary; the full cells.csv is attached
(dlscale.outputs.report)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pandas as pd
import pytest

from dlscale.outputs.cell_table import (
    MAX_SUMMARY_ROWS,
    SUMMARY_LEVELS,
    cell_summary,
    group_summary,
    write_cell_summary,
)
from dlscale.outputs.figure_layout import FAMILIES, figure_layout
from dlscale.outputs.report import render_tex

from helpers.synthetic_study import DEMO, LARGE, groups, study_tables


@pytest.fixture(scope="module")
def large():
    return study_tables(LARGE)


def _rows(tex: str) -> list[str]:
    body = tex.split(r"\midrule\endhead")[1].split(r"\bottomrule")[0]
    return [line for line in body.splitlines() if line.strip().endswith(r"\\")]


def test_large_study_summary_is_bounded_and_says_it_aggregated(large, tmp_path):
    cells, scaling, status = large
    out = tmp_path / "cells_table.tex"
    n = write_cell_summary(scaling, status, str(out))
    tex = out.read_text()
    n_groups = len(groups(LARGE))  # 400 groups
    assert n_groups > MAX_SUMMARY_ROWS
    assert n == len(_rows(tex)) <= MAX_SUMMARY_ROWS
    assert n == 4 * 5 * 2 * 1  # one level further: models aggregated
    assert f"would have {n_groups} rows" in tex
    assert "one row per hardware, framework, batch policy, precision and mode" in tex
    table, level, _ = cell_summary(scaling, status)
    assert level == 1 and table["cells_ok"].sum() == table["cells_planned"].sum() == len(cells)
    assert (table["groups"] == 10).all()


def test_summary_aggregates_as_far_as_needed(large):
    _, scaling, status = large
    # (hardware, framework, policy) has as many rows as level 1 here (one precision)
    for max_rows, level in [(400, 0), (399, 1), (40, 1), (39, 3), (20, 3), (19, 4), (1, 4)]:
        table, got, _ = cell_summary(scaling, status, max_rows=max_rows)
        assert got == level, max_rows
        assert len(table) == {0: 400, 1: 40, 2: 40, 3: 20, 4: 4}[level]
        assert list(table.columns[: len(SUMMARY_LEVELS[level][0])]) == SUMMARY_LEVELS[level][0]


def test_small_study_summary_has_one_row_per_group(tmp_path):
    cells, scaling, status = study_tables(DEMO)
    status = status.copy()
    missing = (status["model"] == "cnn_small") & (status["policy"] == "weak") & (status["rep"] == 2)
    status.loc[missing, "status"] = "missing"
    out = tmp_path / "cells_table.tex"
    n = write_cell_summary(scaling, status, str(out))
    tex = out.read_text()
    assert n == len(_rows(tex)) == 4 and "One row per hardware, framework, model" in tex
    summary = group_summary(scaling, status).set_index(["model", "policy"])
    assert summary.loc[("cnn_small", "weak"), ["cells_ok", "cells_planned"]].tolist() == [2, 4]
    assert summary.loc[("cnn_small", "strong"), "top_nodes"] == 2
    assert r"2/4 & 1, 2" in tex


def test_a_group_with_no_measured_cell_still_has_its_row(tmp_path):
    _, scaling, status = study_tables(DEMO)
    scaling = scaling[scaling["model"] != "transformer_small"]
    status = status.copy()
    status.loc[status["model"] == "transformer_small", "status"] = "failed"
    out = tmp_path / "cells_table.tex"
    assert write_cell_summary(scaling, status, str(out)) == 4
    assert re.search(
        r"transformer\\_small & weak & fp32 & eager & 0/4 & -- & -- & --", out.read_text()
    )


def test_report_tex_attaches_the_cell_table_and_lists_every_figure(tmp_path):
    layout = figure_layout(groups(LARGE), 3.5)
    out = tmp_path / "report.tex"
    render_tex(str(out), title="big_study", figures=layout, attachment="../tables/cells.csv")
    tex = out.read_text()
    assert r"\usepackage{attachfile2}" in tex
    assert re.search(
        r"\\textattachfile\[[^]]*ucfilespec=cells\.csv[^]]*\]"
        r"\{\.\./tables/cells\.csv\}",
        tex,
        re.S,
    )
    assert r"\dlsCellsCsvRows{} rows" in tex
    assert tex.count(r"]{../figures/") == len(layout) == len(FAMILIES) * 4 * 2
    assert tex.count(r"\includegraphics") == len(layout) + 1  # + the plan (Recommendations)
    assert tex.count(r"\subsection{Hardware") == 4
    assert "big\\_study" in tex and "model0, model1" in tex
    with pytest.raises(ValueError, match="plain relative path"):
        render_tex(
            str(out),
            title="t",
            figures=copy.deepcopy(layout),
            attachment="../tables/cells.csv}\\input{x",
        )


def test_failed_and_missing_table_is_bounded_and_lists_failed_cells_first(tmp_path):
    from dlscale.outputs.report import MAX_LISTED_CELLS, write_status_table

    rows = []
    for rep in range(1, 201):
        status = "failed" if rep in (7, 150, 199) else "missing"
        rows.append(
            {
                "hardware": "cpu",
                "framework": "pytorch",
                "model": "m",
                "policy": "weak",
                "precision": "fp32",
                "mode": "eager",
                "nodes": 1,
                "rep": rep,
                "status": status,
                "reason": "rank 0 exited with code 3" if status == "failed" else "",
                "failed_rank": 0 if status == "failed" else None,
                "exit_code": None,
                "slurm_job_id": None,
                "slurm_state": None,
                "slurm_exit_code": None,
                "log_tail": "",
                "metrics_path": f"r{rep}",
            }
        )
    out = tmp_path / "status_table.tex"
    write_status_table(pd.DataFrame(rows), str(out))
    text = out.read_text()
    listed = [line for line in text.splitlines() if line.startswith("cpu/pytorch/m/")]
    assert len(listed) == MAX_LISTED_CELLS
    assert sum(" & failed & " in line for line in listed) == 3  # failed cells come first
    assert f"{200 - MAX_LISTED_CELLS} more not listed ({200 - MAX_LISTED_CELLS} missing)" in text


def _demo_like_status(failed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The demo's shape: 16 throughput cells in cells.csv, and a status.csv of all
    20 planned cells (16 throughput, 4 convergence), `failed` convergence cells failed."""
    cells, scaling, status = study_tables(DEMO)
    cells = cells.assign(
        git_commit="abc",
        config_hash="h",
        earlier_measurements=0,
        libraries="torch 2.13.0",
        python="3.11",
        device_model="cpu",
        launcher="local",
        hosts="h1",
        energy_unavailable="no counter",
    )
    conv = status.head(4).assign(workload="convergence", policy="weak")
    conv["status"] = ["failed"] * failed + ["ok"] * (4 - failed)
    status = pd.concat([status.assign(workload="throughput"), conv], ignore_index=True)
    failure = {"reason": "", "slurm_state": None, "slurm_exit_code": None, "failed_rank": None}
    return cells, scaling, status.assign(**failure, log_tail="")


@pytest.mark.parametrize("failed", [0, 1])
def test_summary_and_failed_missing_section_count_the_same_cells(tmp_path, failed):
    """The Summary's "N of M planned cells measured" and the failed/missing section count the
    same cells: every planned cell, throughput and convergence named separately (the demo's
    Summary said 16 of 20 while its section said all 20 were measured)."""
    from dlscale.outputs.report import write_status_table
    from dlscale.outputs.report_macros import build_macros
    from dlscale.study.config import apply_defaults, load_schema

    root = Path(__file__).resolve().parents[3]
    config = apply_defaults(load_schema(root / "config/schemas/config.schema.json"), {})
    cells, scaling, status = _demo_like_status(failed)
    macros = build_macros(config, cells, scaling, pd.DataFrame(), status, n_planned=20)
    assert macros["dlsCellsPlanned"] == "20"
    assert macros["dlsCellsMeasured"] == str(20 - failed)  # was len(cells.csv): 16
    assert macros["dlsCellsByWorkload"] == f"throughput: 16 of 16; convergence: {4 - failed} of 4"
    assert macros["dlsThroughputCellsMeasured"] == "16"  # the idle probe's denominator
    assert macros["dlsCellsFailed"] == str(failed)
    out = tmp_path / "status_table.tex"
    write_status_table(status, str(out))
    section = out.read_text()
    assert f"{20 - failed} of 20 planned cells were measured" in section or (
        not failed and section.startswith("All 20 planned cells were measured")
    )
    assert macros["dlsCellsByWorkload"] in section


def test_the_axis_list_is_written_once():
    """The axes live in dlscale.study.cell (AXES; stats.GROUP without nodes): no other module types
    the list again (tta_report._KEYS did)."""
    import ast

    from dlscale.analysis.stats import GROUP

    package = Path(__file__).resolve().parents[3] / "scripts" / "dlscale"
    copies = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "cell.py" or "db_migrations" in path.parts:  # a migration is frozen
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.List, ast.Tuple)):
                names = {e.value for e in node.elts if isinstance(e, ast.Constant)}
                if set(GROUP) <= names:
                    copies.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not copies, f"the axis list typed again (use dlscale.study.cell.AXES): {copies}"
