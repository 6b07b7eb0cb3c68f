"""`snakemake --profile profiles/slurm` on the project's real local Slurm cluster (2 nodes).

The cluster is started with scripts/slurm/cluster-up.sh, as a user would, and stopped at the
end if this module started it. Under CI=true these tests always run (never skip).
"""

from __future__ import annotations

import copy
import csv
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from dlscale.data.staging import MANIFEST

from helpers.checkout import ROOT, UP, copy_workflow, snakemake, tiny_study
from helpers.cluster_layout import layout
from helpers.lmod import lmod_missing, needs_lmod, write_testmod

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]

CELL_N1 = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n1/r1/metrics.jsonl"
CELL_N2 = "results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
WORKLOADS = ("runs", "convergence")  # the tiny study's cells' folders


@pytest.fixture(scope="module")
def slurm_study(cluster, tmp_path_factory):
    """The tiny study on the cluster, its hardware staging the dataset to the nodes'
    node-local scratch (each node its own: every node that runs a convergence cell copies the
    dataset once and its ranks read that copy; on the single-address fallback a folder of this
    host that the nodes share, so one node copies and the other waits for that copy), and
    loading a module of the test's own (site/modulefiles/testmod, on MODULEPATH as a login
    node's environment names a site's tree; the jobs inherit it) with env variables for its
    ranks (NCCL's interface, and on separate hosts the collectives' one, GLOO_SOCKET_IFNAME:
    the nodes' eth0), through the cluster's Lmod (without Lmod, outside CI, neither); with an
    sbatch and an srun option of the site's own (harmless on two free nodes, visible in what
    the ranks record)."""
    dest = tmp_path_factory.mktemp("slurm-study")
    nodes = layout()
    cpu = {
        "stage_dir": nodes.scratch if nodes.separate_hosts else str(dest / "node-local"),
        "sbatch_options": "--contiguous",
        "srun_options": "--distribution block:block",
    }
    with pytest.MonkeyPatch.context() as env:
        if not lmod_missing():
            tree, _ = write_testmod(dest / "site")
            env.setenv("MODULEPATH", str(tree))  # for the reruns below too
            cpu.update(modules=["testmod"], env=SITE_ENV[nodes.kind])
        yield tiny_study(dest, "profiles/slurm", hardware={"cpu": cpu})


# the entry's env: on separate hosts the collectives' interface too (the nodes' eth0)
SITE_ENV = {
    "hosts": {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "eth0"},
    "single": {"NCCL_SOCKET_IFNAME": "lo"},
}


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_node_cell_runs_on_two_distinct_nodes(slurm_study):
    recs = records(slurm_study / CELL_N2)
    prov = recs[0]["value"]["provenance"]
    starts = [r["value"] for r in recs if r["event"] == "rank_start"]
    assert prov["world_size"] == 2 and prov["launcher"] == "srun"
    assert prov["slurm_job_id"] and prov["slurm_job_id"].isdigit()
    assert len({s["node"] for s in starts}) == 2, starts
    assert sorted(s["node_index"] for s in starts) == [0, 1]
    assert {s["local_rank"] for s in starts} == {0}
    assert (slurm_study / "results/tiny/report/report.pdf").stat().st_size > 0


def test_master_addr_resolves_on_every_node_to_the_first_nodes_address(slurm_study):
    """Every 2-node cell's MASTER_ADDR (the first node's name) resolved, on each of its nodes,
    to the first node's own address on the cluster's network, never a loopback one; the cell's
    provenance records what it resolved to on each node."""
    nodes = layout()
    for workload in WORKLOADS:
        recs = records(slurm_study / CELL_N2.replace("/runs/", f"/{workload}/"))
        rendezvous = recs[0]["value"]["provenance"]["rendezvous"]
        master = rendezvous["master_addr"]
        assert set(rendezvous["resolved"]) == {"n1", "n2"}, rendezvous
        if not nodes.separate_hosts:  # the fallback: one host, 127.0.0.1 everywhere
            assert set(rendezvous["resolved"].values()) == {"127.0.0.1"}, rendezvous
            continue
        assert master == "n1" and rendezvous["resolved"] == {
            "n1": nodes.nodes["n1"].address,
            "n2": nodes.nodes["n1"].address,
        }, rendezvous
        assert not any(a.startswith("127.") for a in rendezvous["resolved"].values())


