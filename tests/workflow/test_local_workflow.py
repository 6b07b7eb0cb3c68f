"""The workflow end to end on the embedded default (local profile), run as a user runs it. Its
refusals of bad input before any job: tests/workflow/test_refusals.py."""

from __future__ import annotations

import copy
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale.outputs.figure_layout import CONVERGENCE_FAMILIES, FAMILIES
from dlscale.study.cell import MEASUREMENTS_DIR, METRICS_FILE
from dlscale.study.matrix import load_workflow_study

from helpers.checkout import BIN, ROOT, copy_workflow, path_without_tex, snakemake, tiny_study

pytestmark = pytest.mark.workflow


def pdf_text(pdf: Path) -> str:
    """The PDF's text by pdftotext (poppler-utils, which scripts/setup.sh installs): a missing
    tool fails the test, never drops its assertions."""
    tool = shutil.which("pdftotext")
    assert tool, "pdftotext not found: scripts/setup.sh installs poppler-utils"
    return subprocess.run([tool, str(pdf), "-"], capture_output=True, text=True, check=True).stdout


def job_counts(dry_run_stdout: str) -> dict[str, int]:
    table = dry_run_stdout.split("Job stats:")[1].split("total")[0]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture(scope="module")
def finished_study(tmp_path_factory):
    """The tiny study (2 cells) run once to the PDF; shared by the tests below."""
    return tiny_study(tmp_path_factory.mktemp("study"), "profiles/local")


def test_dry_run_shows_product_minus_exclusions(tmp_path, base_config):
    config = copy.deepcopy(base_config)
    config["exclude"] = [{"model": "gpt2_tiny", "policy": "strong"}]
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


