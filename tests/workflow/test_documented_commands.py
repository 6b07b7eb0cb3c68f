"""The commands README.md and the quickstart show whose local form measures cells, run as
printed against a tiny study measured locally, do what the page says and lose no measurement,
whatever the folders beside the study are called; every command a message suggests, pasted as
printed, acts on the same study; the demo plans what the quickstart says, and a study plans only
what it names.

`DOCUMENTED` maps the commands run here to the command as run (placeholders filled in) and
`LEFT_OUT` names the others: every documented command but the demo, the test command and the
docs server is walked on a study measured on the local Slurm cluster by a plain user
(tests/workflow/test_login_node.py). A command added to a page without an entry in either fails
`test_every_documented_command_is_run_or_left_out_with_a_reason`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dlscale.study.results_layout import RESERVED_UNDER_RESULTS

from helpers.checkout import BIN, ROOT, copy_workflow, snakemake
from helpers.documented import (
    NOT_WALKED,
    SLURM_WALK,
    documented_commands,
    kept_measurements,
    measured_files,
)

pytestmark = pytest.mark.workflow

# The tiny study (config/config.yaml of the copy) and a second, smaller one in a study file.
TINY = "tiny"
MINE = "mine"
MINE_FILE = "my-study.yaml"
CELL = f"results/{TINY}/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"

# documented command -> the command as run here (None: exactly as documented): the local forms
# that measure cells, on a study measured locally
DOCUMENTED: dict[str, str | None] = {
    "snakemake --profile profiles/local": None,
    "dlscale status results/<study>": f"dlscale status results/{TINY}",
    "snakemake --profile profiles/local -n": None,  # the demo's plan, below
    "snakemake --profile profiles/local --forcerun <the cell's metrics.jsonl>": (
        f"snakemake --profile profiles/local --forcerun {CELL}"
    ),
    "snakemake --profile profiles/local --forcerun results/demo/runs/cpu/pytorch/cnn_small/weak/"
    "fp32/eager/n2/r1/metrics.jsonl": f"snakemake --profile profiles/local --forcerun {CELL}",
    "snakemake --profile profiles/local --forcerun report_inputs report_tex": None,
    "snakemake --profile profiles/local --config study_file=my-study.yaml": None,
    "snakemake --profile profiles/local --config remeasure=True": None,
}
LEFT_OUT = {
    **{
        walked: "walked on a study measured on the local Slurm cluster by a plain user "
        "(tests/workflow/test_login_node.py)"
        for walked in SLURM_WALK
        if walked not in DOCUMENTED
    },
    **NOT_WALKED,
}


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


def plant(work: Path, name: str) -> None:
    """A study folder named `name` from before the name was reserved, or named like the
    project's own folders: a copy of the tiny study's measured cells."""
    shutil.copytree(work / f"results/{TINY}/runs", work / f"results/{name}/runs", symlinks=True)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Iterator[Path]:
    """A checkout whose config/config.yaml is the tiny study (2 throughput cells), a second
    study file (1 cell), and the tiny study measured to its report. Its tests work on copies,
    which share one results database with it (DLSCALE_DATABASE_URL: the default lies under the
    checkout's results/, so a copy would be another database and redo the study's history)."""
    tiny = yaml.safe_load((ROOT / "tests/fixtures/tiny.yaml").read_text())
    tiny = dict(tiny, workloads=["throughput"])
    work = copy_workflow(tmp_path_factory.mktemp("documented"), tiny)
    mine = dict(tiny, study=MINE, axes=dict(tiny["axes"], nodes=[1]))
    (work / MINE_FILE).write_text(yaml.safe_dump(mine))
    database = tmp_path_factory.mktemp("database") / "dlscale.sqlite"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DLSCALE_DATABASE_URL", f"sqlite:///{database}")
        proc = snakemake(work, "--profile", "profiles/local")
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield work


def test_the_demo_plan_is_what_the_quickstart_says(tmp_path):
    """The shipped demo study, dry run in a fresh checkout: 16 train_* + 4 converge_* jobs are
    its 20 cells, and it draws 8 throughput and 3 convergence figure files (11); a study file
    beside it that names convergence alone plans its convergence cells and nothing else."""
    work = copy_workflow(tmp_path)
    out = snakemake(work, "--profile", "profiles/local", "-n").stdout
    counts = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], re.M)
    }
    cells = sum(v for k, v in counts.items() if k.startswith(("train_", "converge_")))
    assert cells == 20 and sum(v for k, v in counts.items() if k.startswith("train_")) == 16
    assert (counts["figure"], counts["convergence_figure"]) == (8, 3)
    # a study file that measures convergence only plans it (before: the planner's default jobs
    # were the demo's throughput models, refused at parse time), and says which of its
    # convergence keys it takes from config/config.yaml
    (work / "conv.yaml").write_text(yaml.safe_dump({"study": "conv", "workloads": ["convergence"]}))
    proc = snakemake(work, "--profile", "profiles/local", "-n", "--config", "study_file=conv.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1], re.M))
    assert sum(int(n) for k, n in jobs.items() if k.startswith("converge_")) == 4, jobs
    assert not any(k.startswith("train_") for k in jobs), jobs
    assert "study 'conv' (conv.yaml) lists convergence and takes these keys" in out


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


def test_the_local_forms_that_measure_and_the_printed_commands_act_on_the_named_study(
    measured, tmp_path
):
    """The documented local forms that measure cells (and redraw the report with TeX), run in a
    checkout whose results/ also holds study folders named like the project's own (legacy ones
    with reserved names, and allowed look-alikes): every metrics file survives, and each
    command's named outputs exist. Every other documented command, and every Slurm form, is
    walked on a study measured on the local Slurm cluster by a plain user
    (tests/workflow/test_login_node.py, helpers.documented.SLURM_WALK).

    On the same checkout, the messages' commands, pasted as printed, act on the study the user
    named: a Slurm dry run with the wrong launcher stops with the command that plans the same
    study's cells for srun; a second --config (which Snakemake drops) is refused with the merged
    command; a changed study file stops with the command that re-measures that study."""
    work = tmp_path / "w"
    shutil.copytree(measured, work, symlinks=True)

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
    ok(work, "snakemake --profile profiles/local --forcerun report_inputs report_tex")
    assert (work / f"results/{TINY}/report/report.pdf").stat().st_size > 0
    # a second study beside the first, from a study file: its one cell measured once
    typed = "snakemake --profile profiles/local --config study_file=my-study.yaml"
    ok(work, typed)
    assert (work / f"results/{MINE}/report/report.pdf").is_file()
    assert len(list((work / f"results/{MINE}").rglob("measurements/*/metrics.jsonl"))) == 1
    # nothing changed: remeasure=True re-measures nothing
    ok(work, "snakemake --profile profiles/local --config remeasure=True")
    assert len(list((work / CELL).parent.glob("measurements/*/metrics.jsonl"))) == 2

    after = measured_files(work)
    assert set(before) <= set(after)  # every metrics file is still there
    assert kept_measurements(before).items() <= after.items()  # every measurement unchanged
    assert {p: d for p, d in before.items() if p != CELL}.items() <= after.items()

    # the study file changed: the messages' commands act on that study, the other untouched
    tiny_before = {p: d for p, d in measured_files(work).items() if f"/{TINY}/" in p}
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