def test_every_rank_runs_with_its_entrys_modules_and_env(slurm_study):
    """A hardware entry's modules and env: the cpu entry's `modules: [testmod]` and `env:` reach
    every rank of every cell, on both nodes: each records the module's marker first on PATH, the
    module's variable and the env variables; the report's Systems table shows them. On separate
    hosts the 2-node cells' ranks bind the interface the entry names (GLOO_SOCKET_IFNAME)."""
    needs_lmod()
    marker = str(slurm_study / "site" / "testmod-bin")
    cells = [c.replace("/runs/", f"/{w}/") for c in (CELL_N1, CELL_N2) for w in WORKLOADS]
    starts = [
        r["value"] for c in cells for r in records(slurm_study / c) if r["event"] == "rank_start"
    ]
    assert len(starts) == 6 and len({s["node"] for s in starts}) == 2
    for start in starts:
        site = start["site_env"]
        assert site["modules"] == ["testmod"] and "testmod/1.0" in site["module_list"]
        assert site["module_vars"]["PATH"].split(":")[0] == marker
        assert site["module_vars"]["DLSCALE_TESTMOD"] == "loaded"
        assert site["env"] == SITE_ENV[layout().kind]
    if layout().separate_hosts:  # the site's interface, honoured by the 2-node cells' ranks
        two_node = [
            r["value"]["network"]
            for w in WORKLOADS
            for r in records(slurm_study / CELL_N2.replace("/runs/", f"/{w}/"))
            if r["event"] == "rank_start"
        ]
        assert len(two_node) == 4 and {n["interface"] for n in two_node} == {"eth0"}, two_node
        assert {n["chosen_by"] for n in two_node} == {"the site: GLOO_SOCKET_IFNAME=eth0"}
    systems = (slurm_study / "results/tiny/tables/systems.csv").read_text()
    assert "testmod (loaded: testmod/1.0)" in systems and "NCCL_SOCKET_IFNAME=lo" in systems


def test_the_entrys_sbatch_and_srun_options_reach_the_job_and_the_ranks_step(slurm_study):
    """The site's own options: the cpu entry's `sbatch_options: --contiguous` reach every cell job
    (rank 0 records its job as Slurm has it: Contiguous=1), and `srun_options: --distribution
    block:block` every cell's ranks' step: srun exports SLURM_DISTRIBUTION=block:block to each rank
    (a step of one task per node is `cyclic` by default inside a job). The 1-node cell too: the
    project's executor runs the launcher in the job itself (dlscale.workflow.jobstep), so its one
    rank starts through srun as well."""
    for cell in (CELL_N1, CELL_N2):
        starts = [r["value"] for r in records(slurm_study / cell) if r["event"] == "rank_start"]
        first = next(s for s in starts if s["node_index"] == 0 and s["local_rank"] == 0)
        job = first["system"]["slurm"]["job"]
        assert job["available"] and job["Contiguous"] == "1", job
        seen = {s["environment"].get("SLURM_DISTRIBUTION") for s in starts}
        assert seen == {"block:block"}, (cell, seen)


