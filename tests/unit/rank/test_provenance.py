"""The idle probe sees a competing process; provenance facts are filled in."""

from __future__ import annotations

import os
import subprocess
import sys

from dlscale.rank.provenance import gpu_activity, host_activity, host_facts


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU time from /proc/<pid>/stat, read by the test itself."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_idle_probe_sees_a_busy_process():
    """The probe reports a busy process with the CPU it really used: checked against the
    process's own CPU time around the probe, not against a share of the machine, so a loaded
    machine (the suite's workers; a load of 18 on 2 cores has starved the busy process below
    any fixed share) cannot fail it. Repeated until the busy process got CPU in the window."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    window = 0.6
    tick = 1 / os.sysconf("SC_CLK_TCK")
    try:
        for _ in range(10):
            before = _cpu_seconds(hog.pid)
            everyone = host_activity(window, top=10_000)
            used = _cpu_seconds(hog.pid) - before  # over a span that holds the probe's window
            if used >= 3 * tick:
                break
        probe = host_activity(0.2)
    finally:
        hog.kill()
        hog.wait()
    assert used >= 3 * tick, f"the busy process got {used} s of CPU in 10 windows"
    hog_seen = [p for p in everyone["top_processes"] if p["pid"] == hog.pid]
    assert hog_seen, everyone
    seen = hog_seen[0]["cpus"] * window  # CPU seconds the probe saw it use
    assert 0 < seen <= used + tick, (seen, used)
    # the host's busy CPUs count the busy process too
    assert everyone["busy_cpus"] >= hog_seen[0]["cpus"] - tick / window, everyone
    assert len(probe["top_processes"]) <= 3


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
    from dlscale.rank import provenance
    from dlscale.study.references import REFERENCES_SCHEMA, schema_path

    assert (provenance.PROJECT_ROOT / "Snakefile").is_file()
    monkeypatch.chdir(tmp_path)
    assert provenance.project_root() == provenance.PROJECT_ROOT
    assert schema_path() == provenance.PROJECT_ROOT / REFERENCES_SCHEMA


def test_a_rank_records_its_entrys_modules_and_env_as_it_sees_them(tmp_path):
    """The launcher's record (SITE_ENV_FILE: names) and the values in this rank's environment;
    secret-looking names redacted; nothing where the entry has neither."""
    import json

    from dlscale.rank.provenance import REDACTED, site_environment
    from dlscale.study.cell import SITE_ENV_FILE

    assert site_environment(tmp_path) is None
    launcher = {
        "modules": ["testmod"],
        "module_list": "Currently Loaded Modules:\n  1) testmod/1.0",
        "module_init": "/etc/profile.d/lmod.sh",
        "module_vars": ["PATH", "DLSCALE_TESTMOD", "GONE"],
        "env": ["NCCL_SOCKET_IFNAME", "SITE_TOKEN"],
    }
    (tmp_path / SITE_ENV_FILE).write_text(json.dumps(launcher))
    env = {"PATH": "/m:/bin", "DLSCALE_TESTMOD": "loaded", "NCCL_SOCKET_IFNAME": "lo"}
    site = site_environment(tmp_path, dict(env, SITE_TOKEN="s3cret"))
    assert site["module_vars"] == {"PATH": "/m:/bin", "DLSCALE_TESTMOD": "loaded", "GONE": None}
    assert site["env"] == {"NCCL_SOCKET_IFNAME": "lo", "SITE_TOKEN": REDACTED}
    assert site["modules"] == ["testmod"] and "testmod/1.0" in site["module_list"]
