"""Rank discovery, the pre-flight check, and a real 2-rank local launch of one cell."""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from dlscale.rank import rank_context
from dlscale.run import launch
from dlscale.run.launchers import ports
from dlscale.run.train import PreflightError, preflight
from dlscale.store.metrics import read_metrics

from helpers.cells import cell_dict, small_cell


def test_discover_from_srun(monkeypatch):
    for k, v in {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "21234",
    }.items():
        monkeypatch.setenv(k, v)
    for k in ("DLSCALE_RANK", "SLURM_NTASKS_PER_NODE"):
        monkeypatch.delenv(k, raising=False)
    ctx = rank_context.discover()
    assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_index) == (
        3,
        4,
        1,
        2,
        1,
    )
    assert (ctx.master_addr, ctx.master_port, ctx.launcher) == ("n1", 21234, "srun")


def test_discover_from_torchrun(monkeypatch):
    for k in ("DLSCALE_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    for k, v in {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }.items():
        monkeypatch.setenv(k, v)
    ctx = rank_context.discover()
    assert (ctx.rank, ctx.world_size, ctx.local_world_size, ctx.launcher) == (1, 2, 2, "torchrun")


@pytest.mark.parametrize(
    "spec, node, expected", [("2(x3),1", 2, 2), ("2(x3),1", 3, 1), ("4", 0, 4)]
)
def test_tasks_per_node_parsing(spec, node, expected):
    assert (
        rank_context._tasks_on_this_node({"SLURM_TASKS_PER_NODE": spec, "SLURM_NODEID": str(node)})
        == expected
    )


def test_preflight_rejects_a_wrong_launch():
    ctx = rank_context.RankContext(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        node_index=0,
        node="n1",
        master_addr="x",
        master_port=1,
        launcher="srun",
    )
    preflight(ctx, 1, 1)
    with pytest.raises(PreflightError, match="world size is 1, the cell needs 2"):
        preflight(ctx, 2, 1)
    with pytest.raises(PreflightError, match="1 rank\\(s\\) on node n1, the cell needs 2"):
        preflight(ctx, 1, 2)


CELL = cell_dict()


def test_two_rank_local_launch_writes_a_valid_metrics_file(tmp_path):
    out = tmp_path / "cell" / "metrics.jsonl"
    code = launch.main(["--cell-json", json.dumps(CELL), "--output", str(out), "--git-commit", ""])
    assert code == 0
    records = read_metrics(out)
    ranks = {r["rank"] for r in records if r["event"] == "rank_end"}
    assert ranks == {0, 1}
    starts = [r["value"] for r in records if r["event"] == "rank_start"]
    assert {s["node_index"] for s in starts} == {0, 1}
    assert len({s["pid"] for s in starts}) == 2  # two real processes
    assert {s["backend"] for s in starts} == {"gloo"}
    assert records[0]["value"]["provenance"]["world_size"] == 2
    assert not (out.parent / ".ranks").exists()
    # system probes: every rank its binding, each node's local rank 0 the node's description
    assert all(s["cpu_affinity"] for s in starts)
    systems = [s["system"] for s in starts if s["local_rank"] == 0]
    assert len(systems) == 2 and all("system" not in s for s in starts if s["local_rank"])
    build = systems[0]["framework_build"]
    assert build["framework"] == "torch" and "PyTorch built with" in build["build"]
    assert all(s["probe_seconds"] < 1.0 for s in systems)
    sha = systems[0]["packages"]["sha256"]  # outside a study: the list is kept beside the cell
    text = (out.parent / "environments" / f"{sha}.txt").read_text()
    assert hashlib.sha256(text.encode()).hexdigest() == sha


def test_a_rendezvous_port_taken_before_rank_0_listens_starts_the_ranks_once_more(
    tmp_path, monkeypatch, capfd
):
    """The launcher chose the port free, and another program listened on it before rank 0 did
    (another study's ranks on this machine, which chose it in the same seconds): the ranks start
    once more, on a port drawn anew, and the cell is measured as if nothing had happened."""
    import socket

    from dlscale.run.launchers import local

    other = socket.socket()  # the other program, on the port the first draw returns
    held = ports.local_port(2)  # CELL's 2 ranks
    other.bind(("", held))
    other.listen()
    draws = []

    def chooser(world_size):
        draws.append(held if not draws else ports.local_port(world_size))
        return draws[-1]

    monkeypatch.setattr(local, "local_port", chooser)
    out = tmp_path / "cell" / "metrics.jsonl"
    try:
        code = launch.main(["--cell-json", json.dumps(CELL), "--output", str(out)])
    finally:
        other.close()
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    assert len(draws) == 2 and draws[1] != held
    assert "the rendezvous port was taken before rank 0 listened" in err
    assert re.search(r"(?i)rank0\.log: .*(address already in use|EADDRINUSE)", err), err[-3000:]
    records = read_metrics(out)
    assert {r["rank"] for r in records if r["event"] == "rank_end"} == {0, 1}
    assert len([r for r in records if r["event"] == "rank_start"]) == 2  # the second start's


def test_a_failing_rank_fails_the_cell_without_output(tmp_path, capfd):
    out = tmp_path / "cell" / "metrics.jsonl"
    bad = dict(CELL, model="no_such_model")
    code = launch.main(["--cell-json", json.dumps(bad), "--output", str(out)])
    assert code != 0 and not out.exists()
    err = capfd.readouterr().err
    assert "cell FAILED: rank" in err and "no_such_model" in err


def test_a_local_cells_ports_lie_below_the_ephemeral_range_and_are_all_free():
    """Local cells take a block below the ephemeral range (never a kernel-chosen port whose
    +1+rank neighbours other programs' connections may hold), skip a block where any port the
    ranks use is taken, and fail clearly when every block tried is."""

    ephemeral = ports.ephemeral_range()
    low, _ = ephemeral
    draws = iter([5, 9, 13])
    first = ports.port_block(5, ephemeral)
    busy = {first + 3}  # world size 2 uses base .. base + 3: this block is out
    port = ports.local_port(2, is_free=lambda p: p not in busy, draw=lambda _: next(draws))
    assert port == ports.port_block(9, ephemeral) and port + 3 < low
    assert port >= ports.PORT_FLOOR and (port - ports.PORT_FLOOR) % ports.PORT_BLOCK == 0
    with pytest.raises(RuntimeError, match="rendezvous ports"):
        ports.local_port(2, is_free=lambda p: False)


def test_wait_all_stops_the_rest_on_a_failure_and_everything_at_its_timeout():
    """launch.wait_all, as the local launcher and the multi-rank tests wait: a failed rank stops
    its live peers at once; with a timeout, ranks still running then are stopped and reported."""
    import subprocess
    import sys
    import time

    def ranks(*codes_after):
        return [
            (r, subprocess.Popen([sys.executable, "-c", code], start_new_session=True))
            for r, code in enumerate(codes_after)
        ]

    t0 = time.monotonic()
    procs = ranks("import time; time.sleep(60)", "raise SystemExit(3)")
    assert launch.wait_all(procs) == (1, 3)
    assert procs[0][1].returncode < 0 and time.monotonic() - t0 < 30

    t0 = time.monotonic()
    procs = ranks("import time; time.sleep(60)", "import time; time.sleep(60)")
    rank, code = launch.wait_all(procs, timeout=1.0)
    assert rank == 0 and code < 0
    assert all(p.returncode < 0 for _, p in procs) and time.monotonic() - t0 < 30

    procs = ranks("pass", "pass")
    assert launch.wait_all(procs, timeout=30) is None


# what srun printed when rank 0 failed and node n2 of the step was cut off: the exit of rank 0
# and the step's end, then nothing (srun waits for n2 until Slurm declares it down)
STUCK_SRUN = """#!/bin/sh
echo "srun: error: n1: task 0: Exited with exit code 1" >&2
echo "srun: launch/slurm: _step_signal: Terminating StepId=7.0" >&2
exec sleep 600
"""


def test_a_step_srun_cannot_end_fails_the_cell_at_once_naming_the_silent_node(
    tmp_path, monkeypatch
):
    """A node cut off mid-cell: its peer's collective times out and that rank exits, srun
    reports it and ends the step, but cannot reach the cut-off node's ranks, and waits for
    them (minutes: until Slurm declares the node down). The launcher stops the step once srun
    has not ended it within the grace and fails the cell naming the node it heard nothing
    from and its ranks."""
    import time

    from dlscale.study.cell import Cell

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text(STUCK_SRUN)
    (tmp_path / "bin" / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("DLSCALE_PACK_NODES", "n1,n2")  # the step's nodes, without squeue
    monkeypatch.setattr(launch, "STEP_END_GRACE_S", 1.0)
    cell = Cell.from_dict(cell_dict(nodes=2, ranks_per_node=1, launcher="srun"))
    rank_dir = tmp_path / "cell" / ".ranks"
    rank_dir.mkdir(parents=True)
    t0 = time.monotonic()
    failed = launch._run_ranks(cell, ["true"], rank_dir, dict(os.environ))
    assert failed == launch.STEP_STUCK and time.monotonic() - t0 < 15
    reason, suspects = launch.stuck_step_reason(rank_dir, cell)
    assert suspects == [1], reason
    assert reason.startswith("rank 0 exited with code 1, and srun could not end the step")
    assert "no word from node n2 (rank(s) 1)" in reason


def test_the_launcher_that_starts_a_cell_is_its_own_unless_srun_hands_a_one_rank_cell_over():
    """Inside the executor plugin's `srun -n1` step a 1-rank srun cell starts its rank there (a
    nested srun would wait for the CPUs that step holds); a larger cell, or one whose container
    engine starts only through srun (pyxis), keeps its own step; the local launcher is always
    itself. The launcher is chosen from the records, with no name compared."""
    from dlscale.run.launchers import launcher_for
    from dlscale.run.launchers.local import LocalLauncher
    from dlscale.run.launchers.srun import SrunLauncher
    from dlscale.study.cell import Cell

    one = small_cell(launcher="srun", nodes=1, global_batch=4)
    pyxis = Cell.from_dict(
        cell_dict(
            launcher="srun",
            nodes=1,
            global_batch=4,
            container={"engine": "pyxis", "image": "nvcr.io#pt"},
        )
    )
    in_step, outside = {"SLURM_STEP_ID": "0"}, {}
    assert isinstance(launcher_for(one, in_step), LocalLauncher)
    assert isinstance(launcher_for(one, outside), SrunLauncher)
    assert isinstance(launcher_for(small_cell(launcher="srun"), in_step), SrunLauncher)
    assert isinstance(launcher_for(pyxis, in_step), SrunLauncher)
    assert isinstance(launcher_for(small_cell(nodes=1, global_batch=4), in_step), LocalLauncher)
    assert SrunLauncher.watches_step and not LocalLauncher.watches_step


def test_fault_injection_takes_one_fault_per_cell_from_a_list(monkeypatch, capsys):
    """DLSCALE_FAULT may name several faults, `;`-separated, each for its own cell and rank:
    a rank gets the first that matches its cell folder and rank, and none elsewhere."""
    from dlscale.run.train import FAULT_ENV, fault_hook

    monkeypatch.setenv(FAULT_ENV, "n2/r1:0:1:3;n1/r2:1:setup:sleep0")
    assert fault_hook(0, "/s/runs/n1/r1/.ranks") is None  # no fault names this cell
    assert fault_hook(0, "/s/runs/n1/r2/.ranks") is None  # the fault is rank 1's
    hook = fault_hook(1, "/s/runs/n1/r2/.ranks")
    hook(0)  # another step: nothing happens
    hook("setup")
    assert "rank 1 sleeps 0 s before step setup" in capsys.readouterr().err
