"""Ranks a test starts as processes of its own: waited for together, and every one of them
stopped when the test ends, passed or failed (a rank whose peer died waits in a collective
until its timeout, minutes, and would outlive the test: the run lists it as left behind)."""

from __future__ import annotations

import subprocess
import threading
import time


def outputs(procs: list[subprocess.Popen], timeout: float) -> list[str]:
    """Each rank's output (stdout, with stderr where the test merged it), in rank order, once
    all have ended. Where one is still running after `timeout` s, or as soon as one has failed
    while others still run (they would wait on it), every rank still running is killed and the
    test fails with each rank's exit status and the end of its output."""
    logs = [""] * len(procs)

    def read(r: int) -> None:  # each rank's pipe drained as it writes (a full pipe blocks it)
        logs[r] = (procs[r].communicate()[0] or "") if procs[r].stdout else ""

    readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(len(procs))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = any(p.poll() not in (None, 0) for p in procs)
            if failed or time.monotonic() > deadline:
                stop(procs)
                for reader in readers:
                    reader.join(30)
                why = "a rank failed" if failed else f"still running after {timeout:.0f} s"
                raise AssertionError(
                    f"{why}; every rank stopped:\n"
                    + "\n".join(
                        f"--- rank {r}: exit {p.returncode}\n{log[-2000:]}"
                        for r, (p, log) in enumerate(zip(procs, logs))
                    )
                )
            time.sleep(0.2)
        for reader in readers:
            reader.join(30)
        return logs
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill every rank still running and reap it."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()
