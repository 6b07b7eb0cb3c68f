"""A recording `srun` (and the `scontrol` that names the allocation's nodes n1, n2) first on
PATH, inside a 2-node job 77 that is not in a job step: the production launcher's start_srun
then runs it, and the test reads the command line and environment it was given."""

from __future__ import annotations

import json
import os
from pathlib import Path


def recording_srun(tmp_path: Path, monkeypatch) -> Path:
    """Install the stand-ins; returns the JSON file ({"argv", "env"}) the `srun` writes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "srun.json"
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': dict(os.environ)}, "
        f"open({str(record)!r}, 'w'))\n"
    )
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho n1; echo n2\n")
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-2]")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    return record


def recorded(record: Path) -> dict:
    return json.loads(record.read_text())
