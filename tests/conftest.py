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
WORKFLOW_PARTS = ["Snakefile", "rules", "config", "profiles", "scripts", "envs"]


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
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__", "dlscale"))
        else:
            shutil.copy2(src, dest / part)
    if config is not None:
        (dest / "config" / "config.yaml").write_text(yaml.safe_dump(copy.deepcopy(config)))
    return dest


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=timeout)


def tiny_study(dest: Path, profile: str) -> Path:
    """The tiny study (tests/fixtures/tiny.yaml, 2 cells) run to the PDF with a profile."""
    tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    work = copy_workflow(dest, tiny)
    proc = snakemake(work, "--profile", profile)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work
