"""History you can ask: the runs of a configuration across studies, judged against the last good
run, with what changed named; the command's table, CSV and trend figure (checked by
tests/helpers/figure_check.py); the report's History section; check against the history.

The rows are synthetic (helpers.results_db.synthetic_rows: weekly runs of 6 repetitions at 2 %
noise, 10 % slower from week 5 on with torch 2.14.0 and another framework environment) in a
SQLite file: the back-ends' own behaviour is tests/unit/store/test_results_database.py's."""

from __future__ import annotations

import os
import time

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from dlscale.decisions import history, history_command, history_report, regression_check
from dlscale.outputs.figure_kit import paper_style
from dlscale.outputs.history_figure import CAPTION, history_axes
from dlscale.store import database as store
from dlscale.store import results_schema as schema

from helpers import results_db
from helpers.figure_check import figure_problems

SERIES = [{"model": "llama3_8b", "nodes": 8}, {"model": "llama3_8b", "nodes": 2, "base": 300.0}]


@pytest.fixture
def weekly(tmp_path):
    """A database with 8 weekly runs of two configurations, 10 % slower from week 5 on."""
    url = f"sqlite:///{tmp_path / 'results' / store.DATABASE_FILE}"
    db = store.connect(url)
    with db.transaction() as conn:
        rows = results_db.synthetic_rows(SERIES, runs=8, reps=6, slowdown_at=5, seed=1)
        schema.insert_new(conn, schema.measurements, rows)
    yield db, url
    db.close()


def test_each_run_is_judged_against_the_last_good_one_and_a_fail_names_what_changed(weekly):
    db, _ = weekly
    table = history.history_table(history.load(db, {"nodes": 8}))
    assert table["study"].tolist() == [f"week{k:03d}" for k in range(8)]
    assert table["verdict"].tolist() == ["first"] + ["PASS"] * 4 + ["FAIL"] * 3
    assert table["n"].tolist() == [6] * 8
    bad = table[table["verdict"] == "FAIL"]
    assert (bad["baseline_study"] == "week004").all()  # the last good run, every time
    assert (bad["first_bad"].str.startswith("week005")).all()
    assert (bad["last_good"].str.startswith("week004")).all()
    assert bad["changes"].str.contains("torch: 2.13.0 -> 2.14.0").all()
    assert bad["slowdown"].between(0.07, 0.13).all() and (bad["slowdown_low"] > 0).all()


def test_matched_by_identity_a_changed_environment_starts_a_series_of_its_own(weekly):
    db, _ = weekly
    table = history.history_table(history.load(db, {"nodes": 8}), match="identity")
    assert table["series_hash"].nunique() == 2
    assert "FAIL" not in set(table["verdict"])
    assert table.groupby("series_hash")["verdict"].first().tolist() == ["first", "first"]


def test_the_command_prints_exports_and_draws_the_trend(weekly, tmp_path, capsys):
    _, url = weekly
    csv, figure = tmp_path / "h.csv", tmp_path / "h.pdf"
    argv = ["--model", "llama3_8b", "--strategy", "ddp", "--precision", "bf16", "--by", "torch"]
    assert (
        history_command.main([*argv, "--database", url, "--csv", str(csv), "--figure", str(figure)])
        == 0
    )
    out = capsys.readouterr().out
    assert "h100/pytorch/llama3_8b/weak/bf16/eager/ddp/n8/rpn8  (software match, 8 point(s))" in out
    assert "2.14.0" in out and "changed: " in out and "torch: 2.13.0 -> 2.14.0" in out
    assert "newest point per series: 2 FAIL" in out
    exported = pd.read_csv(csv)
    assert len(exported) == 16 and {"n", "interval_low", "verdict", "changes"} <= set(exported)
    assert figure.stat().st_size > 0
    with paper_style():
        fig, shown, total = history_axes(exported, by="commit")
        assert (shown, total) == (2, 2)
        assert figure_problems(fig, CAPTION) == []
        plt.close(fig)


def test_the_reports_history_section_and_the_pending_marker(weekly, tmp_path):
    db, url = weekly
    hist = history.study_history(db, "week007")
    assert hist.verdicts["verdict"].tolist() == ["FAIL", "FAIL"]
    tex = history_report.section_tex(
        hist, match="software", threshold=0.05, figure="../history/history.pdf", caption="c"
    )
    assert "\\section{History}" in tex and "\\textbf{2 FAIL}" in tex
    assert "What changed" in tex and "torch: 2.13.0 -> 2.14.0" in tex
    first = history.study_history(db, "week000")  # nothing earlier: no section
    assert history_report.section_tex(
        first, match="software", threshold=0.05, figure=None, caption=""
    ).startswith("% No History section")

    study = tmp_path / "results" / "later"
    outputs = {
        "table": str(study / "history" / "history.csv"),
        "verdicts": str(study / "history" / "verdicts.csv"),
        "figure": str(study / "history" / "history.pdf"),
        "tex": str(study / "report" / "history.tex"),
    }
    gone = f"postgresql+psycopg://u@/db?host={tmp_path}&port=1"
    history_report.history_job(gone, str(study), outputs, str(study / "logs" / "history.log"))
    assert store.is_pending(study)  # newer than the outputs: the next run records first
    marker = store.pending_path(study).stat().st_mtime_ns
    assert all(os.stat(outputs[k]).st_mtime_ns <= marker for k in ("table", "verdicts", "tex"))
    assert open(outputs["tex"]).read().startswith("% No History section")
    time.sleep(0.01)
    history_report.history_job(url, str(study), outputs, str(study / "logs" / "history.log"))
    assert not store.is_pending(study)
    assert store.pending_path(study).stat().st_mtime_ns < os.stat(outputs["tex"]).st_mtime_ns


def test_check_against_the_history_fails_a_slower_study(weekly, tmp_path, capsys):
    _, url = weekly
    folder = tmp_path / "results" / "week007"
    folder.mkdir(parents=True)
    argv = [str(folder), "--against", "history", "--database", url]
    assert regression_check.main(argv) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "changed: " in out and "history verdicts: 2 FAIL" in out
