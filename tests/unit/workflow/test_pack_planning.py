"""Packing cells into allocations (dlscale.workflow.pack_plan, packing, pack_runner): how
packs are shaped and split, what the driver reports for a packed cell, and the pack runner itself
run for real on a manifest whose cells are small shell commands (a cell that fails, one that
passes its time limit, a node Slurm reports down): only `scontrol` is replaced, since no
allocation surrounds a unit test (tests/slurm/test_packing.py runs packs on the real cluster).
"""

from __future__ import annotations

import json
import math
import time
from types import SimpleNamespace

import pytest

from dlscale.store import pack_files
from dlscale.study.hashes import config_hash, hashed_hardware
from dlscale.study.resources import retried_runtime
from dlscale.workflow import pack_plan, pack_runner, packing
from dlscale.workflow.pack_plan import Pack, PackCell, pack_minutes, plan_packs
from dlscale.workflow.packing import cell_outcome


def cells(n: int, nodes: int = 1, runtime: int = 10, measured: float | None = None):
    return [PackCell(f"c{i:02d}", nodes, runtime, measured) for i in range(n)]


def test_twenty_one_node_cells_in_ten_cell_packs_take_two_allocations():
    packs, alone = plan_packs(cells(20), per_pack=10, max_time_min=None)
    assert [len(p.cells) for p in packs] == [10, 10] and not alone
    assert all(p.nodes == 1 for p in packs)
    # in order, none twice
    assert [c.path for p in packs for c in p.cells] == [f"c{i:02d}" for i in range(20)]


def test_a_pack_never_asks_for_more_than_the_partitions_maximum_time():
    # 10-minute cells, 30 s per step and 60 s per pack on top: 3 fit 35 minutes, not 4
    assert pack_minutes(cells(3)) == 33 and pack_minutes(cells(4)) == 43
    packs, alone = plan_packs(cells(7), per_pack=0, max_time_min=35)
    assert [len(p.cells) for p in packs] == [3, 3, 1] and not alone
    assert max(p.time_min for p in packs) <= 35
    # a cell that alone exceeds the limit is no pack's: it runs as its own job
    packs, alone = plan_packs(cells(2, runtime=40), per_pack=0, max_time_min=35)
    assert not packs and [c.path for c in alone] == ["c00", "c01"]


def test_measured_durations_size_the_pack_below_runtime_min():
    measured = cells(10, runtime=30, measured=20.0)  # 20 s measured, 1.5 x margin: 30 s each
    assert pack_minutes(measured) == 11  # (60 + 10 x (30 + 30)) s
    assert pack_minutes(cells(10, runtime=30)) == 306
    # the step's own limit stays the cell's runtime_min
    assert measured[0].limit_s == 1800


def test_a_pack_has_the_nodes_of_its_largest_cell():
    assert Pack([*cells(2), *cells(1, nodes=4)]).nodes == 4


# -- the pack's shape: list scheduling on the node count that ends first ------------------------
def test_one_node_cells_run_side_by_side_on_the_nodes_the_entry_allows():
    # 20 one-node cells of 10 min on at most 2 nodes: 10 rounds of 2, each (600 + 30) s
    pack = Pack(cells(20), max_width=2)
    assert pack.nodes == 2 and pack.time_min == math.ceil((60 + 10 * 630) / 60)
    assert pack.time_min < Pack(cells(20), max_width=2, concurrent=False).time_min / 1.9
    # never two cells on one node at once: each node's steps follow one another
    for node in (0, 1):
        mine = sorted((s.start_s, s.end_s) for s in pack.steps if node in s.nodes)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:])) and len(mine) == 10
    # with room for every cell, every cell at once
    assert Pack(cells(4), max_width=8).nodes == 4
    # the entry's width unknown: the largest cell's, as one at a time did
    assert Pack(cells(4)).nodes == 1


