"""Every command README.md and the quickstart show, run as printed against a tiny study,
does what the page says and loses no measurement, whatever the folders beside the study are
called; every command a message suggests, pasted as printed, acts on the same study.

`DOCUMENTED` maps each command the two pages show (read from them: a command added to a page
without an entry here fails `test_every_documented_command_is_run_or_left_out_with_a_reason`) to
the command as run here (placeholders filled in) and `LEFT_OUT` names the ones not run, with why.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from dlscale.study.cell import RESERVED_UNDER_RESULTS

from conftest import BIN, ROOT, copy_workflow, snakemake

pytestmark = pytest.mark.workflow

PAGES = ("README.md", "docs/pages/quickstart.md")
COMMAND_START = ("snakemake", "python -m ", "dlscale ", "mkdocs ", "bash scripts/")

# The tiny study (config/config.yaml of the copy) and a second, smaller one in a study file.
TINY = "tiny"
MINE = "mine"
MINE_FILE = "my-study.yaml"
CELL = f"results/{TINY}/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
ARCHIVE = f"results/{TINY}/archive/{TINY}.tar.gz"

# documented command -> the command as run here (None: exactly as documented)
DOCUMENTED: dict[str, str | None] = {
    "snakemake --profile profiles/local": None,
    "dlscale status results/<study>": f"dlscale status results/{TINY}",
    "snakemake --profile profiles/local -n": None,
    "snakemake --profile profiles/local --forcerun <the cell's metrics.jsonl>": (
        f"snakemake --profile profiles/local --forcerun {CELL}"
    ),
    "snakemake --profile profiles/local --forcerun results/demo/runs/cpu/pytorch/cnn_small/weak/"
    "fp32/eager/n2/r1/metrics.jsonl": f"snakemake --profile profiles/local --forcerun {CELL}",
    "snakemake --profile profiles/local --forcerun figure convergence_figure": None,
    "snakemake --profile profiles/local --forcerun report_inputs report_tex": None,
    "snakemake --profile profiles/local --config study_file=my-study.yaml": None,
    "snakemake --profile profiles/local --config remeasure=True": None,
    "snakemake --profile profiles/local --report results/<study>/report.zip": (
        f"snakemake --profile profiles/local --report results/{TINY}/report.zip"
    ),
    "snakemake --profile profiles/local check": None,
    "python -m dlscale.decisions.regression_check results/<study>": (
        f"python -m dlscale.decisions.regression_check results/{TINY}"
    ),
    "python -m dlscale.decisions.regression_check bless results/<study> --system cpu "
    "[--tolerance 0.05] [--dry-run]": (
        f"python -m dlscale.decisions.regression_check bless results/{TINY} --system cpu "
        "--tolerance 0.05 --dry-run"
    ),
    "python -m dlscale.decisions.compare results/<before> results/<after>": (
        f"python -m dlscale.decisions.compare results/{TINY} results/{MINE}"
    ),
    "dlscale compare A B": f"dlscale compare results/{TINY} results/{MINE}",
    "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local": (
        f"snakemake results/{TINY}/compare/{MINE}/summary.md --profile profiles/local"
    ),
    "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local "
    "--config study_file=my-study.yaml": (
        f"snakemake results/{MINE}/compare/{TINY}/summary.md --profile profiles/local "
        "--config study_file=my-study.yaml"
    ),
    "python -m dlscale.decisions.planner results/<study>": (
        f"python -m dlscale.decisions.planner results/{TINY}"
    ),
    "python -m dlscale.decisions.planner results/<study> [--job MODEL:SAMPLES ...] "
    "[--budget-node-hours B \\| --objective min_node_hours --deadline-hours D] [--out DIR]": (
        f"python -m dlscale.decisions.planner results/{TINY} --job cnn_small:1e6 "
        "--objective min_node_hours --deadline-hours 100 --out plan-out"
    ),
    "snakemake --profile profiles/local --forcerun scaling_model": None,
    "snakemake study_archive --profile profiles/local": None,
    "snakemake study_archive --profile profiles/local [--config study_file=my-study.yaml]": (
        "snakemake study_archive --profile profiles/local --config study_file=my-study.yaml"
    ),
    "python -m dlscale.store.study_archive create results/<study> "
    "[--config study_file=my-study.yaml]": (
        f"python -m dlscale.store.study_archive create results/{MINE} "
        "--config study_file=my-study.yaml"
    ),
    "python -m dlscale.store.study_archive verify results/<study>/archive/<study>.tar.gz": (
        f"python -m dlscale.store.study_archive verify {ARCHIVE}"
    ),
    "python -m dlscale.store.migrate": "python -m dlscale.store.migrate --dry-run",
    "mkdocs build --strict -f docs/mkdocs.yml": None,
}
LEFT_OUT = {
    "bash scripts/demo.sh": "the demo: this workflow on the 20-cell demo study (about 3 min; run "
    "by hand, benchmarks/README.md); the same commands run here on a tiny study, and the demo's "
    "plan is checked by a dry run",
    "bash scripts/test.sh": "the test command itself",
    "snakemake --profile profiles/slurm": "the Slurm profile: tests/slurm run it on the local "
    "Slurm cluster; its dry run is run here",
    **{
        slurm_form: "the Slurm form of a command that measures cells: it needs the local Slurm "
        "cluster (tests/slurm); its local form is run here"
        for slurm_form in (
            "snakemake --profile profiles/slurm -n",
            "snakemake --profile profiles/slurm --forcerun <the cell's metrics.jsonl>",
            "snakemake --profile profiles/slurm --forcerun <the cell's metrics.jsonl> "
            "--config launcher=srun",
            "snakemake --profile profiles/slurm --config study_file=my-study.yaml launcher=srun",
            "snakemake --profile profiles/slurm --config launcher=srun remeasure=True",
        )
    },
    "mkdocs serve -f docs/mkdocs.yml": "a web server that runs until stopped; its build is run",
}


def documented_commands() -> set[str]:
    """Every command the two pages show: the lines of their bash blocks and the inline code
    that starts like a command."""
    found = set()
    for page in PAGES:
        text = (ROOT / page).read_text()
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            found |= {ln.split("#")[0].strip() for ln in block.splitlines()} - {""}
        inline = re.sub(r"```.*?```", "", text, flags=re.S)
        found |= {s for s in re.findall(r"`([^`\n]+)`", inline) if s.startswith(COMMAND_START)}
    return found


def test_every_documented_command_is_run_or_left_out_with_a_reason():
    shown = documented_commands()
    assert len(shown) >= 25
    assert shown == set(DOCUMENTED) | set(LEFT_OUT), (
        f"documented, not here: {sorted(shown - set(DOCUMENTED) - set(LEFT_OUT))}; "
        f"here, no longer documented: {sorted((set(DOCUMENTED) | set(LEFT_OUT)) - shown)}"
    )


def run(work: Path, command: str) -> subprocess.CompletedProcess:
    """A command as a user types it in the checkout, with the venv first on PATH."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(
        shlex.split(command), cwd=work, env=env, capture_output=True, text=True, timeout=600
    )