def test_convergence_cells_run_across_two_nodes_and_reach_their_target(slurm_study):
    """Real data on the cluster: the tiny study's convergence cells: the 2-node cell's ranks on
    2 distinct nodes under srun, every epoch's accuracy agreed by both, the target reached."""
    path = slurm_study / CELL_N2.replace("/runs/", "/convergence/")
    recs = records(path)
    starts = [r["value"] for r in recs if r["event"] == "rank_start"]
    assert recs[0]["value"]["provenance"]["launcher"] == "srun"
    assert len({s["node"] for s in starts}) == 2, starts
    outcome = recs[-2]["value"]
    assert recs[-2]["event"] == "convergence" and outcome["reached"] is True
    assert outcome["world_size"] == 2 and outcome["time_to_accuracy_s"] > 0
    # staged first: every rank of both convergence cells trains from its node's copy under
    # stage_dir, made once per node (by whichever rank of the node came first) and reused
    # after; on separate hosts each node has its own (none on the login side), on the
    # single-address fallback the nodes share one
    staging = [s["staging"] for s in starts]
    nodes = layout()
    if nodes.separate_hosts:
        scratch = [n.folder / "scratch" for n in nodes.nodes.values()]
        assert not list(Path(nodes.scratch).glob("dlscale-data-*"))  # the login side's own
    else:
        scratch = [slurm_study / "node-local"]
    copies = [c for folder in scratch for c in folder.glob("dlscale-data-*")]
    names = {c.name for c in copies}
    assert len(names) == 1 and len(copies) == len(scratch), copies
    assert {s["path"] for s in staging} == {str(Path(staging[0]["stage_dir"]) / names.pop())}
    n1 = records(slurm_study / CELL_N1.replace("/runs/", "/convergence/"))[-2]["value"]
    copy_bytes = sum(
        f.stat().st_size for f in copies[0].rglob("*") if f.is_file() and f.name != MANIFEST
    )
    assert outcome["staged_bytes"] + n1["staged_bytes"] == len(copies) * copy_bytes > 0
    assert outcome["staged_seconds"] > 0 and outcome["stage_dir"] == staging[0]["stage_dir"]
    # each rank's loader measured alone after training
    ends = [r["value"] for r in recs if r["event"] == "rank_end"]
    assert all(e["loader_only"]["batches"] >= 1 for e in ends)
    assert outcome["loader_train_ratio"] > 0 and isinstance(outcome["input_bound"], bool)
    table = (slurm_study / "results/tiny/tables/time_to_accuracy.csv").read_text()
    assert len(table.splitlines()) == 3  # header + 1 and 2 nodes
    assert (slurm_study / "results/tiny/figures/cpu/convergence/time_to_accuracy.pdf").exists()


def test_the_cells_ran_through_the_dlscale_executor_plugin(slurm_study):
    """profiles/slurm names the project's executor plugin (`executor: dlscale`): the driver
    journalled each cell job's submission (resume) and the cell's job ran its launcher with no
    Snakemake inside (its sbatch log holds the job step's line, not Snakemake's output)."""
    log = (slurm_study / "results/tiny/logs/driver.log").read_text()
    assert "cells run their launcher directly inside their Slurm jobs" in log, log
    journal = records(slurm_study / "results/tiny/logs/slurm_jobs.jsonl")
    job = records(slurm_study / CELL_N2)[0]["value"]["provenance"]["slurm_job_id"]
    submitted = [e for e in journal if e["event"] == "submitted" and e["cell"] == CELL_N2]
    assert str(job) in {str(e["slurm_job_id"]) for e in submitted}, journal
    (sbatch_log,) = (slurm_study / "results/logs/slurm").rglob(f"{job}.log")
    text = sbatch_log.read_text()
    assert "dlscale.workflow.jobstep: rule train_cpu_n2" in text, text[-2000:]
    assert "Building DAG" not in text and "slurm-jobstep" not in text, text[-2000:]