def test_a_dry_run_writes_nothing_and_a_run_adopts_old_measurements_first(tmp_path, base_config):
    """A metrics file from before measurement folders existed: a dry run leaves it as it is
    (Snakemake parses before it knows the run is a dry one: the adoption is an `onstart`
    step); the next real run gives it its folder (a hard link) before any job runs."""
    work = copy_workflow(tmp_path, base_config)
    cell = load_workflow_study({}, work).cells[0]
    plain = work / cell.path
    plain.parent.mkdir(parents=True)
    plain.write_text("{}\n")
    proc = snakemake(work, "--profile", "profiles/local", "-n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p for p in (work / "results").rglob("*") if p.is_file()] == [plain]
    proc = snakemake(work, "--profile", "profiles/local", "results/data/digits/cifar_binary")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (kept,) = (plain.parent / MEASUREMENTS_DIR).glob(f"*/{METRICS_FILE}")
    assert kept.samefile(plain) and plain.read_text() == "{}\n"


def test_tiny_study_reaches_the_pdf(finished_study):
    work = finished_study
    for path in (
        [
            "results/tiny/tables/ranks.csv",
            "results/tiny/tables/cells.csv",
            "results/tiny/tables/scaling.csv",
            "results/tiny/report/macros.tex",
            "results/tiny/report/report.pdf",
            "results/tiny/tables/model_fit.csv",
            "results/tiny/tables/predictions.csv",
            "results/tiny/plan/plan.csv",
            "results/tiny/plan/plan.pdf",
        ]
        + [
            f"results/tiny/figures/cpu/{f}.pdf"
            for f in ("throughput", "speedup", "efficiency", "frameworks", "breakdown")
        ]
        + [
            f"results/tiny/figures/cpu/convergence/{f}.pdf"
            for f in ("time_to_accuracy", "epochs_to_accuracy", "accuracy_curves")
        ]
        + [f"results/tiny/tables/{t}.csv" for t in ("convergence", "epochs", "time_to_accuracy")]
    ):
        assert (work / path).stat().st_size > 0, path
    import pandas as pd

    ranks = pd.read_csv(work / "results/tiny/tables/ranks.csv")
    assert sorted(ranks.groupby("nodes")["rank"].count().items()) == [(1, 1), (2, 2)]
    cells = pd.read_csv(work / "results/tiny/tables/cells.csv").set_index("nodes")
    assert set(cells["workload"]) == {"throughput"}  # convergence cells have their own tables
    conv = pd.read_csv(work / "results/tiny/tables/convergence.csv").set_index("nodes")
    assert conv["reached"].all() and (conv["epochs_to_accuracy"] <= 2).all()
    assert list(conv["global_batch"]) == [16, 32] and list(conv["lr_rule"]) == ["linear"] * 2
    assert conv.loc[2, "effective_learning_rate"] == pytest.approx(0.1)  # 0.05 x 32 / 16
    # every rank's loader alone measured after training: the shipped digits feed cnn_small
    # with room to spare (the target: >= 3x), so no cell is input-bound
    assert (conv["loader_train_ratio"] >= 3).all() and not conv["input_bound"].any()
    assert conv["stage_dir"].isna().all()  # the local hardware entry stages nothing
    status = pd.read_csv(work / "results/tiny/tables/status.csv")
    assert len(status) == 4 and (status["status"] == "ok").all()
    assert cells.loc[1, "speedup"] == pytest.approx(1.0)
    assert cells.loc[2, "scaling_efficiency"] == pytest.approx(
        cells.loc[2, "throughput_samples_per_s"] / cells.loc[1, "throughput_samples_per_s"] / 2
    )
    text = pdf_text(work / "results/tiny/report/report.pdf")
    assert "Figure 5" in text and "Cells" in text and "tiny" in text
    words = " ".join(text.split())
    assert "Throughput (synthetic data)" in words and "Time to accuracy (real data)" in words
    assert "Excluded: process start-up" in words and "not reached (0 of 2 cells" in words
    assert "Input pipeline. After the last epoch each rank iterates" in words
    assert "input-bound (below 3): 0 of 2 cells (none)" in words
    assert "The ranks read the dataset in place" in words and "Loader / train" in words
    assert "95% nonparametric order-statistic CI" in text
    assert "cells.csv, is attached to this PDF: 2 rows" in " ".join(text.split())
    # the planner's section: numbers from its macros; a 2-node-count series is not validated
    words = " ".join(text.split())
    assert "Recommendations" in words and "too short to validate" in words
    # a CPU study's telemetry caption says what its figure shows, no GPU rule (the site file's
    # device reaches the figure layout)
    assert "CPU utilisation (% of one core)" in words and "NVML" not in words
    assert "The plan below is the exact optimum" in words and "predicted" in words
    plan = pd.read_csv(work / "results/tiny/plan/plan.csv")
    assert list(plan["job"]) == ["cnn_small"] and plan.loc[0, "hardware"] == "cpu"
    preds = pd.read_csv(work / "results/tiny/tables/predictions.csv")
    # measured at 1 and 2 nodes, not validated: predicted to 2 x 2 nodes at most, saying so
    assert preds["extrapolated"].any() and set(preds["nodes"]) == {1, 2, 4}
    assert not preds["validated"].any() and preds["model_error"].isna().all()
    assert preds["interval_spans"].str.contains("not validated: too short").all()
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
    # one figure rule: a job per figure file (every family on the demo's one hardware key)
    assert counts == {
        "collect": 1,
        "scaling_model": 1,
        "plan": 1,
        "figure": len(FAMILIES),
        "convergence_figure": 3,  # the tables they read are rewritten
        "report_inputs": 1,
        "verdicts": 1,
        "history": 1,  # it records the re-measured cell and judges it against its history
        "report_pdf": 1,
        "all": 1,
    }
    assert cell in proc.stdout


def test_regenerating_figures_touches_no_cell(finished_study):
    proc = snakemake(finished_study, "--profile", "profiles/local", "-n", "--forcerun", "figure")
    counts = job_counts(proc.stdout)
    assert not any(k.startswith("train") for k in counts) and "collect" not in counts
    assert counts["figure"] == len(FAMILIES) and counts["report_pdf"] == 1


def test_everything_up_to_date_runs_nothing(finished_study):
    proc = snakemake(finished_study, "--profile", "profiles/local", "-n")
    assert proc.returncode == 0
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_the_driver_recorded_each_measured_cell_in_the_results_database(finished_study):
    """The default results database (results/dlscale.sqlite, WAL): the driver wrote each of
    the tiny study's 4 measurements once, as it landed (its log says how long a row took); the
    history job found no earlier run (no History section) and nothing waits for the next run."""
    from dlscale.store import database as store

    results = finished_study / "results"
    db = store.connect(f"sqlite:///{results / store.DATABASE_FILE}")
    try:
        on_disk = store.measurements_on_disk(results / "tiny")
        assert store.counts(db)["measurements"] == len(on_disk) == 4
        assert store.integrity_problems(db) == [] and db.journal == "wal"
    finally:
        db.close()
    log = (results / "tiny" / "logs" / "driver.log").read_text()
    assert re.search(r"results database \S+: \d+ row\(s\) written; per landed cell", log), log
    history = (results / "tiny" / "report" / "history.tex").read_text()
    assert history.startswith("% No History section")
    assert not store.pending_path(results / "tiny").exists()


def test_a_copied_checkout_of_a_finished_study_redoes_no_history(finished_study, tmp_path):
    """The same checkout in another folder (files and times copied, Snakemake's records too)
    is the same study with the same default database (results/dlscale.sqlite, named relative
    to the working directory in the history rule's params): its dry run plans no history job.
    Another database still redoes the history."""
    copied = tmp_path / "copied"
    shutil.copytree(finished_study, copied, symlinks=True)
    proc = snakemake(copied, "--profile", "profiles/local", "-n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    planned = job_counts(proc.stdout) if "Job stats:" in proc.stdout else {}
    assert "history" not in planned, proc.stdout[-3000:]
    other = f"database=sqlite:///{tmp_path / 'team.sqlite'}"
    proc = snakemake(copied, "--profile", "profiles/local", "-n", "--config", other)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert job_counts(proc.stdout).get("history") == 1, proc.stdout[-3000:]


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
    text = pdf_text(work / "results/tiny/report/report.pdf")
    assert "Systems" in text and "MLPerf" in text and "host_processor_model_name" in text

    proc = snakemake(work, "study_archive", "--profile", "profiles/local")
    assert proc.returncode == 0, proc.stderr[-2000:]
    archive = work / "results/tiny/archive/tiny.tar.gz"
    checksum = (work / "results/tiny/archive/tiny.tar.gz.sha256").read_text().split()[0]
    verify = [sys.executable, "-m", "dlscale.store.study_archive", "verify"]
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


NO_TEX = "dlscale: TeX not found on PATH"


def test_without_tex_all_but_the_pdf_is_built_and_said_first(finished_study, tmp_path):
    """Without latexmk/pdflatex on PATH (a login node) the run succeeds: tables,
    figures and the report's sources are built, no PDF job runs, and one notice before the
    first job names the command that builds the PDF, which does so where TeX is."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{path_without_tex(tmp_path / 'bin')}")
    report = finished_study / "results/tiny/report"
    figures = finished_study / "results/tiny/figures/cpu/throughput.pdf"
    before = {f: f.stat().st_mtime for f in (figures, report / "macros.tex", report / "report.pdf")}
    proc = subprocess.run(
        [str(BIN / "snakemake"), "--profile", "profiles/local", "--forcerun", "collect"],
        cwd=finished_study,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    first_job = re.search(r"^(local)?rule \w+:", proc.stderr, re.M)
    assert out.count(NO_TEX) == 1 and proc.stderr.index(NO_TEX) < first_job.start(), out[-3000:]
    assert "report_pdf" not in out
    after = {f: f.stat().st_mtime for f in before}
    # figures and the report's sources rebuilt (report.tex depends on its template alone)
    assert after[figures] > before[figures] and (report / "report.tex").is_file()
    assert after[report / "macros.tex"] > before[report / "macros.tex"]
    assert after[report / "report.pdf"] == before[report / "report.pdf"]  # left as it was
    assert (finished_study / "results/tiny/tables/cells.csv").stat().st_size > 0
    command = proc.stderr[proc.stderr.index(NO_TEX) :].splitlines()[1].strip()
    assert command == "snakemake results/tiny/report/report.pdf --profile profiles/local"
    # where TeX is, the command as printed builds the PDF
    built = subprocess.run(
        shlex.split(command),
        cwd=finished_study,
        env=dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert NO_TEX not in built.stderr and "report_pdf" in built.stderr
    assert (report / "report.pdf").stat().st_mtime > before[report / "report.pdf"]


def test_missing_framework_environment_is_an_early_error(tmp_path, tiny_config):
    config = copy.deepcopy(tiny_config)
    config["axes"]["framework"] = ["pytorch", "mxnet"]
    work = copy_workflow(tmp_path, config)
    if (work / ".venvs").is_symlink():
        (work / ".venvs").unlink()
    proc = snakemake(work, "--profile", "profiles/local", "-n")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    # dlscale.workflow.capability, at parse time: the cells, the missing folder and the command
    assert "2 cell(s) (results/tiny/runs/cpu/mxnet/cnn_small/" in out, out[-2000:]
    assert "of mxnet run in .venvs/mxnet, which does not exist" in out
    assert "build it with: bash scripts/setup.sh mxnet" in out
    assert "No job was started." in out
    # the environments where DLSCALE_ENVS_DIR says (a login node without TeX): found
    # there, and the plan has every job but the PDF's
    env = {
        **os.environ,
        "DLSCALE_ENVS_DIR": str(ROOT / ".venvs"),
        "PATH": f"{BIN}{os.pathsep}{path_without_tex(tmp_path / 'bin')}",
    }
    proc = subprocess.run(
        [str(BIN / "snakemake"), "--profile", "profiles/local", "-n"],
        cwd=work, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = job_counts(proc.stdout)
    assert counts["train_cpu_n1"] == 2 and counts["report_tex"] == 1 and "report_pdf" not in counts
    assert proc.stderr.count(NO_TEX) == 1
    assert f"{ROOT}/.venvs/mxnet/bin/python -m dlscale.run.launch" in proc.stdout


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
    """Two studies with the same cells in one checkout, a changed launcher and step
    count that stop the run, an explicit re-measure and a --forcerun that keep the old files."""
    import pandas as pd

    tiny_config = dict(tiny_config, workloads=["throughput"])  # the 2 throughput cells only
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

    # another step count for measured cells: a clear stop naming the command that re-measures
    # them (this one, remeasure=True in its --config), nothing removed; a launcher the local
    # executor cannot run (srun outside an allocation) is refused before the cells are compared
    for flags in ((), ("-n",)):
        proc = snakemake(work, "--profile", "profiles/local", *flags, "--config", "steps=2")
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0, out[-3000:]
        assert "2 measured cell(s)" in out and "differing: steps" in out, out[-3000:]
        again = shlex.join(["snakemake", "--profile", "profiles/local", *flags, "--config"])
        assert cell in out and f"{again} steps=2 remeasure=True\n" in out, out[-3000:]
        proc = snakemake(work, "--profile", "profiles/local", *flags, "--config", "launcher=srun")
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and "outside any Slurm allocation" in out, out[-3000:]
        assert f"{again} launcher=local\n" in out and "measured cell(s)" not in out
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
    text = " ".join(pdf_text(work / "results/tiny/report/report.pdf").split())
    assert "3 earlier measurement(s) of 2 re-measured cell(s)" in text, text[-2000:]


def test_title_with_braces_and_specials_plans(tmp_path, tiny_config):
    """A title with `{word}` is not a wildcard (the report_tex param is a function)."""
    config = {**tiny_config, "report": {"title": "Study {word}: 100% & é"}}
    work = copy_workflow(tmp_path, config)
    proc = snakemake(work, "--profile", "profiles/local", "-n", "--forcerun", "report_tex")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


# ---- Snakemake's report, regression verdicts, study comparison ---------------------------------


def test_snakemake_report_holds_every_figure_and_table_of_the_pdf(finished_study):
    import zipfile

    work = finished_study
    proc = snakemake(work, "--profile", "profiles/local", "--report", "results/report.zip")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    study = work / "results/tiny"
    tex = (study / "report/report.tex").read_text()
    figures = re.findall(r"\\includegraphics\[[^]]*\]\{\.\./figures/([^}]+)\}", tex)
    # every throughput family and every convergence family (one file each in the tiny study)
    assert len(figures) == len(FAMILIES) + len(CONVERGENCE_FAMILIES)
    # the PDF's tables come from these (cells.csv is attached to it; verdicts: Regression check)
    tables = ["cells", "scaling", "status", "quarantine", "systems", "verdicts", "ranks"]
    tables += ["convergence", "epochs", "time_to_accuracy"]
    wanted = {
        **{f"figures/{f}": study / "figures" / f for f in figures},
        **{f"tables/{t}.csv": study / "tables" / f"{t}.csv" for t in tables},
        "report/report.pdf": study / "report/report.pdf",
    }
    with zipfile.ZipFile(work / "results/report.zip") as z:
        data = {n: z.read(n) for n in z.namelist() if "/data/raw/" in n}
        html = z.read("report/report.html").decode()
    by_name = {}
    for name, content in data.items():
        by_name.setdefault(name.rsplit("/", 1)[1], []).append(content)
    for what, path in wanted.items():
        assert path.read_bytes() in by_name.get(path.name, []), f"{what} is not in the report"
    assert len(data) == len(wanted)
    for text in (
        "throughput figures",  # category: figure family, subcategory: hardware
        "hardware cpu",
        "cnn_small",  # a label: the axis values a figure shows
        "Regression check",
        "Per-cell status",  # captions from report/
        "Training throughput (samples/s summed over all ranks)",  # the layout's caption
        "time_to_accuracy figures",
        "Time to accuracy (real data)",
    ):
        assert text in html, text


def _cli(capsys, main, *args) -> tuple[int, str]:
    """A dlscale command line run in this process (no interpreter start): exit code, stdout."""
    capsys.readouterr()
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def _slower(metrics_path: Path, factor: float) -> None:
    """A measured cell's metrics with every throughput scaled (its ranks' and its own)."""
    import json

    records = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    for rec in records:
        if rec["event"] in ("rank_end", "summary"):
            value = rec["value"]
            for key in list(value):
                if key.startswith("throughput") or key.startswith("rank_throughput"):
                    value[key] *= factor
    metrics_path.unlink()  # a hard link to its measurement: never edit that one
    metrics_path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_check_passes_on_the_study_and_fails_on_a_doctored_copy(finished_study, tmp_path, capsys):
    """References blessed from the study (+-5 %): the study passes (exit 0); a copy whose n2
    cell is 10 % slower fails exactly there (exit 1). Then the workflow's check target: exit 1
    on a FAIL, with no partial build."""
    import pandas as pd
    import yaml

    from dlscale.analysis.collect import write_tables
    from dlscale.decisions.regression_check import main as check

    work = finished_study
    study = work / "results/tiny"
    references = tmp_path / "references.yaml"
    references.write_text("# test references\nreferences: {}\n")
    code, out = _cli(capsys, check, "bless", study, "--system", "cpu", "--references", references)
    assert code == 0, out
    assert out.count("\n+ cpu: pytorch/cnn_small/weak/fp32/eager/") == 3, out

    code, out = _cli(capsys, check, study, "--references", references)
    assert code == 0, out
    assert "verdicts: 3 PASS, 0 FAIL, 0 not-measured, 0 no-reference" in out

    doctored = tmp_path / "doctored"
    shutil.copytree(study, doctored / "results/tiny", symlinks=True)
    slow = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    _slower(doctored / slow, 0.9)
    t = "results/tiny/tables"
    cwd = Path.cwd()
    os.chdir(doctored)  # cells are read by their paths relative to the study's checkout
    try:
        write_tables(
            [slow, slow.replace("/n2/", "/n1/")],
            *(f"{t}/{n}.csv" for n in ("ranks", "cells", "scaling", "quarantine", "status")),
            straggler_threshold=0.1,
        )
    finally:
        os.chdir(cwd)
    code, out = _cli(capsys, check, doctored / "results/tiny", "--references", references)
    assert code == 1, out
    assert "verdicts: 1 PASS, 2 FAIL" in out and "2 FAIL verdict(s)" in out
    fails = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 2 and all("eager/n2" in line for line in fails), out
    assert all("-5.0 %" in line for line in fails)  # 10 % below a -5 % bound: margin -5 %

    # the workflow's check target with a reference 10 % above the measured n1 cell
    shipped = (work / "config/references.yaml").read_text()
    data = yaml.safe_load(references.read_text())
    cell = data["references"]["cpu"]["pytorch/cnn_small/weak/fp32/eager/n1"]
    cell["throughput_samples_per_s"]["value"] *= 1.1  # measured: 9 % below it
    try:
        (work / "config/references.yaml").write_text(yaml.safe_dump(data))
        proc = snakemake(work, "--profile", "profiles/local", "check")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-3000:]
        assert "1 FAIL verdict(s)" in out and "eager/n1" in out
        assert not (work / "results/tiny/partial").exists()  # a complete study: no partial build
        verdicts = pd.read_csv(work / "results/tiny/tables/verdicts.csv")
        assert sorted(verdicts["verdict"]) == ["FAIL", "PASS", "PASS"]
    finally:
        (work / "config/references.yaml").write_text(shipped)


def test_compare_itself_within_noise_and_a_slower_framework_flagged(
    finished_study, tmp_path, capsys
):
    """The compare rule on the study against itself: every ratio 1, within noise. The CLI on
    copies of its tables with a second framework, one framework 20 % slower in B and one cell in
    A only: exactly the slower framework's cells are flagged; the lone cell is listed."""
    import pandas as pd

    from dlscale.decisions.compare import main as compare

    work = finished_study
    proc = snakemake(work, "--profile", "profiles/local", "results/tiny/compare/tiny/summary.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    own = pd.read_csv(work / "results/tiny/compare/tiny/compare.csv")
    assert len(own) == 2 and (own["side"] == "both").all()
    assert (own["ratio"] == 1.0).all() and not own["beyond_noise"].any()
    assert set(own["difference"]) == {"within noise"}
    assert (work / "results/tiny/compare/tiny/ratios.pdf").stat().st_size > 0
    summary = (work / "results/tiny/compare/tiny/summary.md").read_text()
    assert "0 slower and 0 faster beyond noise, 2 within noise" in summary

    cells = pd.read_csv(work / "results/tiny/tables/cells.csv")
    # a second framework: the same real cells under another name (the tiny study has one)
    two = pd.concat([cells, cells.assign(framework="horovod")], ignore_index=True)
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        (folder / "tables").mkdir(parents=True)
        shutil.copy(work / "results/tiny/tables/systems.csv", folder / "tables")
    slower = two["framework"] == "pytorch"
    b_cells = two.copy()
    b_cells.loc[slower, "throughput_samples_per_s"] *= 0.8
    b_cells.loc[slower, "libraries"] = "numpy=2 torch=9.9"  # an upgrade, printed beside
    two.drop(index=3).to_csv(a / "tables/cells.csv", index=False)  # horovod n2 only in B
    b_cells.to_csv(b / "tables/cells.csv", index=False)
    code, out = _cli(capsys, compare, a, b, "--out", tmp_path / "out")
    assert code == 0, out
    table = pd.read_csv(tmp_path / "out/compare.csv")
    flagged = table[table["beyond_noise"]]
    assert sorted(flagged["cell"]) == [
        "pytorch/cnn_small/weak/fp32/eager/n1",
        "pytorch/cnn_small/weak/fp32/eager/n2",
    ]
    assert flagged["ratio"].tolist() == pytest.approx([0.8, 0.8])
    assert set(flagged["difference"]) == {"slower"}
    assert set(flagged["provenance_differs"]) == {"libraries"}
    assert table.loc[table["side"] == "only in B", "cell"].tolist() == [
        "horovod/cnn_small/weak/fp32/eager/n2"
    ]
    assert "2 slower and 0 faster beyond noise, 1 within noise" in out
    assert "only in B: cpu/horovod/cnn_small/weak/fp32/eager/n2" in out
    assert "| libraries |" in out  # provenance differences beside the ratios
    for name in ("summary.md", "summary.tex", "ratios.pdf"):
        assert (tmp_path / "out" / name).stat().st_size > 0


# the rules that measure cells or write their data: never part of the partial build
CELL_RULES = re.compile(r"^(train_|converge_|shipped_digits$|all$|partial$)")


def test_partial_build_runs_the_rules_of_the_full_build(tmp_path, tiny_config):
    """The partial report (onerror, results/<study>/partial/) is built by the same rules as the
    complete one, each as many times, and writes only under partial/: a dry run of `partial`
    with only the full build's rules downstream of the cells allowed (as the onerror handler
    allows them), on a study with no cell measured yet."""
    work = copy_workflow(tmp_path, tiny_config)
    full = snakemake(work, "--profile", "profiles/local", "-n")
    assert full.returncode == 0, full.stderr[-2000:]
    downstream = {k: v for k, v in job_counts(full.stdout).items() if not CELL_RULES.match(k)}
    assert {"collect", "scaling_model", "plan", "verdicts", "figure", "convergence_figure"} <= set(
        downstream
    )
    assert {"report_inputs", "report_tex", "report_pdf"} <= set(downstream)
    part = snakemake(
        work, "--profile", "profiles/local", "-n", "partial", "--allowed-rules", "partial",
        *downstream,
    )  # fmt: skip
    assert part.returncode == 0, part.stdout[-2000:] + part.stderr[-2000:]
    counts = job_counts(part.stdout)
    assert counts.pop("partial") == 1
    assert counts == downstream
    outputs = re.findall(r"^\s+(?:output|log): (.+)$", part.stdout, re.M)
    files = [f for line in outputs for f in line.split(", ")]
    assert files and all(f.startswith("results/tiny/partial/") for f in files), files


def test_failed_cell_gives_a_partial_report_by_the_same_rules(finished_study):
    """A cell that fails: its driver's onerror builds results/tiny/partial/ with the workflow's
    own rules (the scaling model, plan and verdicts included), the report titled incomplete and
    naming the failed cell; the complete outputs are left alone. The next run retries the cell,
    and its success removes the partial folder. (Last in this module: it re-measures a cell.)"""
    import csv

    work = finished_study
    victim = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    complete_pdf = work / "results/tiny/report/report.pdf"
    before = complete_pdf.stat().st_mtime
    env = dict(os.environ, DLSCALE_FAULT="eager/n2/r1:1:2:3")

    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [str(BIN / "snakemake"), victim, "--forcerun", victim, "--profile", "profiles/local"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "building the partial report with the workflow's own rules" in out, out[-3000:]
    assert "study incomplete: cells measured: 3 of 4; 1 failed, 0 missing" in out, out[-3000:]
    partial = work / "results/tiny/partial"
    assert (partial / "report/report.pdf").stat().st_size > 0, out[-3000:]
    log = (partial / "logs/snakemake.log").read_text()
    ran = job_counts(log)
    for rule in ("collect", "scaling_model", "plan", "verdicts", "figure", "report_pdf"):
        assert ran.get(rule), (rule, log[-3000:])
    assert not any(CELL_RULES.match(rule) for rule in ran if rule != "partial"), ran
    with open(partial / "tables/status.csv") as fh:
        rows = {row["metrics_path"]: row for row in csv.DictReader(fh)}
    assert rows[victim]["status"] == "failed" and rows[victim]["exit_code"] == "3"
    assert "eager/n2/r1 & failed" in (partial / "report/status_table.tex").read_text()
    tex = (partial / "report/report.tex").read_text()
    assert r"\title{Scaling study: tiny (incomplete)}" in tex
    assert (partial / "plan/plan.csv").is_file() and (partial / "tables/verdicts.csv").is_file()
    assert complete_pdf.stat().st_mtime == before  # the complete outputs: never overwritten
    # the next run retries the cell, rebuilds the complete outputs and drops the partial ones
    # (forced: the complete outputs from before the fault exist, and Snakemake does not rebuild
    # a missing input whose consumers are up to date)
    proc = snakemake(work, "--profile", "profiles/local", "--forcerun", victim)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (work / victim).is_file() and not partial.exists()
