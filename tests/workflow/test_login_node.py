"""A login node: a plain user, no root, no apt, no TeX on PATH, sets up the driver
and runs a small study.

As root the test creates an unprivileged user (`dlscale-login`, kept for the next run) and gives
it a checkout, a PATH without TeX, and the site's pip configuration as PIP_* variables: a local
package index (built once per machine from envs/workflow.txt's closure, the site's mirror,
PIP_INDEX_URL) without torch, and a CPU wheel index holding only torch
(DLSCALE_DRIVER_TORCH_INDEX), so set-up succeeds only if both are honoured, offline. It then
runs `setup.sh none`, the tiny study (throughput cells) and Snakemake's HTML report as that user,
and checks that the set-up exits 0; that tables, figures, the report's sources and the HTML
report are built and the PDF is not; that the no-TeX notice comes before the first job; and
that the user wrote nothing outside the checkout, the environments folder and its own cache
folders (~/.cache: pip's, Snakemake's, matplotlib's). The full set-up of every framework as a
plain user is a benchmark (benchmarks/README.md, "Set-up as a plain user")."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, copy_workflow, path_without_tex
from helpers import run_names
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


@pytest.mark.skipif(
    os.geteuid() != 0 and not os.environ.get("CI"), reason="creates a user: run as root"
)
def test_a_plain_user_sets_up_and_runs_a_study_without_tex(site_indexes):
    mirror, torch_cpu = site_indexes
    user = plain_user(USER)
    uid, home = user.uid, user.home
    run = run_names.run_path("login")  # the user's project space, the run's own
    shutil.rmtree(run, ignore_errors=True)
    try:
        tiny = yaml.safe_load((ROOT / "tests/fixtures/tiny.yaml").read_text())
        (run / "dlscale").mkdir(parents=True)
        checkout = copy_workflow(run / "dlscale", {**tiny, "workloads": ["throughput"]})
        (checkout / ".venvs").unlink(missing_ok=True)  # the environments go where the user says
        # a clone's files: the package itself (copy_workflow leaves it to the tests' PYTHONPATH)
        shutil.copytree(
            ROOT / "scripts/dlscale",
            checkout / "scripts/dlscale",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, checkout / name)
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
        }
        stamp = time.time() - 1

        start = time.monotonic()
        said = _as_user(user, checkout, env, "bash", "scripts/setup.sh", "none")
        setup_s = time.monotonic() - start
        assert "no TeX on PATH (latexmk pdflatex)" in said and "apt" not in said.lower(), said
        assert "the driver's torch from" in said and "driver ready" in said, said

        venv_path = {**env, "PATH": f"{checkout / '.venv/bin'}:{bin_dir}"}
        said = _as_user(user, checkout, venv_path, "snakemake", "--profile", "profiles/local")
        notice = said.index("dlscale: TeX not found on PATH")
        assert notice < re.search(r"^(local)?rule \w+:", said, re.M).start(), said[-3000:]
        _as_user(user, checkout, venv_path, "snakemake", "--profile", "profiles/local",
                 "--report", "results/report.zip")  # fmt: skip
        study = checkout / "results/tiny"
        for built in ("tables/cells.csv", "tables/scaling.csv", "figures/cpu/throughput.pdf",
                      "report/report.tex", "report/macros.tex"):  # fmt: skip
            assert (study / built).is_file(), built
        assert not (study / "report/report.pdf").exists()
        assert (checkout / "results/report.zip").stat().st_size > 0

        # every file the user wrote lies in the checkout, the environments folder or its caches
        allowed = [checkout, envs, home / ".cache"]
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
    finally:  # nothing of the run's is left behind, on success or failure
        shutil.rmtree(run, ignore_errors=True)
        remove_home(user)