def test_packs_that_start_together_share_the_nodes_the_entry_allows():
    # two packs of ten one-node cells on 2 nodes: one node each, both at once (not 2 + 2)
    packs, _ = plan_packs(cells(20), per_pack=10, max_time_min=None, max_width=2)
    assert [p.nodes for p in packs] == [1, 1]
    packs, _ = plan_packs(cells(20), per_pack=10, max_time_min=None, max_width=4)
    assert [p.nodes for p in packs] == [2, 2]
    # the pack that ends last gets the spare nodes: 10 cells and 2 cells on 4 nodes
    packs, _ = plan_packs(cells(12), per_pack=10, max_time_min=None, max_width=4)
    assert [p.nodes for p in packs] == [3, 1]
    assert [p.time_min for p in packs] == [math.ceil((60 + 4 * 630) / 60), 22]
    # a 1-node and a 2-node series on 2 nodes: each pack keeps its largest cell's nodes
    mixed = cells(10) + [PackCell(f"w{i}", 2, 10) for i in range(10)]
    assert [p.nodes for p in plan_packs(mixed, 10, None, 2)[0]] == [1, 2]
    # a time limit a narrower pack would pass keeps the nodes it needs
    packs, _ = plan_packs(cells(8), per_pack=4, max_time_min=25, max_width=2)
    assert all(p.time_min <= 25 for p in packs)


def test_the_shape_that_ends_first_with_the_fewest_nodes():
    # a long cell beside three short ones ends at the long one's end on 2 nodes or on 4: 2
    mixed = [PackCell("long", 1, 30, 200.0), *cells(3, measured=40.0)]
    pack = Pack(mixed, max_width=4)
    assert pack.nodes == 2 and max(s.end_s for s in pack.steps) == 200.0 * 1.5 + 30
    # a 2-node cell and two 1-node cells of equal length: all at once on 4 nodes
    equal = [PackCell("wide", 2, 10), *cells(2)]
    assert Pack(equal, max_width=4).nodes == 4
    assert Pack(equal, max_width=3).time_min == math.ceil((60 + 2 * 630) / 60)


def test_cells_run_longest_first_and_in_order():
    measured = [PackCell(f"c{i}", 1, 30, took) for i, took in enumerate((10.0, 50.0, 30.0))]
    pack = Pack([*measured, PackCell("wide", 2, 1)], max_width=2)
    # measured durations x 1.5 (15, 75, 45 s) and the unmeasured one's runtime_min (60 s)
    assert [c.path for c in pack.cells] == ["c1", "wide", "c2", "c0"]
    starts = [s.start_s for s in pack.steps]
    assert starts == sorted(starts)  # no cell starts before one planned ahead of it
    serial = Pack([*measured, PackCell("wide", 2, 1)], max_width=2, concurrent=False)
    assert [c.path for c in serial.cells] == ["c0", "c1", "c2", "wide"]
    assert all(a.end_s <= b.start_s for a, b in zip(serial.steps, serial.steps[1:]))


def test_the_dry_run_prints_the_plan():
    cell = SimpleNamespace(hardware="cpu", framework="pytorch", nodes=1)
    todo = [SimpleNamespace(**vars(cell), path=f"results/s/runs/x/n1/r{r}/metrics.jsonl")
            for r in range(1, 5)]  # fmt: skip
    hw = {"cpu": {"partition": "p", "runtime_min": 10, "max_nodes": 2}}
    lines = packing.study_plan(todo, hw, {"pack": 10}, "results/s/runs", lambda p: (None, 8))
    assert lines[0] == "hardware cpu, pytorch: 4 cell(s) to measure"
    assert lines[1] == "pack 1: 4 cells side by side in one allocation of 2 node(s) and 22 min"
    assert lines[2].split() == "1. +0.0 min node(s) 1 x/n1/r1 (~10.5 min, runtime_min)".split()
    assert [ln.split()[4] for ln in lines[2:]] == ["1", "2", "1", "2"]
    assert [ln.split()[1] for ln in lines[2:]] == ["+0.0", "+0.0", "+10.5", "+10.5"]
    assert packing.study_plan(todo, hw, {"pack": False}, "results/s/runs") == []
    serial = packing.study_plan(
        todo, hw, {"pack": 10, "pack_steps": "serial"}, "r", lambda p: (None, 8)
    )
    assert "4 cells one at a time in one allocation of 1 node(s) and 43 min" in serial[1]


