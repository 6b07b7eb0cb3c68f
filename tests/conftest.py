"""Shared fixtures: the repository root, valid configs, and a private copy of the workflow."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
WORKFLOW_PARTS = ["Snakefile", "rules", "config", "profiles", "scripts", "envs", "report"]
UP = ROOT / "scripts" / "slurm" / "cluster-up.sh"
DOWN = ROOT / "scripts" / "slurm" / "cluster-down.sh"


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def base_config() -> dict:
    with open(ROOT / "config" / "config.yaml") as fh:
        return yaml.safe_load(fh)


@pytest.fixture
def tiny_config() -> dict:
    with open(ROOT / "tests" / "fixtures" / "tiny.yaml") as fh:
        return yaml.safe_load(fh)


def copy_workflow(dest: Path, config: dict | None = None) -> Path:
    """A user's checkout in miniature: the workflow files, a fresh results/ and a config."""
    for part in WORKFLOW_PARTS:
        src = ROOT / part
        if src.is_dir():
            shutil.copytree(
                src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "dlscale")
            )
        else:
            shutil.copy2(src, dest / part)
    if (ROOT / ".venvs").is_dir():
        (dest / ".venvs").symlink_to(ROOT / ".venvs")  # the framework environments
    if config is not None:
        (dest / "config" / "config.yaml").write_text(yaml.safe_dump(copy.deepcopy(config)))
    return dest


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(
        [str(BIN / "snakemake"), *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tiny_study(dest: Path, profile: str, hardware: dict | None = None, **changes) -> Path:
    """The tiny study (tests/fixtures/tiny.yaml: 2 throughput and 2 convergence cells) run to
    the PDF with a profile; `changes` replace its keys, `hardware` (key -> entries) is merged
    into the hardware file's entries."""
    tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    work = copy_workflow(dest, {**tiny, **changes})
    if hardware:
        site = work / "config" / "hardware.yaml"
        entries = yaml.safe_load(site.read_text())
        for key, extra in hardware.items():
            entries[key] = {**entries[key], **extra}
        site.write_text(yaml.safe_dump(entries))
    proc = snakemake(work, "--profile", profile)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work


# ---- the project's local Slurm cluster (scripts/slurm/cluster-up.sh): started once for all
# Slurm tests, stopped at the end if the tests started it. Under CI=true these tests never skip.
def _cluster_running() -> bool:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "idle" in out.stdout


@pytest.fixture(scope="session")
def cluster():
    if os.geteuid() != 0 and not os.environ.get("CI"):
        pytest.skip("the local Slurm cluster needs root (apt, daemons); CI runs these tests")
    was_running = _cluster_running()
    up = subprocess.run(
        ["bash", str(UP), "--nodes", "2"], capture_output=True, text=True, timeout=900
    )
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    assert _cluster_running()
    yield
    if not was_running:
        subprocess.run(["bash", str(DOWN)], capture_output=True, text=True, timeout=300)
