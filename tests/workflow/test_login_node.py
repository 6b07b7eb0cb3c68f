"""A first day on a login node: a plain user, no root, no apt, no TeX on PATH, sets up the
driver, measures a study on the local Slurm cluster and walks every everyday command on it.

As root the test creates an unprivileged user (`dlscale-login`, kept for the next run) and gives
it a checkout, a PATH without TeX, the run's local Slurm cluster (the short `slurm-bind` one,
tests/conftest.py), and the site's pip configuration as PIP_* variables: a local package index
(built once per machine from envs/workflow.txt's closure, the site's mirror, PIP_INDEX_URL)
without torch, and a CPU wheel index holding only torch (DLSCALE_DRIVER_TORCH_INDEX), so set-up
succeeds only if both are honoured, offline. As that user it runs `setup.sh none` (exit 0, no
apt), measures the checkout's own study locally (the no-TeX notice before the first job), then
docs/pages/first-day.md's steps 7 and 8 with a study file on the cluster (the dry run without
launcher=srun stops with the step's command), and every command README.md and the quickstart
show, as printed, on that study (tests/helpers/documented.py maps each to the command run): the
local forms that would measure stop and print the Slurm form, which re-measures; the others
measure nothing and build what the pages name, beside study folders named like the project's
own. After every command no metrics file is gone and no kept measurement changed. Last, the user
wrote nothing on the login node outside the checkout, the environments folder and its own cache
folders (~/.cache: pip's, Snakemake's, matplotlib's). The full set-up of every framework as a
plain user is a benchmark (benchmarks/reports/2026-11-27-setup-as-a-plain-user.md)."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from helpers import run_names
from helpers.checkout import ROOT, copy_workflow, path_without_tex
from helpers.documented import (
    MINE,
    MINE_ARCHIVE,
    MINE_CELL,
    MINE_FILE,
    NOT_WALKED,
    ON_MINE,
    ON_MINE_SLURM,
    REMEASURE_CELL_ON_SLURM,
    SLURM_WALK,
    TINY,
    documented_commands,
    kept_measurements,
    measured_files,
)
from helpers.plain_user import PlainUser, plain_user, remove_home

pytestmark = pytest.mark.workflow

USER = "dlscale-login"  # the run's own user is dlscale-login-<run> (helpers.plain_user)
# world-writable places a plain user can write to, besides its home
WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# the site's indexes, built once per machine where the plain user can read them without any of
# root's own folders being opened to it
INDEXES = run_names.SHARED / "login-indexes"


def _simple_index(wheels: Path, index: Path, only: set[str] | None, leave_out: set[str]) -> None:
    """A PEP 503 index at `index` linking the wheels in `wheels` (projects `only`, else all but
    `leave_out`)."""
    for wheel in sorted(wheels.glob("*.whl")):
        project = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        if (only is not None and project not in only) or project in leave_out:
            continue
        page = index / project
        page.mkdir(parents=True, exist_ok=True)
        with open(page / "index.html", "a") as fh:
            fh.write(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')


@pytest.fixture(scope="module")
def site_indexes() -> tuple[Path, Path]:
    """The site's mirror (every wheel of the driver's requirements but torch) and a CPU wheel
    index (torch), built once per machine with root's own pip configuration under INDEXES,
    keyed by the requirements."""
    reqs = [ROOT / "envs/workflow.txt", ROOT / "envs/pytorch.txt", ROOT / "pyproject.toml"]
    key = hashlib.sha256(b"".join(p.read_bytes() for p in reqs)).hexdigest()[:12]
    folder = INDEXES / key
    with run_names.shared_lock(f"login-indexes-{key}"):  # two runs at once build it once
        _build_indexes(folder)
    for part in [INDEXES, *INDEXES.rglob("*")]:  # readable by the plain user, nothing else
        part.chmod(part.stat().st_mode | (0o055 if part.is_dir() else 0o044))
    return folder / "mirror", folder / "torch-cpu"


def _build_indexes(folder: Path) -> None:
    reqs = [ROOT / "envs/workflow.txt", ROOT / "envs/pytorch.txt"]
    if not (folder / "ready").exists():
        shutil.rmtree(folder, ignore_errors=True)
        wheels = folder / "wheels"
        pins = ["pip>=24", "setuptools>=68", "-r", str(reqs[0]), "-r", str(reqs[1])]
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), *pins],
            check=True, capture_output=True, timeout=900,
        )  # fmt: skip
        _simple_index(wheels, folder / "mirror", None, {"torch"})
        _simple_index(wheels, folder / "torch-cpu", {"torch"}, set())
        (folder / "ready").touch()


def _as_user(user: PlainUser, cwd: Path, env: dict[str, str], *command: str) -> str:
    proc = user.run(cwd, env, *command)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(command)}: exit {proc.returncode}\n{out[-4000:]}"
    return proc.stderr


# The first-day study (docs/pages/first-day.md, step 7): the site's CPU entry and one model, 1
# and 2 nodes, measured on the local Slurm cluster
FIRST_DAY_STUDY = {
    "study": MINE,
    "axes": {
        "framework": ["pytorch"],
        "model": ["cnn_small"],
        "hardware": ["cpu"],
        "nodes": [1, 2],
        "policy": ["weak"],
        "precision": ["fp32"],
        "mode": ["eager"],
    },
    "repetitions": 1,
    "per_rank_batch": 8,
    "warmup_steps": 1,
    "steps": 3,
}


def own_study(tiny: dict) -> dict:
    """The checkout's own study (config/config.yaml), measured locally: the tiny study's
    throughput cell at 1 node."""
    return {**tiny, "workloads": ["throughput"], "axes": {**tiny["axes"], "nodes": [1]}}


# study folders from before the names were reserved, or named like the project's own (a copy of
# the local study's measured cells): every command that writes under results/ keeps them
BESIDE = ["data", "logs", "runs", "tables", "figures", "report", "site-2", "Data2", "demo.bak"]


def test_the_walk_runs_every_documented_command():
    """Every command README.md and the quickstart show is walked below, or left out with why (a
    command added to a page without either fails here)."""
    shown = documented_commands()
    assert len(shown) >= 30
    assert shown == set(SLURM_WALK) | set(NOT_WALKED), (
        f"documented, not walked: {sorted(shown - set(SLURM_WALK) - set(NOT_WALKED))}; "
        f"walked, no longer documented: {sorted((set(SLURM_WALK) | set(NOT_WALKED)) - shown)}"
    )


class Walk:
    """The plain user's commands, run as printed in its checkout. After each, no metrics file is
    gone (so their count never falls) and no kept measurement changed."""

    def __init__(self, user: PlainUser, checkout: Path, env: dict[str, str]):
        self.user, self.checkout, self.env = user, checkout, env
        self.files = measured_files(checkout)
        self.ran: list[str] = []
        self.seconds: list[float] = []  # each command's, in the order run

    def refresh(self) -> None:
        """Metrics files the test itself put there count from now on."""
        self.files = measured_files(self.checkout)

    def run(self, command: str) -> tuple[int, str]:
        start = time.monotonic()
        proc = self.user.run(self.checkout, self.env, *shlex.split(command))
        self.seconds.append(time.monotonic() - start)
        now = measured_files(self.checkout)
        gone = sorted(set(self.files) - set(now))
        assert not gone, f"{command}: metrics files gone: {gone}"
        assert kept_measurements(self.files).items() <= now.items(), f"{command}: one changed"
        self.files = now
        self.ran.append(command)
        return proc.returncode, proc.stdout + proc.stderr

    def ok(self, documented: str) -> str:
        """The documented command as the walk runs it (SLURM_WALK): its output, after exit 0."""
        code, out = self.run(SLURM_WALK[documented])
        assert code == 0, f"{SLURM_WALK[documented]}: exit {code}\n{out[-4000:]}"
        return out

    def count(self, study: str) -> int:
        return sum(1 for p in self.files if p.startswith(f"results/{study}/"))


def slurm_variables() -> dict[str, str]:
    """What names the run's cluster (its slurm.conf, state folder, ports), as the `cluster`
    fixture set it in this process's environment: the plain user's commands get it too."""
    return {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "DLSCALE_SLURM"))}


def archived(path: Path) -> dict[str, bytes]:
    """An archive's files and their bytes, but the driver's log (a run's last lines, written
    after the archive it made) and its line in the manifest."""
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    log = "/logs/driver.log"
    return {
        name: b"".join(ln for ln in data.splitlines(True) if log.encode() not in ln)
        if name.endswith("MANIFEST.sha256")
        else data
        for name, data in files.items()
        if not name.endswith(log)
    }


def printed_commands(output: str) -> set[str]:
    """The commands a run's messages print on lines of their own, indented under their text."""
    return {ln.strip() for ln in output.splitlines() if ln.startswith("  snakemake ")}


