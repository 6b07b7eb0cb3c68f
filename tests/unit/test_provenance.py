"""The idle probe sees a competing process; provenance facts are filled in."""

from __future__ import annotations

import subprocess
import sys

from dlscale.provenance import gpu_activity, host_activity, host_facts


def test_idle_probe_sees_a_busy_process():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        probe = host_activity(0.6)
    finally:
        hog.kill()
        hog.wait()
    assert probe["busy_cpus"] > 0.6, probe
    assert hog.pid in [p["pid"] for p in probe["top_processes"]], probe


def test_host_facts_and_gpu_activity_without_gpu():
    facts = host_facts()
    assert facts["node"] and facts["python"] and facts["cpu_count"] >= 1
    gpus = gpu_activity()
    if isinstance(gpus, dict):  # no nvidia-smi here: unavailable, with the reason
        assert gpus["available"] is False and "nvidia-smi" in gpus["reason"], gpus
    else:
        assert all("utilization_pct" in g for g in gpus)