def test_rerunning_one_cell_reruns_that_cell_only(slurm_study):
    before_n1 = (slurm_study / CELL_N1).read_bytes()
    job_before = records(slurm_study / CELL_N2)[0]["value"]["provenance"]["slurm_job_id"]
    proc = snakemake(slurm_study, "--profile", "profiles/slurm", "--forcerun", CELL_N2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (slurm_study / CELL_N1).read_bytes() == before_n1  # untouched
    job_after = records(slurm_study / CELL_N2)[0]["value"]["provenance"]["slurm_job_id"]
    assert job_after != job_before
    assert proc.stderr.count("rule train_cpu_n2:") + proc.stdout.count("rule train_cpu_n2:") == 1


def test_a_failing_cell_is_reported_and_the_rest_completes(cluster, tmp_path):
    tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
    config = copy.deepcopy(tiny)
    config["workloads"] = ["throughput"]  # the fault below names a throughput cell's path
    config["axes"]["model"] = ["cnn_small", "transformer_small"]
    config["per_rank_batch"] = 2
    work = copy_workflow(tmp_path, config)
    env_fault = "cnn_small/weak/fp32/eager/n2:1:2:3"  # rank 1 of the 2-node cnn cell exits 3
    proc = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "snakemake"),
            "--profile",
            "profiles/slurm",
            "--retries",
            "0",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(
            os.environ,
            DLSCALE_FAULT=env_fault,
            PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
        ),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0  # the study reports the failure
    assert "Error in rule train_cpu_n2" in out
    log = (
        work / "results/tiny/logs/train/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1.log"
    ).read_text()
    assert "exits with 3" in log and "cell FAILED" in log
    assert not (work / CELL_N2).exists()
    # every other cell completed
    for model in ("cnn_small", "transformer_small"):
        for nodes in (1, 2):
            path = (
                work
                / f"results/tiny/runs/cpu/pytorch/{model}/weak/fp32/eager/n{nodes}/r1/metrics.jsonl"
            )
            if model == "cnn_small" and nodes == 2:
                continue
            assert path.exists(), path