def test_pack_steps_takes_two_values():
    from pathlib import Path

    from dlscale.study.config import ConfigError, load_schema, validate_config

    root = Path(__file__).resolve().parents[3]
    schema = load_schema(root / "config" / "schemas" / "config.schema.json")
    base = {"study": "s", "axes": {"hardware": ["cpu"]}}
    with pytest.raises(
        ConfigError,
        match=r"pack_steps: .parallel. is not allowed; allowed values: concurrent, serial",
    ):
        validate_config({**base, "pack_steps": "parallel"}, schema)
    assert validate_config(base, schema)["pack_steps"] == "concurrent"
    hw = {"cpu": {"partition": "p", "runtime_min": 10}}
    assert config_hash({**base, "pack_steps": "serial"}, hw) == config_hash(base, hw)


@pytest.mark.parametrize(
    "text, minutes",
    [
        ("UNLIMITED", None),
        ("30", 30),  # minutes
        ("5:30", 6),  # minutes:seconds (seconds rounded up)
        ("1:00:00", 60),  # hours:minutes:seconds
        ("00:30:01", 31),
        ("1-12", 2160),  # days-hours
        ("0-12", 720),
        ("1-12:30", 2190),  # days-hours:minutes
        ("2-00:00:00", 2880),  # days-hours:minutes:seconds
        ("1-00:00:01", 1441),
    ],
)
def test_slurm_times_in_minutes(text, minutes):
    assert packing.slurm_minutes(text) == minutes


def test_the_setting_off_by_default():
    setting = pack_plan.pack_setting
    assert setting({}) is None and setting({"pack": False}) is None
    assert setting({"pack": True}) == 0 and setting({"pack": 10}) == 10


def test_what_the_driver_reports_for_a_packed_cell():
    assert cell_outcome({"state": "done"}, "COMPLETED", False) == ("done", "")
    assert cell_outcome(None, "PENDING", True) == ("running", "")
    assert cell_outcome({"state": "running"}, "RUNNING", True) == ("running", "")
    state, why = cell_outcome({"state": "timeout", "reason": "stopped at its time limit"}, "", True)
    assert state == "failed" and "time limit" in why
    # the allocation ended (its time limit, a cancel) before the cell had a final state
    state, why = cell_outcome({"state": "running"}, "TIMEOUT", False)
    assert state == "failed" and "TIMEOUT" in why and "after it started" in why
    assert "before it started" in cell_outcome(None, None, False)[1]


def test_packing_is_part_of_no_hash():
    config = {"axes": {"hardware": ["cpu"]}, "study": "s"}
    hw = {"cpu": {"partition": "p", "runtime_min": 10}}
    assert config_hash({**config, "pack": 10}, hw) == config_hash(config, hw)
    assert hashed_hardware({**hw["cpu"], "max_time_min": 60}) == hashed_hardware(hw["cpu"])


def test_a_retried_cell_gets_twice_the_time_up_to_the_partitions_maximum():
    assert retried_runtime(40)(None, 2) == 80
    assert retried_runtime(40, 60)(None, 2) == 60 and retried_runtime(40, 60)(None, 1) == 40


# -- the pack runner, for real -----------------------------------------------------------------
def manifest(tmp_path, entries, concurrent: bool = True) -> str:
    folder = tmp_path / "results" / "s" / "logs" / "packs" / "p1"
    folder.mkdir(parents=True)
    out = []
    for slot, (nodes, limit_s, shell) in enumerate(entries):
        target = tmp_path / f"out{slot}"
        payload = {
            "rule": "train",
            "jobid": slot,
            "shell": shell.format(out=target),
            "output": [str(target)],
            "log": [],
        }
        out.append({"slot": slot, "cell": f"cell{slot}", "nodes": nodes, "limit_s": limit_s,
                    "payload": payload})  # fmt: skip
    pack_files.write_json(
        folder / pack_files.MANIFEST, {"pack": "p1", "cells": out, "concurrent": concurrent}
    )
    return str(folder / pack_files.MANIFEST)


def states(path: str) -> dict[int, dict]:
    folder = packing.Path(path).parent
    return {int(p.stem): json.loads(p.read_text()) for p in folder.glob("[0-9]*.json")}