def ok(work: Path, documented: str) -> str:
    """Run a documented command as DOCUMENTED says; its output, after asserting exit 0."""
    proc = run(work, DOCUMENTED[documented] or documented)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{documented}:\n{out[-3000:]}"
    return out


def measured_files(work: Path) -> dict[str, str]:
    """Every metrics file under results/ (current links and kept measurements) -> sha256."""
    return {
        str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in (work / "results").rglob("metrics.jsonl")
    }


def kept_measurements(files: dict[str, str]) -> dict[str, str]:
    """The kept measurements among metrics files (the current link of a re-measured cell
    changes; every measurement it pointed at stays, unchanged)."""
    return {path: digest for path, digest in files.items() if "/measurements/" in path}


def plant(work: Path, name: str) -> None:
    """A study folder named `name` from before the name was reserved, or named like the
    project's own folders: a copy of the tiny study's measured cells."""
    shutil.copytree(work / f"results/{TINY}/runs", work / f"results/{name}/runs", symlinks=True)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """A checkout whose config/config.yaml is the tiny study (2 throughput cells) with its
    docs, a second study file (1 cell), and the tiny study measured to its report."""
    tiny = yaml.safe_load((ROOT / "tests/fixtures/tiny.yaml").read_text())
    tiny = dict(tiny, workloads=["throughput"])
    work = copy_workflow(tmp_path_factory.mktemp("documented"), tiny)
    shutil.copytree(ROOT / "docs", work / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    (work / "benchmarks").mkdir()
    shutil.copy2(ROOT / "benchmarks/README.md", work / "benchmarks/README.md")
    mine = dict(tiny, study=MINE, axes=dict(tiny["axes"], nodes=[1]))
    (work / MINE_FILE).write_text(yaml.safe_dump(mine))
    proc = snakemake(work, "--profile", "profiles/local")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work


def test_the_demo_plan_is_what_the_quickstart_says(tmp_path):
    """The shipped demo study, dry run in a fresh checkout: 16 train_* + 4 converge_* jobs are
    its 20 cells, and it draws 8 throughput and 3 convergence figure files (11)."""
    work = copy_workflow(tmp_path)
    out = snakemake(work, "--profile", "profiles/local", "-n").stdout
    counts = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], re.M)
    }
    cells = sum(v for k, v in counts.items() if k.startswith(("train_", "converge_")))
    assert cells == 20 and sum(v for k, v in counts.items() if k.startswith("train_")) == 16
    assert (counts["figure"], counts["convergence_figure"]) == (8, 3)


