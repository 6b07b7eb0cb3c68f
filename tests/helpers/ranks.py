"""Ranks a test starts as processes of its own: waited for together, and every one of them
stopped when the test ends, passed or failed (a rank whose peer died waits in a collective
until its timeout, minutes, and would outlive the test: the run lists it as left behind)."""

from __future__ import annotations

import subprocess


def outputs(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each rank's output (stdout, with stderr where the test merged it), in rank order, once
    all have ended; any rank still running when one fails or times out is killed."""
    try:
        return [p.communicate(timeout=timeout)[0] or "" for p in procs]
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill every rank still running and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.communicate(timeout=30)
        except (subprocess.TimeoutExpired, ValueError):
            p.wait()