def test_a_failing_and_a_timed_out_cell_do_not_end_the_pack(tmp_path, monkeypatch):
    monkeypatch.setattr(pack_runner, "allocation_nodes", lambda: ["a", "b"])
    monkeypatch.setattr(pack_runner, "bad_nodes", lambda nodes: {})
    monkeypatch.setattr(pack_runner, "job_nodes", lambda job: None)
    monkeypatch.setattr(pack_runner, "GRACE_S", 5)
    path = manifest(
        tmp_path,
        [
            (1, 60, "exit 3"),
            (1, 1, "sleep 60"),
            (2, 60, 'echo "$DLSCALE_PACK_NODES $DLSCALE_PACK_SLOT" > {out}'),
        ],
    )
    assert pack_runner.main([path]) == 0
    got = states(path)
    assert got[0]["state"] == "failed" and got[0]["exit"] == 3
    assert got[1]["state"] == "timeout" and "time limit (1 s)" in got[1]["reason"]
    assert got[2]["state"] == "done" and got[2]["nodes"] == ["a", "b"]
    assert (tmp_path / "out2").read_text().split() == ["a,b", "2"]
    # a second run (a requeued allocation) runs no cell again
    (tmp_path / "out2").unlink()
    assert pack_runner.main([path]) == 0 and not (tmp_path / "out2").exists()


def test_a_node_that_fails_mid_pack_is_left_out_for_the_remaining_cells(tmp_path, monkeypatch):
    down = set()

    def bad_nodes(nodes):
        return {n: "DOWN*" for n in nodes if n in down}

    monkeypatch.setattr(pack_runner, "allocation_nodes", lambda: ["a", "b"])
    monkeypatch.setattr(pack_runner, "bad_nodes", bad_nodes)
    monkeypatch.setattr(pack_runner, "job_nodes", lambda job: None)
    # the first cell's node b goes down while it runs (the cell fails with it)
    monkeypatch.setattr(pack_runner, "run_cell", _failing_on_b(down, pack_runner.run_cell))
    path = manifest(
        tmp_path,
        [(2, 60, "exit 1"), (2, 60, "true"), (1, 60, 'echo "$DLSCALE_PACK_NODES" > {out}')],
    )
    assert pack_runner.main([path]) == 0
    got = states(path)
    assert got[0]["state"] == "failed" and got[0]["left_out"] == {"b": "DOWN*"}
    assert got[1]["state"] == "failed" and "1 healthy node(s) left of 2" in got[1]["reason"]
    assert got[2]["state"] == "done" and (tmp_path / "out2").read_text().strip() == "a"


def _failing_on_b(down, run_cell):
    def run(cell, nodes, pack, log):
        result = run_cell(cell, nodes, pack, log)
        if "b" in nodes and result[0] != "done":
            down.add("b")
        return result

    return run


def test_the_runner_reads_slurms_node_states(monkeypatch):
    out = (
        "NodeName=n1 Arch=x86_64 State=IDLE ThreadsPerCore=1\n"
        "NodeName=n2 Arch=x86_64 State=ALLOCATED+DRAIN ThreadsPerCore=1\n"
        "NodeName=n3 Arch=x86_64 State=DOWN* ThreadsPerCore=1\n"
    )
    monkeypatch.setattr(
        pack_runner.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=out, returncode=0)
    )
    assert pack_runner.bad_nodes(["n1", "n2", "n3"]) == {"n2": "ALLOCATED+DRAIN", "n3": "DOWN*"}


def test_runtime_min_above_the_partitions_maximum_time_is_refused():
    from pathlib import Path

    from dlscale.study.config import ConfigError, load_schema, load_yaml
    from dlscale.study.hardware import validate_hardware

    root = Path(__file__).resolve().parents[3]
    schema = load_schema(root / "config" / "schemas" / "hardware.schema.json")
    hw = load_yaml(root / "config" / "hardware.yaml")
    hw["cpu"].update(runtime_min=90, max_time_min=60)
    with pytest.raises(
        ConfigError, match=r"cpu.runtime_min: 90 minutes exceeds .*allowed: 1 to 60"
    ):
        validate_hardware(hw, schema)
    hw["cpu"]["runtime_min"] = 60
    assert validate_hardware(hw, schema)["cpu"]["max_time_min"] == 60


