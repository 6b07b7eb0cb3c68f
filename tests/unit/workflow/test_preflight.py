"""The driver's side of the preflight (dlscale.workflow.preflight): which probes a study needs,
the key its result is kept under, the hold put on a cell's sbatch line, the refusal of a cell
whose entry failed, and the report's lines. The job's side runs in
tests/unit/run/test_preflight_job.py and the whole route on the local cluster in
tests/slurm/test_slurm_preflight.py."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import yaml
from snakemake.iocontainers import ResourceList

from dlscale.store.preflight_results import report_lines, write_result
from dlscale.study.cell import Cell
from dlscale.study.resources import preflight_sbatch_args
from dlscale.workflow import preflight

from helpers.cells import cell_dict

ROOT = Path(__file__).resolve().parents[3]
HARDWARE = yaml.safe_load((ROOT / "config" / "hardware.yaml").read_text())
CONFIG = {"preflight": True, "preflight_max_age_h": 24, "launcher": "srun", "ranks_per_node": 1}


def cells(*specs) -> list[Cell]:
    return [
        Cell.from_dict(
            cell_dict(
                hardware=hw,
                framework=fw,
                nodes=n,
                launcher="srun",
                device=HARDWARE[hw]["device"],
                global_batch=4 * n,
            )
        )
        for hw, fw, n in specs
    ]


STUDY = cells(("cpu", "pytorch", 1), ("cpu", "pytorch", 4), ("cpu", "horovod", 2))


class Job:
    """What the executor hands over: a rule's job with wildcards and the Slurm resources."""

    def __init__(self, hardware, framework, extra="--ntasks-per-node=1"):
        self.wildcards = {"hardware": hardware, "framework": framework}
        self.resources = ResourceList(fromdict={"slurm_extra": extra, "nodes": 1})

    def is_group(self):
        return False


def test_one_probe_per_entry_and_environment_on_at_most_two_nodes():
    probes = preflight.plan(STUDY, HARDWARE)
    assert sorted(probes) == [("cpu", "driver"), ("cpu", "horovod")]
    assert probes["cpu", "driver"].cell.nodes == 2  # the largest cell has 4 nodes
    assert probes["cpu", "horovod"].cell.nodes == 2
    local = [dataclasses.replace(c, launcher="local") for c in STUDY]
    assert preflight.plan(local, HARDWARE) == {}  # the local launcher: nothing to protect


def test_the_key_changes_with_the_entry_the_environment_and_the_declared_driver():
    probe = preflight.plan(STUDY, HARDWARE)["cpu", "driver"]
    same = preflight.plan(STUDY, {**HARDWARE, "cpu": dict(HARDWARE["cpu"])})["cpu", "driver"]
    assert probe.key == same.key and len(probe.key) == 12
    for change in ({"partition": "other"}, {"nvidia_driver": "535.104.05"}):
        hw = {**HARDWARE, "cpu": {**HARDWARE["cpu"], **change}}
        assert preflight.plan(STUDY, hw)["cpu", "driver"].key != probe.key, change
    other_env = [dataclasses.replace(c, environment="pytorch:other") for c in STUDY]
    assert preflight.plan(other_env, HARDWARE)["cpu", "driver"].key != probe.key


def test_a_cell_is_held_behind_its_preflight_submitted_once(tmp_path, monkeypatch):
    pf = preflight.Preflight(str(tmp_path), CONFIG, STUDY, HARDWARE, lambda hw, fw: "python")
    submitted = []
    monkeypatch.setattr(pf, "submit", lambda probe: submitted.append(probe.name) or "4242")
    monkeypatch.setattr(preflight, "_job_alive", lambda job: True)
    jobs = [Job("cpu", "pytorch"), Job("cpu", "pytorch"), Job("cpu", "horovod")]
    kept = pf.hold(jobs, refuse=lambda job, text: None)
    assert kept == jobs and len(submitted) == 2  # one per (entry, environment)
    extra = jobs[0].resources.get("slurm_extra")
    assert extra == "--ntasks-per-node=1 --dependency=afterok:4242 --kill-on-invalid-dep=yes"
    assert dict(jobs[0].resources.items())["slurm_extra"] == extra  # what the plugin reads
    other = Job("gpu-not-in-study", "pytorch")
    assert pf.hold([other], refuse=None) == [other]  # not a cell of the plan: unchanged


