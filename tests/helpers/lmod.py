"""A site's module tree in miniature, for Lmod (Debian's package: scripts/setup.sh and
scripts/slurm/cluster-up.sh install it): one Lua modulefile, testmod/1.0."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")


def lmod_missing() -> bool:
    """Lmod is not installed, and this is not CI (where its tests never skip)."""
    return not LMOD_INIT.is_file() and not os.environ.get("CI")


def needs_lmod() -> None:
    """Skip without Lmod, except under CI, where the test then fails."""
    if lmod_missing():
        pytest.skip("Lmod is not installed (apt-get install lmod; scripts/setup.sh installs it)")


def write_testmod(root: Path) -> tuple[Path, Path]:
    """testmod/1.0 (Lua) under root/modulefiles: it puts a marker folder on PATH and sets
    DLSCALE_TESTMOD=loaded. Returns (the module tree, for MODULEPATH; the marker folder)."""
    marker = root / "testmod-bin"
    marker.mkdir(parents=True)
    (root / "modulefiles" / "testmod").mkdir(parents=True)
    (root / "modulefiles" / "testmod" / "1.0.lua").write_text(
        f'prepend_path("PATH", "{marker}")\nsetenv("DLSCALE_TESTMOD", "loaded")\n'
    )
    return root / "modulefiles", marker
