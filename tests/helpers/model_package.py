"""The example package that brings its own model by the `dlscale.models` entry point
(tests/fixtures/models/dlscale-example-models), installed by pip into an environment of its
own (a venv that sees the driver's packages, torch among them, through a .pth file; never .venv
itself): for the entry-point test and benchmarks/zoo_cells.py alike.

Imports nothing of dlscale."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "dlscale-example-models"


def own_venv(folder: Path) -> Path:
    """A venv of its own at `folder` that sees the driver's packages (torch) through a .pth
    file; its interpreter."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(folder)],
        check=True,
    )
    purelib = subprocess.run(
        [
            str(folder / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (folder / "site.pth").unlink(missing_ok=True)
    Path(purelib, "_driver.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    return folder / "bin" / "python"


def install(python: Path, version: str, scratch: Path, source: Path = PACKAGE) -> None:
    """The example package as `version` (a copy of its source under `scratch`), installed by
    pip into `python`'s environment: no index, no dependencies, no build isolation."""
    copy_ = scratch / f"src-{version}"
    shutil.copytree(source, copy_)
    toml = copy_ / "pyproject.toml"
    toml.write_text(toml.read_text().replace('version = "0.1.0"', f'version = "{version}"'))
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            str(copy_),
        ],
        check=True,
        capture_output=True,
    )
