"""scripts/slurm/cluster-up.sh on a machine where network namespaces cannot be made (an `ip`
that fails, first on PATH): the separate-hosts layout falls back to the single-address one only
where that is allowed, and says so; under CI, or when --separate-hosts is asked for, it stops
before starting anything. Root only (the script refuses other users first); CI runs as root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.checkout import UP


def failing_ip(folder: Path) -> str:
    """A PATH whose first folder holds an `ip` that fails, as where network namespaces cannot
    be made (a container without CAP_NET_ADMIN)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ip").write_text(
        "#!/bin/sh\necho 'RTNETLINK answers: Operation not permitted' >&2\nexit 2\n"
    )
    (folder / "ip").chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


@pytest.mark.parametrize(
    "ci, args, said",
    [
        ("true", [], "and under CI the single-address fallback is a failure"),
        ("", ["--separate-hosts"], "--separate-hosts was asked for"),
    ],
)
def test_no_namespaces_is_an_error_under_ci_or_when_asked_for(tmp_path, ci, args, said):
    if os.geteuid() != 0:
        pytest.skip("cluster-up.sh runs as root")
    env = dict(
        os.environ,
        PATH=failing_ip(tmp_path / "bin"),
        CI=ci,
        DLSCALE_SLURM_DIR=str(tmp_path / "state"),
        DLSCALE_SLURM_NET="dlnoip",
    )
    proc = subprocess.run(
        ["bash", str(UP), "--nodes", "2", "--no-system-conf", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "network namespaces cannot be made here" in proc.stderr and said in proc.stderr
    assert not (tmp_path / "state" / "etc" / "slurm.conf").exists()  # nothing was started