def jobs_of(output: str, prefix: str) -> int:
    """How many jobs of the rules named `prefix...` a run's job stats list (its first table: a
    dry run prints it again at its end)."""
    if "Job stats:" not in output:
        return 0
    table = output.split("Job stats:", 1)[1].split("\ntotal", 1)[0]
    return sum(int(n) for n in re.findall(rf"^{prefix}\w*\s+(\d+)$", table, re.M))


def walk_first_day_and_every_everyday_command(walk: Walk, checkout: Path) -> None:
    """After the set-up: the checkout's own study measured locally, first-day.md's steps 7 and
    8 on the cluster, then every documented command (SLURM_WALK) on the study measured there."""
    # the checkout's own study, measured locally (the first row); the no-TeX notice first
    said = walk.ok("snakemake --profile profiles/local")
    notice = said.index("dlscale: TeX not found on PATH")
    assert notice < re.search(r"^(local)?rule \w+:", said, re.M).start(), said[-3000:]
    assert walk.count(TINY) == 2  # its one cell: the link and the measurement

    # step 7, the dry run: without launcher=srun it stops and prints the command with it,
    # which plans the same study's cells for srun, the step's own command
    code, out = walk.run(f"snakemake --profile profiles/slurm {ON_MINE} -n")
    assert code != 0 and "launcher is 'local'" in out, out[-2000:]
    fixed = {c for c in printed_commands(out) if "launcher=" in c}
    assert fixed == {f"snakemake --profile profiles/slurm -n {ON_MINE_SLURM}"}, out[-2000:]
    out = walk.ok("snakemake --profile profiles/slurm -n")  # step 7 as printed
    planned = re.findall(r"output: (results/[^/]+)/runs/", out)
    assert planned and set(planned) == {f"results/{MINE}"} and jobs_of(out, "train_") == 2
    # step 8: submit and follow; a second run (or a lost driver's restart) has nothing to do
    walk.ok("snakemake --profile profiles/slurm --config study_file=my-study.yaml launcher=srun")
    assert walk.count(MINE) == 4
    jobs = [p for p in walk.files if p.startswith(f"results/{MINE}/") and "/measurements/" in p]
    assert len(jobs) == 2 and all("-job" in p for p in jobs), jobs  # Slurm jobs, not pids
    assert "2 cells: 2 measured" in walk.ok("dlscale status results/<study>")
    assert "Nothing to be done" in walk.ok("snakemake --profile profiles/slurm")

    # the local forms on a study measured on Slurm: said first, nothing measured
    out = walk.ok("snakemake --profile profiles/local -n")
    assert "was measured with launcher 'srun'" in out and jobs_of(out, "train_") == 0, out
    out = walk.ok("snakemake --profile profiles/local --config study_file=my-study.yaml")
    assert "was measured with launcher 'srun'" in out and walk.count(MINE) == 4
    walk.ok("snakemake --profile profiles/local --config remeasure=True")
    walk.ok("snakemake --profile profiles/slurm --config launcher=srun remeasure=True")
    assert walk.count(MINE) == 4
    # re-measure one cell: the local form stops before any job, printing the Slurm form,
    # which re-measures it there (its first measurement kept)
    local = "snakemake --profile profiles/local --forcerun <the cell's metrics.jsonl>"
    code, out = walk.run(SLURM_WALK[local])
    assert code != 0 and "Nothing was run or removed" in out, out[-3000:]
    assert {c for c in printed_commands(out) if "--forcerun" in c} == {REMEASURE_CELL_ON_SLURM}
    assert (
        SLURM_WALK[local]
        == SLURM_WALK[
            "snakemake --profile profiles/local --forcerun results/demo/runs/cpu/pytorch/"
            "cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
        ]
    )
    walk.ok("snakemake --profile profiles/slurm --forcerun <the cell's metrics.jsonl>")
    kept = sorted((checkout / MINE_CELL).parent.glob("measurements/*-job*/metrics.jsonl"))
    assert len(kept) == 2 and walk.count(MINE) == 5

    # the results database: the Slurm driver wrote both kept measurements of the 2-node cell,
    # one point of n = 2 in its series' history; importing the study folder again adds nothing
    out = walk.ok("dlscale history --model <model> --nodes <n>")
    assert "/cnn_small/weak/fp32/eager/ddp/n2  (software match, 1 point(s))" in out, out
    assert re.search(rf"^  1  {MINE}  .*  2  .*  first$", out, re.M), out
    out = walk.ok("dlscale history import results/<study>")
    assert f"results/{MINE}: " in out and "0 invalid file(s)" in out, out
    code, out = walk.run(SLURM_WALK["dlscale history import results/<study>"])
    assert code == 0 and f"results/{MINE}: 0 new row(s), 3 measurement(s)" in out, out

    # every command that measures nothing, with study folders named like the project's
    # own beside: figures and the report redrawn with the local profile, no cell run
    for name in BESIDE:
        shutil.copytree(checkout / f"results/{TINY}/runs", checkout / f"results/{name}/runs")
    walk.refresh()
    figure = checkout / f"results/{MINE}/figures/cpu/throughput.pdf"
    stamp_figure = figure.stat().st_mtime_ns
    out = walk.ok("snakemake --profile profiles/local --forcerun figure convergence_figure")
    assert figure.stat().st_mtime_ns > stamp_figure and jobs_of(out, "train_") == 0
    tex = checkout / f"results/{MINE}/report/report.tex"
    stamp_tex = tex.stat().st_mtime_ns
    walk.ok("snakemake --profile profiles/local --forcerun report_inputs report_tex")
    assert tex.stat().st_mtime_ns > stamp_tex
    assert not (checkout / f"results/{MINE}/report/report.pdf").exists()  # no TeX
    walk.ok("snakemake --profile profiles/local --report results/<study>/report.zip")
    assert (checkout / f"results/{MINE}/report.zip").stat().st_size > 0
    out = walk.ok("snakemake --profile profiles/local check")  # no references yet: how to
    assert f"regression_check bless results/{MINE} --system cpu" in out
    walk.ok("python -m dlscale.decisions.regression_check results/<study>")
    assert "cpu" in walk.ok(
        "python -m dlscale.decisions.regression_check bless results/<study> --system cpu "
        "[--tolerance 0.05] [--dry-run]"
    )
    compared = checkout / f"results/{MINE}/compare/{TINY}"
    for documented in (
        "python -m dlscale.decisions.compare results/<before> results/<after>",
        "dlscale compare A B",
        "snakemake results/<after>/compare/<before>/summary.md --profile profiles/local "
        "--config study_file=my-study.yaml",
    ):
        shutil.rmtree(compared, ignore_errors=True)
        walk.ok(documented)
        for name in ("compare.csv", "summary.md", "summary.tex", "ratios.pdf"):
            assert (compared / name).is_file(), (documented, name)
    assert (
        SLURM_WALK["snakemake results/<after>/compare/<before>/summary.md --profile profiles/local"]
        == walk.ran[-1]
    )
    assert "solved in" in walk.ok("python -m dlscale.decisions.planner results/<study>")
    walk.ok(
        "python -m dlscale.decisions.planner results/<study> [--job MODEL:SAMPLES ...] "
        "[--budget-node-hours B \\| --objective min_node_hours --deadline-hours D] [--out DIR]"
    )
    assert (checkout / "plan-out/plan.csv").is_file()
    walk.ok("snakemake --profile profiles/local --forcerun scaling_model")
    # archives: the workflow's and the command line's are the same bytes, and verify
    walk.ok("snakemake study_archive --profile profiles/local")
    assert (checkout / f"{MINE_ARCHIVE}.sha256").is_file()
    with_file = "[--config study_file=my-study.yaml]"  # the form with the study file
    assert (
        SLURM_WALK["snakemake study_archive --profile profiles/local"]
        == SLURM_WALK[f"snakemake study_archive --profile profiles/local {with_file}"]
    )
    workflow_made = archived(checkout / MINE_ARCHIVE)
    walk.ok(
        "python -m dlscale.store.study_archive create results/<study> "
        "[--config study_file=my-study.yaml]"
    )
    assert archived(checkout / MINE_ARCHIVE) == workflow_made
    with tarfile.open(checkout / MINE_ARCHIVE) as tar:
        names = tar.getnames()
    assert {f"dlscale-{MINE}/{n}" for n in ("config/config.yaml", MINE_FILE)} <= set(names)
    assert "every file matches" in walk.ok(
        "python -m dlscale.store.study_archive verify results/<study>/archive/<study>.tar.gz"
    )
    walk.ok("python -m dlscale.store.migrate")
    walk.ok("mkdocs build --strict -f docs/mkdocs.yml")
    assert (checkout / "results/site/index.html").is_file()
    # every documented command was walked; no measurement was lost on the way
    assert set(SLURM_WALK.values()) <= set(walk.ran), set(SLURM_WALK.values()) - set(walk.ran)
    assert walk.count(MINE) == 5 and walk.count(TINY) == 2

    # legacy studies named like the docs site and Snakemake's report at its earlier path:
    # the docs build refuses to empty the site folder, a report sent there cannot replace
    # the folder; nothing is lost (Walk.run asserts it)
    for name in ("site", "report.zip"):
        shutil.rmtree(checkout / f"results/{name}", ignore_errors=True)
        shutil.copytree(checkout / f"results/{TINY}/runs", checkout / f"results/{name}/runs")
    walk.refresh()
    before = dict(walk.files)
    code, out = walk.run("mkdocs build --strict -f docs/mkdocs.yml")
    assert code != 0 and "holds a study's measurements" in out, out[-2000:]
    code, out = walk.run(
        f"snakemake --profile profiles/local --report results/report.zip {ON_MINE}"
    )
    assert code != 0, out[-2000:]
    assert measured_files(checkout) == before


@pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("CI"), reason="creates a user: run as root"
)
def test_a_plain_user_measures_on_slurm_and_walks_every_everyday_command(site_indexes, cluster):
    mirror, torch_cpu = site_indexes
    user = plain_user(USER)
    uid, home = user.uid, user.home
    run = run_names.run_path("login")  # the user's project space, the run's own
    shutil.rmtree(run, ignore_errors=True)
    try:
        tiny = yaml.safe_load((ROOT / "tests/fixtures/tiny.yaml").read_text())
        (run / "dlscale").mkdir(parents=True)
        checkout = copy_workflow(run / "dlscale", own_study(tiny))
        (checkout / ".venvs").unlink(missing_ok=True)  # the environments go where the user says
        # a clone's files: the package itself (copy_workflow leaves it to the tests' PYTHONPATH),
        # and the documentation the pages link to
        shutil.copytree(
            ROOT / "scripts/dlscale",
            checkout / "scripts/dlscale",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, checkout / name)
        shutil.copytree(
            ROOT / "docs", checkout / "docs", ignore=shutil.ignore_patterns("__pycache__")
        )
        (checkout / "benchmarks").mkdir()
        shutil.copy2(ROOT / "benchmarks/README.md", checkout / "benchmarks/README.md")
        shutil.copytree(ROOT / "benchmarks/reports", checkout / "benchmarks/reports")
        (checkout / MINE_FILE).write_text(yaml.safe_dump(FIRST_DAY_STUDY))
        envs = run / "envs"
        subprocess.run(["chown", "-R", f"{user.name}:", str(run)], check=True)
        bin_dir = Path(path_without_tex(run / "bin"))  # the PATH, where the user can read it
        assert shutil.which("pdflatex", path=str(bin_dir)) is None
        env = {
            "PATH": str(bin_dir),
            "PIP_INDEX_URL": mirror.as_uri(),  # the site's mirror
            "PIP_FIND_LINKS": "",  # no wheel folder of root's
            "DLSCALE_DRIVER_TORCH_INDEX": torch_cpu.as_uri(),
            "DLSCALE_ENVS_DIR": str(envs),
            **slurm_variables(),  # the login node's Slurm: the run's own cluster
        }
        stamp = time.time() - 1

        # first day, steps 2 to 6: the set-up from the site's mirror, no TeX
        start = time.monotonic()
        said = _as_user(user, checkout, env, "bash", "scripts/setup.sh", "none")
        setup_s = time.monotonic() - start
        assert "no TeX on PATH (latexmk pdflatex)" in said and "apt" not in said.lower(), said
        assert "the driver's torch from" in said and "driver ready" in said, said

        walk = Walk(user, checkout, {**env, "PATH": f"{checkout / '.venv/bin'}:{bin_dir}"})
        walk_first_day_and_every_everyday_command(walk, checkout)

        # every file the user wrote on the login node lies in the checkout, the environments
        # folder or its caches (its jobs ran on the cluster's nodes, whose disks are their own)
        nodes = Path(os.environ["DLSCALE_SLURM_DIR"])  # the cluster's, nodes' disks included
        allowed = [checkout, envs, home / ".cache", nodes]
        written = subprocess.run(
            ["find", *WRITABLE, str(home), "-xdev", "-user", str(uid), "-newermt", f"@{stamp}",
             "-not", "-type", "d", "-print0"],
            capture_output=True, text=True,
        ).stdout.split("\0")[:-1]  # fmt: skip
        outside = [f for f in written if not any(Path(f).is_relative_to(a) for a in allowed)]
        assert outside == [], outside
        caches = sorted({Path(f).relative_to(home / ".cache").parts[0] for f in written
                         if Path(f).is_relative_to(home / ".cache")})  # fmt: skip
        assert set(caches) <= {"pip", "snakemake", "matplotlib"}, caches
        print(f"setup.sh none as a plain user: {setup_s:.0f} s; caches written: {caches}")
        print(f"the walk: {len(walk.ran)} commands in {sum(walk.seconds):.0f} s")
        for command, seconds in zip(walk.ran, walk.seconds):
            print(f"  {seconds:5.1f} s  {command}")
    finally:  # nothing of the run's is left behind, on success or failure
        shutil.rmtree(run, ignore_errors=True)
        remove_home(user)