def result(probe, passed: bool, job="4242", age_s=0.0) -> dict:
    now = time.time() - age_s
    bad = {"name": "CUDA build on the node's driver", "ok": False, "detail": "driver 535"}
    bad["fix"] = "state nvidia_driver"
    return {
        "version": 1,
        "key": probe.key,
        "hardware": probe.hardware,
        "environment": probe.environment,
        "slurm_job": job,
        "host": "n1",
        "nodes": probe.cell.nodes,
        "ranks": probe.cell.world_size,
        "passed": passed,
        "checks": [] if passed else [bad],
        "failed": None if passed else bad,
        "started_at": now - 3,
        "finished_at": now,
    }


def test_after_a_failed_preflight_cells_are_refused_with_the_entry_and_the_fix(tmp_path):
    pf = preflight.Preflight(str(tmp_path), CONFIG, STUDY, HARDWARE, lambda hw, fw: "python")
    probe = pf.probes["cpu", "driver"]
    pf.jobs["cpu", "driver"] = "4242"
    pf.folder.mkdir(parents=True)
    write_result(pf.result_path(probe), result(probe, passed=False))
    refused = []
    kept = pf.hold([Job("cpu", "pytorch")], refuse=lambda job, text: refused.append(text))
    assert kept == [] and len(refused) == 1
    text = refused[0]
    for part in ("hardware entry 'cpu'", "environment 'driver'", "driver 535", "Fix: state"):
        assert part in text, part
    assert pf.explain(Job("cpu", "pytorch")) == text
    log = next(tmp_path.rglob("*.log")).read_text()  # said once, to the driver's log
    assert log.count("hardware entry 'cpu'") == 1


def test_a_fresh_passed_result_holds_nothing_and_submits_nothing(tmp_path, monkeypatch):
    pf = preflight.Preflight(str(tmp_path), CONFIG, STUDY, HARDWARE, lambda hw, fw: "python")
    monkeypatch.setattr(pf, "submit", lambda probe: (_ for _ in ()).throw(AssertionError))
    probe = pf.probes["cpu", "driver"]
    pf.folder.mkdir(parents=True)
    write_result(pf.result_path(probe), result(probe, passed=True, age_s=3600))
    job = Job("cpu", "pytorch")
    assert pf.hold([job], refuse=None) == [job]
    assert job.resources.get("slurm_extra") == "--ntasks-per-node=1"
    # older than preflight_max_age_h: repeated
    write_result(pf.result_path(probe), result(probe, passed=True, age_s=25 * 3600))
    pf2 = preflight.Preflight(str(tmp_path), CONFIG, STUDY, HARDWARE, lambda hw, fw: "python")
    monkeypatch.setattr(pf2, "submit", lambda probe: "77")
    pf2.hold([job], refuse=None)
    assert "--dependency=afterok:77" in job.resources.get("slurm_extra")


def test_the_preflight_job_asks_for_the_cells_resources_on_its_nodes():
    args = preflight_sbatch_args({"ranks_per_node": 2}, HARDWARE["h100"], 2, 4, 10)
    assert "--partition=gpu-h100" in args and "--nodes=2" in args and "--time=10" in args
    assert "--ntasks=8" in args and "--ntasks-per-node=4" in args
    assert "--gpus-per-node=h100:4" in args and "--exclusive" in args
    one = preflight_sbatch_args({"ranks_per_node": 2}, HARDWARE["h100"], 1, 1, 10)
    assert "--ntasks=1" in one and "--gpus-per-node=h100:1" in one  # a 1-GPU study's probe


def test_the_report_says_what_the_preflight_found_or_why_none_ran(tmp_path):
    probe = preflight.plan(STUDY, HARDWARE)["cpu", "driver"]
    write_result(tmp_path / f"{probe.name}.json", result(probe, passed=True))
    (tmp_path / f"{probe.name}.spec.json").write_text(json.dumps({"key": probe.key}))
    lines = report_lines(tmp_path, CONFIG)
    assert len(lines) == 1 and lines[0].startswith("Preflight: cpu / driver: passed (Slurm job")
    assert (
        "skipped (--config preflight=False)"
        in report_lines(tmp_path, {**CONFIG, "preflight": False})[0]
    )
    assert "local launcher" in report_lines(tmp_path, {**CONFIG, "launcher": "local"})[0]