def test_a_series_measured_before_sizes_its_next_pack(tmp_path):
    import os

    series = tmp_path / "n1"
    for rep, took in (("r1", 40.0), ("r2", 55.0)):
        (series / rep).mkdir(parents=True)
        (series / rep / "slurm_job.json").write_text(json.dumps({"time": 1000.0}))
        metrics = series / rep / "metrics.jsonl"
        metrics.write_text("{}")
        os.utime(metrics, (1000.0 + took, 1000.0 + took))
    assert packing.measured_seconds(str(series / "r3" / "metrics.jsonl")) == 55.0
    assert packing.measured_seconds(str(tmp_path / "n2" / "r1" / "metrics.jsonl")) is None


def test_a_node_gone_from_the_allocation_is_left_out(monkeypatch):
    """sbatch --no-kill: Slurm takes a failed node out of the job's NodeList and the job goes
    on; the runner reads the NodeList (`scontrol show job`) before each cell."""
    monkeypatch.setattr(pack_runner, "job_nodes", lambda job: ["a"])
    monkeypatch.setattr(pack_runner, "bad_nodes", lambda nodes: {})
    assert pack_runner.unusable(["a", "b"], "7") == {"b": "left the allocation"}
    monkeypatch.setattr(pack_runner, "job_nodes", lambda job: None)  # Slurm does not answer
    assert pack_runner.unusable(["a", "b"], "7") == {}


def test_cells_run_side_by_side_on_disjoint_nodes_and_name_each_other(tmp_path, monkeypatch):
    """Two one-node cells at once on nodes a and b, then a 2-node cell once both are free; each
    state names the cells its step overlapped; cells start in the manifest's order. Serial:
    one at a time, none beside another."""
    monkeypatch.setattr(pack_runner, "allocation_nodes", lambda: ["a", "b"])
    monkeypatch.setattr(pack_runner, "bad_nodes", lambda nodes: {})
    monkeypatch.setattr(pack_runner, "job_nodes", lambda job: None)
    entries = [
        (1, 60, 'sleep 1; echo "$DLSCALE_PACK_NODES" > {out}'),
        (1, 60, 'sleep 1; echo "$DLSCALE_PACK_NODES" > {out}'),
        (2, 60, 'echo "$DLSCALE_PACK_NODES" > {out}'),
    ]
    path = manifest(tmp_path, entries)
    began = time.time()
    assert pack_runner.main([path]) == 0
    got = states(path)
    assert [got[i]["state"] for i in range(3)] == ["done"] * 3
    assert (got[0]["nodes"], got[1]["nodes"], got[2]["nodes"]) == (["a"], ["b"], ["a", "b"])
    assert got[1]["start"] < got[0]["end"] and got[0]["start"] < got[1]["end"]  # side by side
    assert got[2]["start"] >= max(got[0]["end"], got[1]["end"])
    assert got[0]["beside"] == ["cell1"] and got[1]["beside"] == ["cell0"]
    assert got[2]["beside"] == []
    assert time.time() - began < 2 * 1.0 + 1.5  # the two sleeps overlapped
    assert [i for i, _ in sorted(got.items(), key=lambda kv: kv[1]["start"])] == [0, 1, 2]
    serial = manifest(tmp_path / "serial", entries, concurrent=False)
    assert pack_runner.main([serial]) == 0
    got = states(serial)
    assert got[1]["start"] >= got[0]["end"] and all(not got[i]["beside"] for i in range(3))


def test_a_cell_whose_command_cannot_start_fails_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(pack_runner, "allocation_nodes", lambda: ["a", "b"])
    monkeypatch.setattr(pack_runner, "bad_nodes", lambda nodes: {})
    monkeypatch.setattr(pack_runner, "job_nodes", lambda job: None)
    real = pack_runner.run_cell

    def run_cell(cell, nodes, pack, log):
        if cell["slot"] == 0:
            raise PermissionError(13, "Permission denied", "bash")
        return real(cell, nodes, pack, log)

    monkeypatch.setattr(pack_runner, "run_cell", run_cell)
    path = manifest(tmp_path, [(1, 60, "true"), (1, 60, "true"), (2, 60, "true")])
    assert pack_runner.main([path]) == 0
    got = states(path)
    assert got[0]["state"] == "failed" and got[0]["exit"] is None
    assert "could not start: [Errno 13] Permission denied" in got[0]["reason"]
    assert got[1]["state"] == got[2]["state"] == "done"
