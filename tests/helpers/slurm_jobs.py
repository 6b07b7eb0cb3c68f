"""Every job the local Slurm controller knows (`scontrol show job -o`: running, queued, and
ended within MinJobAge), one dict of its fields each: the witness of the Slurm tests."""

from __future__ import annotations

import subprocess


def controller_jobs() -> list[dict[str, str]]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=30
    ).stdout
    return [
        dict(tok.split("=", 1) for tok in line.split() if "=" in tok and not tok.startswith("="))
        for line in out.splitlines()
    ]
