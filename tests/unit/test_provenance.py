"""The idle probe sees a competing process; provenance facts are filled in."""

from __future__ import annotations

import subprocess
import sys

from dlscale.run.provenance import gpu_activity, host_activity, host_facts


def test_idle_probe_sees_a_busy_process():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        probe = host_activity(0.6)
        # every busy process listed: on a loaded machine (the suite's own parallel workers)
        # the hog need not be among the 3 busiest, but it is seen using the CPU
        everyone = host_activity(0.6, top=10_000)
    finally:
        hog.kill()
        hog.wait()
    assert probe["busy_cpus"] > 0.6, probe
    assert len(probe["top_processes"]) <= 3
    hog_seen = [p for p in everyone["top_processes"] if p["pid"] == hog.pid]
    assert hog_seen and hog_seen[0]["cpus"] > 0.1, everyone


def test_host_facts_and_gpu_activity_without_gpu():
    facts = host_facts()
    assert facts["node"] and facts["python"] and facts["cpu_count"] >= 1
    gpus = gpu_activity()
    if isinstance(gpus, dict):  # no nvidia-smi here: unavailable, with the reason
        assert gpus["available"] is False and "nvidia-smi" in gpus["reason"], gpus
    else:
        assert all("utilization_pct" in g for g in gpus)


def test_the_project_root_is_the_checkout_from_any_working_directory(tmp_path, monkeypatch):
    """provenance.PROJECT_ROOT is the checkout (its Snakefile), so the sources hash covers the
    whole project wherever the process starts (it was scripts/ for a while after the package
    moved a level down, hidden by the fallback to the working directory)."""
    from dlscale.run import provenance
    from dlscale.study.references import REFERENCES_SCHEMA, schema_path

    assert (provenance.PROJECT_ROOT / "Snakefile").is_file()
    monkeypatch.chdir(tmp_path)
    assert provenance.project_root() == provenance.PROJECT_ROOT
    assert schema_path() == provenance.PROJECT_ROOT / REFERENCES_SCHEMA
