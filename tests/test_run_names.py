"""A run of the suite keeps to its own names and sees what it leaves behind
(tests/helpers/run_names.py): a process that carries a run's name, or names one of its folders,
and a folder named after it are listed at the end of that run, and only that run's; two claims
at once get two slots; the ports of two slots' clusters never meet."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from helpers import run_names

OTHER_RUN = "r99"  # a run name no claim gives (slots are r0..r7): this test's own


# a process that says it runs, then sleeps
SLEEP = "import time; print('up', flush=True); time.sleep(60)"


def started(argv: list[str], env: dict) -> subprocess.Popen:
    """The process, once it runs its own code: just after its exec its command line and
    environment can still read empty in /proc (the kernel fills them in after waking the
    parent), which a loaded machine showed (a listing that missed a process started a moment
    before)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    return proc


@pytest.fixture
def other_run():
    yield OTHER_RUN
    run_names.remove_run_folders(OTHER_RUN)


def test_a_process_and_a_folder_of_a_run_are_listed_as_left_behind(other_run):
    folder = run_names.RUN_PREFIX + f"{other_run}-work"
    os.makedirs(folder, exist_ok=True)
    env = {**os.environ, run_names.RUN_VARIABLE: other_run}
    sleeper = started([sys.executable, "-c", SLEEP], env=env)
    try:
        left = run_names.leftovers(other_run, settle_s=0)
        assert any(line.startswith(f"process {sleeper.pid}:") for line in left), left
        assert f"folder {folder}" in left
        # this run's own listing does not name another run's process or folder
        mine = run_names.run_processes(run_names.run_name())
        assert not any(f"process {sleeper.pid}:" in line for line in mine)
    finally:
        sleeper.kill()
        sleeper.communicate()  # its pipe closed too
    run_names.remove_run_folders(other_run)
    assert run_names.leftovers(other_run, settle_s=5) == []


def test_a_process_that_names_a_run_folder_is_listed(other_run):
    folder = run_names.RUN_PREFIX + f"{other_run}-slurm"
    sleeper = started(
        [sys.executable, "-c", SLEEP, folder],
        env={k: v for k, v in os.environ.items() if k != run_names.RUN_VARIABLE},
    )
    try:
        assert any(f"process {sleeper.pid}:" in line for line in run_names.run_processes(other_run))
    finally:
        sleeper.kill()
        sleeper.communicate()  # its pipe closed too


def test_two_claims_at_once_get_two_slots():
    """A second run on the machine (a fresh process with no run name) claims another slot
    while this run holds its own."""
    env = {k: v for k, v in os.environ.items() if k != run_names.RUN_VARIABLE}
    code = "from helpers import run_names; print(run_names.claim())"
    tests = os.path.dirname(__file__)
    other = subprocess.run(
        [sys.executable, "-c", code], env={**env, "PYTHONPATH": tests},
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert other.startswith("r") and other != run_names.run_name()


def test_the_clusters_of_every_slot_have_ports_of_their_own(monkeypatch):
    seen: dict[str, tuple] = {}
    for slot, index in itertools.product(range(run_names.SLOTS), range(10)):
        monkeypatch.setenv(run_names.RUN_VARIABLE, f"r{slot}")
        ports = run_names.cluster_ports(index)
        ports.pop("DLSCALE_SLURM_FIRST_JOB_ID")
        for port in ports.values():
            assert port not in seen, (port, seen[port], (slot, index))
            assert not 32768 <= int(port) <= 60999  # Linux's default ephemeral range
            seen[port] = (slot, index)


def test_the_clusters_of_every_slot_have_networks_of_their_own(monkeypatch):
    """Each cluster's nodes' network (cluster-up.sh, separate hosts): a name that carries the
    run's (what leftovers() looks for) and fits an interface name with its node suffix (15
    characters: `<net>n64`), and a /24 of its own."""
    names, subnets = set(), set()
    for slot, index in itertools.product(range(run_names.SLOTS), range(run_names.CLUSTERS_PER_RUN)):
        monkeypatch.setenv(run_names.RUN_VARIABLE, f"r{slot}")
        net = run_names.cluster_network(index)
        name, subnet = net["DLSCALE_SLURM_NET"], net["DLSCALE_SLURM_SUBNET"]
        assert name.startswith(f"dlr{slot}") and len(f"{name}n64") <= 15
        assert 0 <= int(subnet.split(".")[-1]) <= 255
        names.add(name)
        subnets.add(subnet)
    assert len(names) == len(subnets) == run_names.SLOTS * run_names.CLUSTERS_PER_RUN
    with pytest.raises(ValueError):
        run_names.cluster_network(run_names.CLUSTERS_PER_RUN)


def test_two_runs_clusters_start_their_job_ids_in_different_rendezvous_port_blocks(monkeypatch):
    """The rendezvous port is seeded by the job id: the clusters of two runs at once seed
    different port blocks for their first jobs (dlscale.run.launchers.ports.port_block)."""
    from dlscale.run.launchers.ports import port_block

    blocks = {}
    for slot, index in itertools.product(range(2), range(run_names.CLUSTERS_PER_RUN)):
        monkeypatch.setenv(run_names.RUN_VARIABLE, f"r{slot}")
        first = int(run_names.cluster_ports(index)["DLSCALE_SLURM_FIRST_JOB_ID"])
        for job in range(first, first + run_names.JOB_IDS_APART):
            block = port_block(job, (32768, 60999))
            assert block not in blocks, (job, blocks[block], (slot, index))
            blocks[block] = (slot, index)
