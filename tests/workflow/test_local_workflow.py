"""The workflow end to end on the embedded default (local profile), run as a user runs it."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
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
        "train_cpu_n1": 2 * 2 * 2 - 2,
        "train_cpu_n2": 2 * 2 * 2 - 2,
    }
    assert counts["report_pdf"] == 1 and counts["collect"] == 1


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("axes", {"framework": ["tensorflw"]}, "axes.framework[0]: 'tensorflw' is not allowed"),
        ("axes", {"nodes": [0, 1]}, "axes.nodes[0]: 0 must be >= 1"),
        ("per_rank_batch", -1, "per_rank_batch: -1 must be >= 1"),
        ("global_batch", 3, "global_batch: 3"),
        ("exclude", [{"model": "resnet50"}], "exclude[0].model"),
    ],
)
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
    assert not list((work / "results").rglob("metrics.jsonl"))


def test_tiny_study_reaches_the_pdf(finished_study):
    work = finished_study
    for path in [
        "results/tiny/tables/ranks.csv",
        "results/tiny/tables/cells.csv",
        "results/tiny/tables/scaling.csv",
        "results/tiny/report/macros.tex",
        "results/tiny/report/report.pdf",
        "results/tiny/tables/model_fit.csv",
        "results/tiny/tables/predictions.csv",
        "results/tiny/plan/plan.csv",
        "results/tiny/plan/plan.pdf",
    ] + [
        f"results/tiny/figures/cpu/{f}.pdf"
        for f in ("throughput", "speedup", "efficiency", "frameworks", "breakdown")
    ]:
        assert (work / path).stat().st_size > 0, path
    import pandas as pd

    ranks = pd.read_csv(work / "results/tiny/tables/ranks.csv")
    assert sorted(ranks.groupby("nodes")["rank"].count().items()) == [(1, 1), (2, 2)]
    cells = pd.read_csv(work / "results/tiny/tables/cells.csv").set_index("nodes")
    assert cells.loc[1, "speedup"] == pytest.approx(1.0)
    assert cells.loc[2, "scaling_efficiency"] == pytest.approx(
        cells.loc[2, "throughput_samples_per_s"] / cells.loc[1, "throughput_samples_per_s"] / 2
    )
    if shutil.which("pdftotext"):
        text = subprocess.run(
            ["pdftotext", str(work / "results/tiny/report/report.pdf"), "-"],
            capture_output=True,
            text=True,
        ).stdout
        assert "Figure 5" in text and "Cells" in text and "tiny" in text
        assert "95% nonparametric order-statistic CI" in text
        assert "cells.csv, is attached to this PDF: 2 rows" in " ".join(text.split())
        # the planner's section: numbers from its macros; a 2-node-count series is not validated
        words = " ".join(text.split())
        assert "Recommendations" in words and "too short to validate" in words
        assert "The plan below is the exact optimum" in words and "predicted" in words
    plan = pd.read_csv(work / "results/tiny/plan/plan.csv")
    assert list(plan["job"]) == ["cnn_small"] and plan.loc[0, "hardware"] == "cpu"
    preds = pd.read_csv(work / "results/tiny/tables/predictions.csv")
    assert preds["extrapolated"].any() and set(preds["nodes"]) >= {1, 2, 4, 8, 16}
    # the full cell table travels inside the PDF
    assert shutil.which("pdfdetach"), "poppler-utils (pdfdetach) is not installed"
    listing = subprocess.run(
        ["pdfdetach", "-list", str(work / "results/tiny/report/report.pdf")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert listing.splitlines() == ["1 embedded files", "1: cells.csv"], listing
    saved = work / "detached"
    saved.mkdir(exist_ok=True)
    subprocess.run(
        ["pdfdetach", "-saveall", "-o", str(saved), str(work / "results/tiny/report/report.pdf")],
        check=True,
    )
    assert (saved / "cells.csv").read_bytes() == (
        work / "results/tiny/tables/cells.csv"
    ).read_bytes()


def test_forcing_one_cell_reruns_it_and_downstream_only(finished_study):
    work = finished_study
    cell = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    proc = snakemake(work, "--profile", "profiles/local", "-n", "--forcerun", cell)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = job_counts(proc.stdout)
    assert counts.pop("train_cpu_n2") == 1
    # one figure rule: a job per figure file (5 families on the demo's one hardware key)
    assert counts == {
        "collect": 1,
        "scaling_model": 1,
        "plan": 1,
        "figure": 5,
        "report_inputs": 1,
        "report_pdf": 1,
        "all": 1,
    }
    assert cell in proc.stdout


def test_regenerating_figures_touches_no_cell(finished_study):
    proc = snakemake(finished_study, "--profile", "profiles/local", "-n", "--forcerun", "figure")
    counts = job_counts(proc.stdout)
    assert not any(k.startswith("train") for k in counts) and "collect" not in counts
    assert counts["figure"] == 5 and counts["report_pdf"] == 1


def test_everything_up_to_date_runs_nothing(finished_study):
    proc = snakemake(finished_study, "--profile", "profiles/local", "-n")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_systems_table_and_the_study_archive(finished_study, tmp_path):
    """Every node's probes reach the Systems table; the archive target round-trips and its
    check finds a changed file."""
    import json
    import tarfile

    import pandas as pd

    work = finished_study
    for cell in ("n1", "n2"):
        path = (
            work
            / f"results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/{cell}/r1/metrics.jsonl"
        )
        starts = [
            json.loads(line)["value"]
            for line in path.read_text().splitlines()
            if '"rank_start"' in line
        ]
        assert all(s["cpu_affinity"] for s in starts)
        systems = [s["system"] for s in starts if s["local_rank"] == 0]
        assert len(systems) == int(cell[1:])  # one per node
        for system in systems:
            assert system["probe_seconds"] < 1.0
            assert all(
                system[k]["available"] or system[k]["reason"]
                for k in ("os", "cpu", "memory", "gpu", "network", "slurm", "packages")
            )
    (env,) = (work / "results/tiny/environments").glob("*.txt")  # once per study
    assert env.stem == systems[0]["packages"]["sha256"]
    table = pd.read_csv(work / "results/tiny/tables/systems.csv", keep_default_na=False)
    assert {"Operating system", "CPU model", "Accelerators per node", "Allocation"} <= set(
        table["field"]
    )
    assert (table["cells_nodes_differ"] == 0).all()  # one machine: its nodes agree
    assert table["mlperf_fields"].astype(bool).all()
    if shutil.which("pdftotext"):
        text = subprocess.run(
            ["pdftotext", str(work / "results/tiny/report/report.pdf"), "-"],
            capture_output=True,
            text=True,
        ).stdout
        assert "Systems" in text and "MLPerf" in text and "host_processor_model_name" in text

    proc = snakemake(work, "study_archive", "--profile", "profiles/local")
    assert proc.returncode == 0, proc.stderr[-2000:]
    archive = work / "results/tiny/archive/tiny.tar.gz"
    checksum = (work / "results/tiny/archive/tiny.tar.gz.sha256").read_text().split()[0]
    verify = [sys.executable, "-m", "dlscale.studyarchive", "verify"]
    ok = subprocess.run([*verify, str(archive)], capture_output=True, text=True, cwd=work)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path, filter="data")
    assert "dlscale-tiny/study-config.json" in names
    assert "dlscale-tiny/profiles/local/config.yaml" in names
    assert any("/measurements/" in n and n.endswith("/metrics.jsonl") for n in names)
    assert "dlscale-tiny/results/tiny/report/report.pdf" in names
    cell = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1/metrics.jsonl"
    with open(tmp_path / "dlscale-tiny" / cell, "a") as fh:
        fh.write("\n")
    bad = subprocess.run([*verify, str(tmp_path)], capture_output=True, text=True, cwd=work)
    assert bad.returncode == 1 and f"changed: {cell}" in bad.stdout, bad.stdout
    assert len(checksum) == 64


def test_lint_is_clean(root):
    proc = snakemake(root, "--lint")
    assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, (
        proc.stdout[-3000:] + proc.stderr[-3000:]
    )


def test_missing_latex_keeps_tables_and_figures(finished_study, tmp_path):
    """Without latexmk/pdflatex on PATH the report job fails with a clear message; the tables
    and figures (separate rules) are still built."""
    import os

    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):  # everything but TeX
        for tool in Path(folder).iterdir():
            if (
                "tex" not in tool.name
                and "latex" not in tool.name
                and not (fakebin / tool.name).exists()
            ):
                (fakebin / tool.name).symlink_to(tool)
    from conftest import BIN

    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{fakebin}")
    figures = finished_study / "results/tiny/figures/cpu/throughput.pdf"
    before = figures.stat().st_mtime
    proc = subprocess.run(
        [str(BIN / "snakemake"), "--profile", "profiles/local", "--forcerun", "collect"],
        cwd=finished_study,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "latexmk/pdflatex not found" in out, out[-3000:]
    assert figures.stat().st_mtime > before  # figures rebuilt
    assert (finished_study / "results/tiny/tables/cells.csv").stat().st_size > 0
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


def measured(work: Path) -> dict[str, str]:
    """Checksum of every metrics file of every study: each cell's current metrics.jsonl and
    every measurement kept in its measurements/ folder."""
    import hashlib

    return {
        str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (work / "results").rglob("metrics.jsonl")
    }


def kept(checksums: dict[str, str]) -> set[tuple[str, str]]:
    return {(path, digest) for path, digest in checksums.items() if "/measurements/" in path}


def test_studies_side_by_side_and_nothing_measured_is_lost(tmp_path, tiny_config):
    """Issue 20: two studies with the same cells in one checkout, a changed launcher and step
    count that stop the run, an explicit re-measure and a --forcerun that keep the old files."""
    import pandas as pd

    work = copy_workflow(tmp_path, tiny_config)
    assert snakemake(work, "--profile", "profiles/local").returncode == 0
    first = measured(work)
    cell = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    assert cell in first and len(first) == 4  # 2 cells: metrics.jsonl + its measurement

    # a second study with the same axes (other batch and steps): its own folder, its own report
    other = dict(copy.deepcopy(tiny_config), study="tiny-b", per_rank_batch=4, steps=2)
    (work / "other.yaml").write_text(__import__("yaml").safe_dump(other))
    proc = snakemake(work, "--profile", "profiles/local", "--configfile", "other.yaml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = measured(work)
    assert {k: both[k] for k in first} == first  # the first study untouched
    for study, batch in (("tiny", 8), ("tiny-b", 4)):
        cells = pd.read_csv(work / f"results/{study}/tables/cells.csv")
        assert set(cells["study"]) == {study} and set(cells["per_rank_batch"]) == {batch}
        assert (work / f"results/{study}/report/report.pdf").stat().st_size > 0

    # another launcher or step count for measured cells: a clear stop, nothing removed
    for change, field in (("launcher=srun", "launcher"), ("steps=2", "steps")):
        for flags in ((), ("-n",)):
            proc = snakemake(work, "--profile", "profiles/local", *flags, "--config", change)
            out = proc.stdout + proc.stderr
            assert proc.returncode != 0, out[-3000:]
            assert "2 measured cell(s)" in out and f"differing: {field}" in out, out[-3000:]
            assert cell in out and "--config remeasure=True" in out
            assert measured(work) == both

    # an explicit re-measure: new measurements, the earlier ones kept beside them
    proc = snakemake(work, "--profile", "profiles/local", "--config", "steps=2", "remeasure=True")
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = measured(work)
    assert kept(both) <= kept(after)  # every old file, unchanged
    assert len(kept(after)) == len(kept(both)) + 2 and after[cell] != both[cell]
    records = [__import__("json").loads(line) for line in (work / cell).read_text().splitlines()]
    assert records[0]["value"]["cell"]["steps"] == 2
    cells = pd.read_csv(work / "results/tiny/tables/cells.csv")
    assert set(cells["earlier_measurements"]) == {1}

    # --forcerun of one cell (the documented re-measure of a single cell) keeps the old one too
    proc = snakemake(work, "--profile", "profiles/local", "--config", "steps=2", "--forcerun", cell)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert kept(after) <= kept(measured(work))
    assert len(list((work / cell).parent.glob("measurements/*/metrics.jsonl"))) == 3
    if shutil.which("pdftotext"):
        text = " ".join(
            subprocess.run(
                ["pdftotext", str(work / "results/tiny/report/report.pdf"), "-"],
                capture_output=True,
                text=True,
            ).stdout.split()
        )
        assert "3 earlier measurement(s) of 2 re-measured cell(s)" in text, text[-2000:]


HOSTILE_RUNS = {
    # a study file that is a YTE template (Python code) is refused, its code never runs
    "yte-study-file": (
        {
            "yte.yaml": '__use_yte__: true\n?if __import__("pathlib").Path("PWNED").touch():\n'
            "  steps: 5\n"
        },
        ["-n", "--config", "study_file=yte.yaml"],
        "__use_yte__: a study file is plain YAML",
    ),
    # --config replaced the profile's launcher: a real run stops before the first job
    "launcher-without-allocation": (
        {},
        ["--config", "launcher=srun"],
        "executor is 'local' but launcher is 'srun'",
    ),
    # a hardware file that is a FIFO never hangs the run
    "hardware-fifo": ({}, ["-n", "--config", "hardware_file=fifo.yaml"], "is a FIFO"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_RUNS))
def test_hostile_input_stops_the_workflow_and_touches_nothing(tmp_path, tiny_config, case):
    """Issue 17, through Snakemake: a clear error, no traceback, no code run, results/ intact."""
    import hashlib
    import os

    files, args, fragment = HOSTILE_RUNS[case]
    work = copy_workflow(tmp_path, tiny_config)
    for name, text in files.items():
        (work / name).write_text(text)
    os.mkfifo(work / "fifo.yaml")
    kept = work / "results" / "tiny" / "runs" / "kept.jsonl"
    kept.parent.mkdir(parents=True)
    kept.write_text('{"event": "run_start"}\n')

    def checksums():
        return {
            str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((work / "results").rglob("*"))
            if p.is_file()
        }

    before = checksums()
    proc = snakemake(work, "--profile", "profiles/local", *args, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and fragment in out, out[-3000:]
    assert "Traceback (most recent call last)" not in out, out[-3000:]
    assert not (work / "PWNED").exists()
    assert checksums() == before


def test_title_with_braces_and_specials_plans(tmp_path, tiny_config):
    """A title with `{word}` is not a wildcard (the report_tex param is a function)."""
    config = {**tiny_config, "report": {"title": "Study {word}: 100% & é"}}
    work = copy_workflow(tmp_path, config)
    proc = snakemake(work, "--profile", "profiles/local", "-n", "--forcerun", "report_tex")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
