"""Collective timeouts: every process group a strategy creates, the device mesh's subgroups
included, waits at most the project's collective timeout (not the backend's 10 minutes for NCCL, 30
for gloo): real gloo ranks, one of which never joins a tensor-parallel group's allreduce."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dlscale.rank.timing import COLLECTIVE_TIMEOUT_ENV
from dlscale.run.launchers.ports import local_port

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
TIMEOUT_S = 3  # the project's collective timeout, for these ranks


def test_a_mesh_subgroup_collective_ends_at_the_project_timeout(tmp_path):
    port, out = local_port(4), tmp_path / "rank0.json"
    env = dict(os.environ, **{COLLECTIVE_TIMEOUT_ENV: str(TIMEOUT_S)})
    ranks = [
        subprocess.Popen(
            [sys.executable, str(HELPERS / "mesh_stall.py"), str(r), "4", str(port), str(out)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for r in range(4)
    ]
    try:
        deadline = time.monotonic() + 90  # far below gloo's own 30 minutes
        while not out.exists() and time.monotonic() < deadline and ranks[0].poll() is None:
            time.sleep(0.2)
        assert out.exists(), "rank 0 is still waiting on the stalled group (no timeout)"
    finally:
        for proc in ranks:
            proc.kill()
            proc.wait()
    result = json.loads(out.read_text())
    assert result["raised"] is not None, result  # the collective failed, it did not complete
    assert TIMEOUT_S * 0.8 <= result["waited_s"] < TIMEOUT_S + 20, result
