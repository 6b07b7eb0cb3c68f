"""A user's checkout in miniature, for the tests and the benchmarks alike: the repository's
paths (ROOT, BIN, the local cluster's scripts), copy_workflow (the workflow files, a fresh
results/ and a config), snakemake in such a copy, and the tiny study run to its PDF.

Imports nothing of dlscale: a benchmark may measure another checkout's package (it imports that
one first, benchmarks/_common.import_dlscale)."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the driver's venv: snakemake, ruff, vulture
UP = ROOT / "scripts" / "slurm" / "cluster-up.sh"
DOWN = ROOT / "scripts" / "slurm" / "cluster-down.sh"
# What a user's clone holds of the workflow (results/ is its own, empty); report/ holds the
# captions of Snakemake's report (Snakefile `report:`, the rules' `caption=`).
WORKFLOW_PARTS = ("Snakefile", "rules", "config", "profiles", "scripts", "envs", "report")
# Never copied: Python's caches and pip's metadata of an editable install (a clone has neither)
NOT_COPIED = ("__pycache__", "*.egg-info")


def copy_workflow(
    dest: Path,
    config: dict | None = None,
    *,
    src: Path = ROOT,
    package: bool = False,
    venvs: Path | None = None,
) -> Path:
    """A user's checkout in miniature at `dest`: the WORKFLOW_PARTS of `src` (one that an
    older checkout lacks is left out), a fresh results/, and `config` as config/config.yaml
    where given.

    `package`: the copy holds its own dlscale package under scripts/ (a benchmark measuring a
    checkout's own code puts that folder first on PYTHONPATH); without it the copy imports the
    package this process runs (the tests' editable install).
    `venvs`: the framework environments, as a folder .venvs of links to each environment in
    `venvs` (a benchmark adds stand-ins beside them); without it .venvs is one link to src's
    .venvs where that exists."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(*NOT_COPIED, *(() if package else ("dlscale",)))
    for part in WORKFLOW_PARTS:
        if (src / part).is_dir():
            shutil.copytree(src / part, dest / part, ignore=ignore)
        elif (src / part).is_file():
            shutil.copy2(src / part, dest / part)
    if venvs is not None:
        (dest / ".venvs").mkdir()
        for env in sorted(Path(venvs).resolve().iterdir()):
            (dest / ".venvs" / env.name).symlink_to(env)
    elif (src / ".venvs").is_dir():
        (dest / ".venvs").symlink_to(src / ".venvs")
    if config is not None:
        (dest / "config" / "config.yaml").write_text(yaml.safe_dump(copy.deepcopy(config)))
    return dest


def path_without_tex(folder: Path) -> str:
    """A PATH whose one folder, `folder`, links every tool of /usr/local/bin, /usr/bin and /bin
    but TeX's (a login node without TeX Live)."""
    folder.mkdir(parents=True, exist_ok=True)
    for system in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(system).iterdir():
            name = tool.name
            if "tex" not in name and "latex" not in name and not (folder / name).exists():
                (folder / name).symlink_to(tool)
    return str(folder)


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """The driver's snakemake in `workdir`, the driver's venv first on PATH."""
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