def test_accounting_mode_with_sacct_status(cluster, tmp_path):
    """The same route with accounting (slurmdbd + MariaDB) and the plugin polling sacct."""
    up = subprocess.run(
        ["bash", str(UP), "--nodes", "2", "--accounting"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    try:
        tiny = yaml.safe_load((ROOT / "tests" / "fixtures" / "tiny.yaml").read_text())
        tiny["workloads"] = ["throughput"]
        work = copy_workflow(tmp_path, tiny)
        proc = snakemake(work, "--profile", "profiles/slurm", "--dlscale-status-command", "sacct")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        job = records(work / CELL_N2)[0]["value"]["provenance"]["slurm_job_id"]
        for _ in range(30):  # slurmdbd lags the controller by seconds
            sacct = subprocess.run(
                ["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,NNodes"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if sacct.stdout.split("\n")[0].strip() == "COMPLETED|2":
                break
            time.sleep(1)
        assert sacct.stdout.split("\n")[0].strip() == "COMPLETED|2", sacct.stdout + sacct.stderr
    finally:
        back = subprocess.run(
            ["bash", str(UP), "--nodes", "2"], capture_output=True, text=True, timeout=900
        )
        assert back.returncode == 0, back.stderr[-2000:]


def test_job_arrays_run_each_cell_once_in_its_own_task(cluster, tmp_path, tiny_config):
    """Two cells per resource class (1 and 2 nodes), arrays on: each class goes to Slurm as one
    job array, and every array task runs its own cell (not the first one's), with 2-node cells on
    2 nodes."""
    config = copy.deepcopy(tiny_config)
    config["workloads"] = ["throughput"]  # this test counts throughput cells
    config["repetitions"] = 2
    work = copy_workflow(tmp_path, config)
    # the opt-in array settings documented in profiles/slurm/config.yaml
    proc = snakemake(
        work,
        "--profile",
        "profiles/slurm",
        "--dlscale-array-jobs",
        "all",
        "--dlscale-array-limit",
        "40",
        "--jobs",
        "20000",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert out.count("Submitted array job") == 2, out[-3000:]
    rows = list(csv.DictReader((work / "results/tiny/tables/status.csv").open()))
    assert len(rows) == 4 and {r["status"] for r in rows} == {"ok"}, rows
    jobs = set()
    for nodes in (1, 2):
        for rep in (1, 2):
            run = work / f"results/tiny/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n{nodes}/r{rep}"
            recs = records(run / "metrics.jsonl")
            assert recs[0]["value"]["cell"]["rep"] == rep  # its own cell
            assert len({r["value"]["node"] for r in recs if r["event"] == "rank_start"}) == nodes
            job = json.loads((run / "slurm_job.json").read_text())
            assert job["array_job_id"] and job["array_task_id"], job
            jobs.add(job["slurm_job_id"])
            assert (
                work / f"results/logs/slurm/rule_train_cpu_n{nodes}/"
                f"{job['array_job_id']}_{job['array_task_id']}.log"
            ).exists()
    assert len(jobs) == 4


def fake_gpu_study(tmp_path, tiny_config, gpus_per_node: int):
    """The tiny study's 2-node cell on hardware that asks for GPUs as GRES (gpu:fake:N per node)
    on the local cluster's fake GPUs (cluster-up.sh: 2 per node, device files that are
    /dev/null). The ranks compute on the CPU (gpus_allocated_only): nothing can run on a fake
    GPU, but Slurm allocates, counts and binds them as it would real ones."""
    config = copy.deepcopy(tiny_config)
    config["workloads"] = ["throughput"]  # this test counts throughput cells
    config["axes"].update(hardware=["fakegpu"], nodes=[2])
    work = copy_workflow(tmp_path, config)
    hardware = yaml.safe_load((work / "config" / "hardware.yaml").read_text())
    hardware["fakegpu"] = dict(
        hardware["cpu"],
        description="the local cluster's fake GPUs",
        gpus_per_node=gpus_per_node,
        gpus_allocated_only=True,
        gpu_request="gres",
        gpu_type="fake",
    )
    (work / "config" / "hardware.yaml").write_text(yaml.safe_dump(hardware))
    return work


def test_a_gpu_request_is_accepted_allocated_and_runs(cluster, tmp_path, tiny_config):
    work = fake_gpu_study(tmp_path, tiny_config, gpus_per_node=1)
    proc = snakemake(work, "--profile", "profiles/slurm")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]  # the plugin accepted the request
    run = work / "results/tiny/runs/fakegpu/pytorch/cnn_small/weak/fp32/eager/n2/r1"
    job = json.loads((run / "slurm_job.json").read_text())
    # what Slurm allocated (scontrol show job -d, recorded by the launcher): one GPU per node
    alloc = job["allocation"]
    assert alloc["trespernode"] == "gres:gpu:fake:1", alloc
    assert alloc["job_gres"] == "gpu:fake:2" and alloc["numnodes"] == "2", alloc
    assert [n["gres"] for n in alloc["per_node"]] == ["gpu:fake:1(IDX:0)"], alloc
    # and what each rank saw: one bound GPU (recorded with its environment in the metrics)
    starts = [r["value"] for r in records(run / "metrics.jsonl") if r["event"] == "rank_start"]
    assert len({s["node"] for s in starts}) == 2
    for start in starts:
        assert start["environment"]["CUDA_VISIBLE_DEVICES"] == "0", start["environment"]
        assert start["environment"]["SLURM_GPUS_ON_NODE"] == "1"
    # the measurement folder keeps the allocation with the metrics
    kept = list(run.glob("measurements/*/slurm_job.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["allocation"] == alloc


def test_a_gpu_request_the_cluster_cannot_satisfy_fails_clearly(cluster, tmp_path, tiny_config):
    work = fake_gpu_study(tmp_path, tiny_config, gpus_per_node=4)  # the nodes have 2
    proc = snakemake(work, "--profile", "profiles/slurm", "--retries", "0", timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in out, out[-3000:]
    assert "gres=gpu:fake:4" in out  # the job's resources are printed beside the refusal
    assert not list((work / "results").glob("tiny/runs/**/metrics.jsonl"))
