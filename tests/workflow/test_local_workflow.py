"""The workflow end to end on the embedded default (local profile), run as a user runs it."""
from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import copy_workflow, snakemake, tiny_study

pytestmark = pytest.mark.workflow


def job_counts(dry_run_stdout: str) -> dict[str, int]:
    table = dry_run_stdout.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """The tiny study (2 cells) run once to the PDF; shared by the tests below."""
    return tiny_study(tmp_path_factory.mktemp("study"), "profiles/local")


def test_dry_run_shows_product_minus_exclusions(tmp_path, base_config):
    config = copy.deepcopy(base_config)
    config["exclude"] = [{"model": "transformer_small", "policy": "strong"}]
    work = copy_workflow(tmp_path, config)
    proc = snakemake(work, "--profile", "profiles/local", "-n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = job_counts(proc.stdout)
    # one train rule per resource class (hardware x nodes); each holds models x policy x reps
    assert {k: v for k, v in counts.items() if k.startswith("train")} == {
        "train_cpu_n1": 2 * 2 * 2 - 2, "train_cpu_n2": 2 * 2 * 2 - 2}
    assert counts["report_pdf"] == 1 and counts["collect"] == 1


@pytest.mark.parametrize("key, value, fragment", [
    ("axes", {"framework": ["tensorflw"]}, "axes.framework[0]: 'tensorflw' is not allowed"),
    ("axes", {"nodes": [0, 1]}, "axes.nodes[0]: 0 must be >= 1"),
    ("per_rank_batch", -1, "per_rank_batch: -1 must be >= 1"),
    ("global_batch", 3, "global_batch: 3"),
    ("exclude", [{"model": "resnet50"}], "exclude[0].model"),
])
def test_bad_config_stops_before_any_job(tmp_path, tiny_config, key, value, fragment):
    config = copy.deepcopy(tiny_config)
    if key == "global_batch":
        config["axes"]["policy"] = ["strong"]
    if isinstance(value, dict):
        config[key] = {**config[key], **value}
    else:
        config[key] = value
    work = copy_workflow(tmp_path, config)
    proc = snakemake(work, "--profile", "profiles/local")
    assert proc.returncode != 0
    assert fragment in proc.stderr, proc.stderr[-2000:]
    assert "No job was started" in proc.stderr
    assert not (work / "results" / "runs").exists()


def test_tiny_study_reaches_the_pdf(finished_study):
    work = finished_study
    for path in ["results/tables/ranks.csv", "results/tables/cells.csv",
                 "results/tables/scaling.csv", "results/report/macros.tex",
                 "results/report/report.pdf"] + \
            [f"results/figures/cpu/{f}.pdf" for f in ("throughput", "speedup", "efficiency",
                                                       "frameworks", "breakdown")]:
        assert (work / path).stat().st_size > 0, path
    import pandas as pd
    ranks = pd.read_csv(work / "results/tables/ranks.csv")
    assert sorted(ranks.groupby("nodes")["rank"].count().items()) == [(1, 1), (2, 2)]
    cells = pd.read_csv(work / "results/tables/cells.csv").set_index("nodes")
    assert cells.loc[1, "speedup"] == pytest.approx(1.0)
    assert cells.loc[2, "scaling_efficiency"] == pytest.approx(
        cells.loc[2, "throughput_samples_per_s"] / cells.loc[1, "throughput_samples_per_s"] / 2)
    if shutil.which("pdftotext"):
        text = subprocess.run(["pdftotext", str(work / "results/report/report.pdf"), "-"],
                              capture_output=True, text=True).stdout
        assert "Figure 5" in text and "Cells" in text and "tiny" in text
        assert "95% percentile bootstrap" in text
        assert "cells.csv, is attached to this PDF: 2 rows" in " ".join(text.split())
    # the full cell table travels inside the PDF
    assert shutil.which("pdfdetach"), "poppler-utils (pdfdetach) is not installed"
    listing = subprocess.run(["pdfdetach", "-list", str(work / "results/report/report.pdf")],
                             capture_output=True, text=True, check=True).stdout
    assert listing.splitlines() == ["1 embedded files", "1: cells.csv"], listing
    saved = work / "detached"
    saved.mkdir(exist_ok=True)
    subprocess.run(["pdfdetach", "-saveall", "-o", str(saved),
                    str(work / "results/report/report.pdf")], check=True)
    assert (saved / "cells.csv").read_bytes() == (work / "results/tables/cells.csv").read_bytes()


def test_forcing_one_cell_reruns_it_and_downstream_only(finished_study):
    work = finished_study
    cell = "results/runs/cpu/pytorch/cnn_small/weak/fp32/n2/r1/metrics.jsonl"
    proc = snakemake(work, "--profile", "profiles/local", "-n", "--forcerun", cell)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = job_counts(proc.stdout)
    assert counts.pop("train_cpu_n2") == 1
    # one figure rule: a job per figure file (5 families on the demo's one hardware key)
    assert counts == {"collect": 1, "figure": 5, "report_inputs": 1, "report_pdf": 1, "all": 1}
    assert cell in proc.stdout


def test_regenerating_figures_touches_no_cell(finished_study):
    proc = snakemake(finished_study, "--profile", "profiles/local", "-n",
                     "--forcerun", "figure")
    counts = job_counts(proc.stdout)
    assert not any(k.startswith("train") for k in counts) and "collect" not in counts
    assert counts["figure"] == 5 and counts["report_pdf"] == 1


def test_everything_up_to_date_runs_nothing(finished_study):
    proc = snakemake(finished_study, "--profile", "profiles/local", "-n")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_lint_is_clean(root):
    proc = snakemake(root, "--lint")
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, \
        proc.stdout[-3000:] + proc.stderr[-3000:]


def test_missing_latex_keeps_tables_and_figures(finished_study, tmp_path):
    """Without latexmk/pdflatex on PATH the report job fails with a clear message; the tables
    and figures (separate rules) are still built."""
    import os
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):       # everything but TeX
        for tool in Path(folder).iterdir():
            if "tex" not in tool.name and "latex" not in tool.name \
                    and not (fakebin / tool.name).exists():
                (fakebin / tool.name).symlink_to(tool)
    from conftest import BIN
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{fakebin}")
    figures = finished_study / "results/figures/cpu/throughput.pdf"
    before = figures.stat().st_mtime
    proc = subprocess.run([str(BIN / "snakemake"), "--profile", "profiles/local", "--forcerun",
                           "collect"], cwd=finished_study, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "latexmk/pdflatex not found" in out, out[-3000:]
    assert figures.stat().st_mtime > before                           # figures rebuilt
    assert (finished_study / "results/tables/cells.csv").stat().st_size > 0
    # the workflow then restores the report once TeX Live is back
    proc = snakemake(finished_study, "--profile", "profiles/local")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_missing_framework_environment_is_an_early_error(tmp_path, tiny_config):
    config = copy.deepcopy(tiny_config)
    config["axes"]["framework"] = ["pytorch", "mxnet"]
    work = copy_workflow(tmp_path, config)
    if (work / ".venvs").is_symlink():
        (work / ".venvs").unlink()
    proc = snakemake(work, "--profile", "profiles/local", "-n")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "axes.framework[1]: 'mxnet' runs in .venvs/mxnet" in out, out[-2000:]
    assert "bash scripts/setup.sh mxnet" in out