def test_documented_commands_lose_no_measurement_beside_reserved_looking_studies(
    measured, tmp_path
):
    """Every documented command that writes under results/, run in a checkout whose results/
    also holds study folders named like the project's own (legacy ones with reserved names, and
    allowed look-alikes); every metrics file survives, and each command's named outputs exist."""
    work = tmp_path / "w"
    shutil.copytree(measured, work, symlinks=True)
    beside = ["data", "logs", "runs", "tables", "figures", "report", "site-2", "Data2", "demo.bak"]
    for name in beside:
        plant(work, name)
    before = measured_files(work)
    assert len(before) == 4 * (1 + len(beside))  # 2 cells x (link + measurement) per study

    # the study, already measured: nothing to do; its status
    assert "Nothing to be done" in ok(work, "snakemake --profile profiles/local")
    assert "2 cells: 2 measured" in ok(work, "dlscale status results/<study>")
    # one cell re-measured: a second measurement beside the first
    ok(work, "snakemake --profile profiles/local --forcerun <the cell's metrics.jsonl>")
    assert len(list((work / CELL).parent.glob("measurements/*/metrics.jsonl"))) == 2
    figure = work / f"results/{TINY}/figures/cpu/throughput.pdf"
    stamp = figure.stat().st_mtime_ns
    ok(work, "snakemake --profile profiles/local --forcerun figure convergence_figure")
    assert figure.stat().st_mtime_ns > stamp
    ok(work, "snakemake --profile profiles/local --forcerun report_inputs report_tex")
    assert (work / f"results/{TINY}/report/report.pdf").stat().st_size > 0
    # a second study beside the first, from a study file
    ok(work, "snakemake --profile profiles/local --config study_file=my-study.yaml")
    assert (work / f"results/{MINE}/report/report.pdf").is_file()
    # nothing changed: remeasure=True re-measures nothing
    ok(work, "snakemake --profile profiles/local --config remeasure=True")
    assert len(list((work / CELL).parent.glob("measurements/*/metrics.jsonl"))) == 2
    ok(work, "snakemake --profile profiles/local --report results/<study>/report.zip")
    assert (work / f"results/{TINY}/report.zip").stat().st_size > 0
    # the check: no references yet, it says why and how to record them
    out = ok(work, "snakemake --profile profiles/local check")
    assert f"regression_check bless results/{TINY} --system cpu" in out
    ok(work, "python -m dlscale.decisions.regression_check results/<study>")
    bless = (
        "python -m dlscale.decisions.regression_check bless results/<study> --system cpu "
        "[--tolerance 0.05] [--dry-run]"
    )
    assert "cpu" in ok(work, bless)
    for documented, after, before_ in (
        ("python -m dlscale.decisions.compare results/<before> results/<after>", MINE, TINY),
        ("dlscale compare A B", MINE, TINY),
        (
            "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local",
            TINY,
            MINE,
        ),
        (
            "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local "
            "--config study_file=my-study.yaml",
            MINE,
            TINY,
        ),
    ):
        ok(work, documented)
        for name in ("compare.csv", "summary.md", "summary.tex", "ratios.pdf"):
            assert (work / f"results/{after}/compare/{before_}/{name}").is_file(), documented
    assert "solved in" in ok(work, "python -m dlscale.decisions.planner results/<study>")
    ok(
        work,
        "python -m dlscale.decisions.planner results/<study> [--job MODEL:SAMPLES ...] "
        "[--budget-node-hours B \\| --objective min_node_hours --deadline-hours D] [--out DIR]",
    )
    assert (work / "plan-out/plan.csv").is_file()
    ok(work, "snakemake --profile profiles/local --forcerun scaling_model")
    # archives: the workflow's and the command line's of one study are the same bytes
    ok(work, "snakemake study_archive --profile profiles/local")
    assert (work / f"{ARCHIVE}.sha256").is_file()
    ok(work, "snakemake study_archive --profile profiles/local [--config study_file=my-study.yaml]")
    mine_archive = work / f"results/{MINE}/archive/{MINE}.tar.gz"
    workflow_made = mine_archive.read_bytes()
    ok(
        work,
        "python -m dlscale.store.study_archive create results/<study> "
        "[--config study_file=my-study.yaml]",
    )
    assert mine_archive.read_bytes() == workflow_made
    with tarfile.open(mine_archive) as tar:
        names = tar.getnames()
    assert {f"dlscale-{MINE}/{n}" for n in ("config/config.yaml", MINE_FILE)} <= set(names)
    assert "every file matches" in ok(
        work, "python -m dlscale.store.study_archive verify results/<study>/archive/<study>.tar.gz"
    )
    ok(work, "python -m dlscale.store.migrate")
    ok(work, "mkdocs build --strict -f docs/mkdocs.yml")
    assert (work / "results/site/index.html").is_file()

    after = measured_files(work)
    assert set(before) <= set(after)  # every metrics file is still there
    assert kept_measurements(before).items() <= after.items()  # every measurement unchanged
    assert {p: d for p, d in before.items() if p != CELL}.items() <= after.items()

    # legacy studies named like the docs site and Snakemake's report at its earlier path: the
    # docs build refuses to empty the site folder, a report sent there cannot replace the
    # folder; nothing is lost
    for name in ("site", "report.zip"):
        plant(work, name)
    before = measured_files(work)
    proc = run(work, "mkdocs build --strict -f docs/mkdocs.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "holds a study's measurements" in out, out[-2000:]
    proc = run(work, "snakemake --profile profiles/local --report results/report.zip")
    assert proc.returncode != 0
    assert measured_files(work) == before


def test_a_reserved_study_name_is_refused_before_anything_is_planned(measured, tmp_path):
    """`study: Site` or `report.zip` (any letter case): refused at parse time, naming the list;
    a legacy folder of a reserved name is told how to keep its measurements."""
    work = tmp_path / "w"
    shutil.copytree(measured, work, symlinks=True)
    plant(work, "site")
    before = measured_files(work)
    for name in ("Site", "report.zip"):
        proc = snakemake(work, "--profile", "profiles/local", "-n", "--config", f"study={name}")
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0 and f"study: {name!r} cannot name a study" in out, out
        assert all(reserved in out for reserved in RESERVED_UNDER_RESULTS)
    proc = snakemake(work, "--profile", "profiles/local", "-n", "--config", "study=site")
    out = proc.stdout + proc.stderr
    assert "`mv results/site results/site-study`" in out, out[-2000:]
    assert measured_files(work) == before


def printed_command(output: str) -> str:
    """The command a message prints on its own line, indented under its text."""
    (line,) = [ln.strip() for ln in output.splitlines() if ln.startswith("  snakemake ")]
    return line


def test_suggested_commands_act_on_the_same_study(measured, tmp_path):
    """The messages' commands, pasted as printed, act on the study the user named: a second
    --config (which Snakemake drops) is refused with the merged command; a changed study file
    stops with the command that re-measures that study; a Slurm dry run with the wrong launcher
    stops with the command that plans the same study's cells for srun."""
    work = tmp_path / "w"
    shutil.copytree(measured, work, symlinks=True)
    tiny_before = {p: d for p, d in measured_files(work).items() if f"/{TINY}/" in p}

    # the Slurm profile's dry run of the study file without launcher=srun (nothing measured yet)
    slurm = f"snakemake --profile profiles/slurm --config study_file={MINE_FILE} -n"
    proc = run(work, slurm)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "launcher is 'local'" in out, out[-2000:]
    fixed = printed_command(out)
    assert fixed == (
        f"snakemake --profile profiles/slurm -n --config study_file={MINE_FILE} launcher=srun"
    )
    proc = run(work, fixed)  # pasted as printed: the same study's cells, for srun
    assert proc.returncode == 0, proc.stderr[-3000:]
    planned = re.findall(r"output: (results/[^/]+)/runs/", proc.stdout)
    assert planned and set(planned) == {f"results/{MINE}"}

    typed = f"snakemake --profile profiles/local --config study_file={MINE_FILE}"
    assert run(work, typed).returncode == 0
    study = yaml.safe_load((work / MINE_FILE).read_text())
    (work / MINE_FILE).write_text(yaml.safe_dump(dict(study, steps=2)))

    # a second --config: Snakemake would drop the study file; refused with the merged command
    proc = run(work, f"{typed} --config remeasure=True")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "--config was given 2 times" in out, out[-2000:]
    merged = printed_command(out)
    assert merged == f"{typed} remeasure=True"

    # the changed study file: stopped, with the command that re-measures this study
    proc = run(work, typed)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "differing: steps" in out, out[-2000:]
    remeasure = printed_command(out)
    assert remeasure == merged
    proc = run(work, remeasure)  # pasted as printed
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = sorted((work / f"results/{MINE}").rglob("measurements/*/metrics.jsonl"))
    assert len(kept) == 2  # the cell's first measurement and its re-measurement
    assert '"steps": 2' in kept[-1].read_text().splitlines()[0]
    assert '"steps": 3' in kept[0].read_text().splitlines()[0]
    assert {p: d for p, d in measured_files(work).items() if f"/{TINY}/" in p} == tiny_before
