"""The report's text checked by machine: the report is rendered by the
production code (dlscale.outputs.report: macros, tables, the Jinja template; the planner's
Recommendations macros) for the demo, a one-repetition study, a CPU-only and a GPU study and a
study with competing cells; its macros are expanded into the text a reader sees, and every
sentence is held to: no template slot empty or said twice, numbers for reading (never 1e+02),
no device named that the study did not use, tables that count what they say, and the Summary
carrying the competition flag when it applies."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from dlscale.analysis import scaling_model as scalemodel
from dlscale.analysis.stats import GROUP, scaling_summary
from dlscale.decisions.plan_report import write_recommendations
from dlscale.outputs.figure_layout import figure_layout
from dlscale.outputs.report import render_tex, write_report_inputs
from dlscale.study.config import load_schema, validate_config

from helpers.synthetic_study import DEMO_STUDY as DEMO
from helpers.synthetic_study import cells_table, groups

ROOT = Path(__file__).resolve().parents[3]


def measured(cells: pd.DataFrame, device: str) -> pd.DataFrame:
    """The provenance and execution columns collect writes for every measured cell (cells.csv),
    each cell with its own configuration hash (cells hash their own fields)."""
    gpu = device != "cpu"
    return cells.assign(
        device=device,
        git_commit="d13ddb8",
        config_hash=[f"h{i:04d}" for i in range(len(cells))],
        earlier_measurements=0,
        libraries="torch 2.13.0",
        python="3.11.2",
        device_model="NVIDIA H100 80GB HBM3" if gpu else "Intel Xeon",
        launcher="local",
        hosts="node1",
        energy_unavailable=None if gpu else "no RAPL counter readable",
        joules_per_sample=0.5 if gpu else None,
        probe_seconds_max=0.15,
        timer="CUDA events around each step" if gpu else "time.perf_counter around each step",
        fast_paths=None,
        compile_seconds=0.4,
        telemetry_unavailable=None,
    )


def study(kind: str) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """(config, cells, status) of a study of this kind; status also lists 4 convergence cells
    (the demo's), which the throughput cell table must not count."""
    axes = dict(DEMO)
    if kind == "one_rep":
        axes["rep"] = [1]
    if kind == "gpu":
        axes["hardware"] = ["h100"]
    cells = measured(cells_table(axes), "cuda" if kind == "gpu" else "cpu")
    cells["competing"] = False
    if kind == "competing":  # the demo's walk: 15 of 16 cells measured under competition
        cells.loc[cells.index[1:], "competing"] = True
    status = cells[[*GROUP, "nodes", "rep"]].assign(workload="throughput", status="ok")
    conv = pd.DataFrame(
        [
            {"hardware": axes["hardware"][0], "framework": "pytorch", "model": "cnn_small"}
            | {"policy": p, "precision": "fp32", "mode": "eager", "parallelism": "ddp"}
            | {"nodes": n, "rep": 1, "workload": "convergence", "status": "ok"}
            for p in ("weak", "strong")
            for n in (1, 2)
        ]
    )
    status = pd.concat([status, conv], ignore_index=True)
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    config["axes"] = {k: v for k, v in axes.items() if k != "rep"}
    config["repetitions"] = len(axes["rep"])
    config = validate_config(config, load_schema(ROOT / "config/schemas/config.schema.json"))
    return config, cells, status


def render(tmp: Path, kind: str) -> tuple[str, dict]:
    """The report's text as a reader sees it: report.tex with its \\input files inlined and
    every dls macro replaced by its value; and the macros."""
    config, cells, status = study(kind)
    tables, report = tmp / "tables", tmp / "report"
    tables.mkdir(parents=True)
    report.mkdir()
    paths = {k: str(tables / f"{k}.csv") for k in ("cells", "scaling", "quarantine", "status")}
    cells.to_csv(paths["cells"], index=False)
    scaling_summary(cells).to_csv(paths["scaling"], index=False)
    pd.DataFrame(columns=["metrics_path", "reason"]).to_csv(paths["quarantine"], index=False)
    status.to_csv(paths["status"], index=False)
    for name in ("macros", "cells_table", "quarantine_table", "status_table"):
        paths[name] = str(report / f"{name}.tex")
    write_report_inputs(paths, config=config, n_planned=len(status))
    fits, _ = scalemodel.model_tables(cells)
    plan = {**config["plan"], "objective": config["plan"].get("objective", "min_time")}
    write_recommendations(
        ValueError("no jobs"), fits, plan, str(report / "plan_macros.tex"), str(report / "t.tex")
    )
    hardware = cells["hardware"].unique().tolist()
    devices = {hw: "cpu" if hw == "cpu" else "cuda" for hw in hardware}  # as the site file says
    layout = figure_layout(groups({**DEMO, "hardware": hardware}), 3.5, devices=devices)
    render_tex(
        str(report / "report.tex"), title="t", figures=layout, attachment="../tables/cells.csv"
    )
    macros = {}
    for name in ("macros", "plan_macros"):
        for line in (report / f"{name}.tex").read_text().splitlines():
            m = re.fullmatch(r"\\newcommand\{\\(dls[A-Za-z]+)\}\{(.*)\}", line)
            if m:
                macros[m.group(1)] = m.group(2)
    text = (report / "report.tex").read_text()
    text = re.sub(
        r"\\input\{([a-z_]+\.tex)\}",
        lambda m: (report / m.group(1)).read_text() if (report / m.group(1)).exists() else "",
        text,
    )
    for name in sorted(macros, key=len, reverse=True):
        text = re.sub(rf"\\{name}(\{{\}})?", lambda _, v=macros[name]: v, text)
    return text, macros


KINDS = ["demo", "one_rep", "gpu", "competing"]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    return {k: render(tmp_path_factory.mktemp(k), k) for k in KINDS}


def sentences(text: str) -> list[str]:
    flat = re.sub(r"\s+", " ", text)
    return [s.strip() for s in re.split(r"(?<=[.;:])\s", flat) if s.strip()]


# phrases a template slot produces when its value is empty or repeats the words around it
EMPTY_OR_DOUBLED = [
    (r"for one intervals", "an interval method read as an adjective"),
    (r"configuration hash \S+ \d+ per-cell", "a count in the hash's slot"),
    (r"\bn = (\d+)--\1\b", "a range whose ends are equal"),
    (r"\b(\w{3,}) \1\b", "a word said twice"),
    (r"\(\s*\)", "empty parentheses"),
    (r"\s[,.;]", "a space before punctuation (an empty slot)"),
    (r"[,;]\s*[,;.]", "two punctuation marks (an empty slot between)"),
    (r"\\dls(?!figwidth)[A-Za-z]+", "a macro left undefined"),
]


@pytest.mark.parametrize("kind", KINDS)
def test_no_slot_is_empty_or_doubled_and_numbers_read_as_numbers(reports, kind):
    text, _ = reports[kind]
    body = text.split(r"\begin{document}")[1]
    for pattern, why in EMPTY_OR_DOUBLED:
        found = [s for s in sentences(body) if re.search(pattern, s)]
        assert not found, f"{why}: {found[:3]}"
    assert not re.findall(r"\d(\.\d+)?e[+-]\d", body), "a number in scientific notation"


def test_no_statement_names_a_device_the_study_did_not_use(reports):
    """In a CPU-only study no sentence names CUDA, NVML or NVIDIA: the figure layout takes each
    hardware entry's device from the site file (rules/common.smk), so even the telemetry
    caption says only what its hardware's figure shows."""
    cpu, _ = reports["demo"]
    named = [
        s for s in sentences(cpu.split(r"\begin{document}")[1]) if re.search(r"CUDA|NVML|NVIDIA", s)
    ]
    assert not named, named
    assert "every cell ran on CPUs" in cpu
    gpu, _ = reports["gpu"]  # and a GPU study keeps them (the check is not vacuous)
    assert "CUDA events" in gpu and "NVML" in gpu


def test_the_counts_say_what_they_count(reports):
    text, macros = reports["demo"]
    # the cell table summarises the throughput cells: 4 per group of 2 node counts x 2 reps,
    # not the convergence cells of cnn_small
    rows = [r for r in text.splitlines() if r.startswith("cpu & pytorch & cnn")]
    assert rows and all(" & 4/4 & " in r for r in rows), rows
    assert "throughput cells measured of those planned" in text
    assert macros["dlsCellsPlanned"] == "20" and macros["dlsCellsMeasured"] == "20"
    assert macros["dlsReps"] == "n = 2" and reports["one_rep"][1]["dlsReps"] == "n = 1"
    assert "configuration hashes: 16 distinct" in macros["dlsConfigHash"]
    # the plan's times: the model's throughput, said so
    assert "Times assume that the scaling model's throughput" in text
    assert "Times assume the measured throughput" not in text


def test_the_summary_carries_the_competition_flag_when_it_applies(reports):
    summary = reports["competing"][0].split(r"\section{Summary}")[1].split(r"\section")[0]
    assert "15 of 16 throughput cells were measured while other processes kept" in summary
    quiet = reports["demo"][0].split(r"\section{Summary}")[1].split(r"\section")[0]
    assert "other processes" not in quiet


def test_numbers_read_as_numbers():
    from dlscale.outputs import latex_text, tta_section

    for fmt in (latex_text._fmt, tta_section._fmt):
        assert fmt(99.7, 2) == "100" and fmt(0.062, 2) == "0.062" and fmt(12345.0) == "12,345"
        assert "e" not in fmt(0.000123) and "e" not in fmt(1e-7, 2)
    assert tta_section._range(99.7, 99.71, 2) == "100"
    assert np.isnan(float("nan")) and tta_section._fmt(float("nan")) == "--"


def test_an_infeasible_limit_and_the_smallest_feasible_one_read_differently():
    """A budget just below the need (1.99999 against 2 node-hours) prints both apart (the
    demo's walk read "19.05 is infeasible; the smallest feasible ... is 19.05")."""
    from dlscale.decisions import planner as pl

    from unit.decisions.test_planner import FAST_CHEAP, JOB, PARTS

    with pytest.raises(pl.PlanError) as info:
        pl.make_plan(FAST_CHEAP, JOB, PARTS, budget_node_hours=1.99999)
    asked, least = re.search(
        r"budget_node_hours (\S+) is infeasible; the smallest feasible budget_node_hours is (\S+)",
        str(info.value),
    ).groups()
    assert asked != least and float(asked) == 1.99999 and float(least) == 2.0


@pytest.mark.parametrize("workloads", [["throughput"], ["throughput", "convergence"]])
def test_the_text_promises_only_the_sections_the_study_has(tmp_path, workloads):
    """A throughput-only study's report neither promises time-to-accuracy nor holds its
    section: the Summary says it has none and how to add it. With convergence cells, the
    Summary and Methods point to the section, which is there."""
    figure = {"file": "cpu/throughput.pdf", "caption": "c", "hardware": "cpu", "width_in": 3.5}
    convergence = [dict(figure, file="cpu/convergence/tta.pdf", family="time_to_accuracy")]
    tex = tmp_path / "report.tex"
    render_tex(
        str(tex),
        title="t",
        figures=[dict(figure, family="throughput")],
        attachment="../tables/cells.csv",
        convergence_figures=convergence if "convergence" in workloads else [],
    )
    text = tex.read_text()
    summary = re.sub(r"\s+", " ", text.split(r"\section{Summary}")[1].split(r"\section")[0])
    if "convergence" in workloads:
        assert r"reached their target) is in Section~\ref{sec:tta}." in summary
        assert text.count(r"\ref{sec:tta}") == 2 and r"\label{sec:tta}" in text
    else:
        assert "sec:tta" not in text and "Time to accuracy" not in text
        assert "This study has no convergence cells, so it reports no time-to-accuracy" in summary
    assert r"Throughput results on synthetic data are in Section~\ref{sec:throughput}." in summary
