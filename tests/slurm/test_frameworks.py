"""Every framework through `snakemake --profile profiles/slurm`: a 1-rank cell and a 2-rank cell
across the 2 nodes of the local cluster each, throughput and time to accuracy (digits, one
repetition per point), in one mixed study that ends in the report.

On separate hosts each framework's 2-node cell records the interface its ranks took: the one
that reaches the other node (dlscale.rank.network, by the route there)."""

from __future__ import annotations

import json

import pytest
import yaml

from dlscale.registry import frameworks
from dlscale.store.preflight_results import read_result

from helpers.checkout import ROOT, copy_workflow, snakemake
from helpers.cluster_layout import layout

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]
FRAMEWORKS = frameworks.names()  # every registered framework, end to end


@pytest.fixture(scope="module")
def mixed_study(cluster, tmp_path_factory):
    config = yaml.safe_load((ROOT / "config/studies/frameworks.yaml").read_text())
    config["axes"]["model"] = ["cnn_small"]
    config["steps"] = 4
    # the study's time to accuracy in every framework over srun, once per point (the study
    # itself runs 6 repetitions for an order-statistic interval: 60 cells, 20-30 min here)
    config["convergence"]["repetitions"] = 1
    work = copy_workflow(tmp_path_factory.mktemp("frameworks"), config)
    proc = snakemake(work, "--profile", "profiles/slurm", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return work


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("nodes", [1, 2])
def test_framework_cell(mixed_study, framework, nodes):
    path = (
        mixed_study
        / f"results/frameworks/runs/cpu/{framework}/cnn_small/weak/fp32/eager/n{nodes}/r1"
        / "metrics.jsonl"
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    start = records[0]["value"]
    assert start["cell"]["framework"] == framework
    assert start["provenance"]["world_size"] == nodes
    assert start["provenance"]["launcher"] == "srun"
    ranks = [r["value"] for r in records if r["event"] == "rank_start"]
    assert len({r["node"] for r in ranks}) == nodes  # distinct nodes
    assert {r["param_count"] for r in ranks} == {391_466}  # the same model everywhere
    assert {r["per_rank_batch"] for r in ranks} == {8}
    assert records[-1]["value"]["throughput_samples_per_s"] > 0
    # the system probes: every rank records its CPU binding; each node's first rank describes its
    # node, every section present or explained, the job's allocation from scontrol
    assert all(r["cpu_affinity"] for r in ranks)
    systems = [r["system"] for r in ranks if "system" in r]
    assert len(systems) == nodes
    for system in systems:
        for section in ("os", "cpu", "memory", "gpu", "network", "slurm", "packages"):
            assert system[section]["available"] or system[section]["reason"], section
        assert system["framework_build"]["available"], system["framework_build"]
        assert system["slurm"]["version"] and system["probe_seconds"] < 5
    job = systems[0]["slurm"]["job"]  # rank 0 asks the controller once per cell
    assert job["available"] and job["NumNodes"] == str(nodes), job
    # the interface that reaches the other node
    if nodes == 2 and layout().separate_hosts:
        network = {r["node"]: r["network"] for r in ranks}
        assert {n["interface"] for n in network.values()} == {"eth0"}, network
        assert network["n2"]["chosen_by"] == "the route to n1", network


def test_every_environment_passed_its_preflight_on_two_nodes(mixed_study):
    """The preflight: one per environment of the study (keras shares tensorflow's), each run
    on the cluster before its cells: the framework imported on 2 nodes; the environments with
    torch formed a gloo communicator and measured its all-reduce."""
    found = map(read_result, (mixed_study / "results/frameworks/preflight").glob("*.json"))
    results = {r["environment"]: r for r in found if r}
    assert sorted(results) == ["driver", "horovod", "mxnet", "tensorflow"]
    for env, result in results.items():
        assert result["passed"] and result["nodes"] == 2 and result["ranks"] == 2, result
        checks = {c["name"]: c for c in result["checks"]}
        assert checks["framework import"]["ok"], env
        if env in ("driver", "horovod"):
            assert result["allreduce"]["busbw_gbps"] > 0 and result["allreduce"]["n"] == 5
        else:  # no torch.distributed there: the cells form their collective first
            assert "not checked" in checks["communicator"]["detail"], checks
    report = (mixed_study / "results/frameworks/report/systems_table.tex").read_text()
    assert report.count("Preflight: ") == 4 and "passed" in report


def test_mixed_study_report(mixed_study):
    import pandas as pd

    cells = pd.read_csv(mixed_study / "results/frameworks/tables/cells.csv")
    assert sorted(cells["framework"].unique()) == sorted(FRAMEWORKS)
    assert (mixed_study / "results/frameworks/report/report.pdf").stat().st_size > 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_framework_reaches_the_target_over_srun(mixed_study, framework):
    import pandas as pd

    cells = pd.read_csv(mixed_study / "results/frameworks/tables/convergence.csv")
    mine = cells[cells["framework"] == framework].set_index("nodes")
    assert sorted(mine.index) == [1, 2]
    for nodes in (1, 2):
        row = mine.loc[nodes]
        assert row["reached"], (framework, nodes, row.to_dict())
        assert row["best_val_accuracy"] >= 0.95
        assert row["epochs_to_accuracy"] <= 10


def test_the_report_compares_time_to_accuracy_across_frameworks(mixed_study):
    import pandas as pd

    tta = pd.read_csv(mixed_study / "results/frameworks/tables/time_to_accuracy.csv")
    assert sorted(tta["framework"].unique()) == sorted(FRAMEWORKS)
    assert set(tta["convergence_validity"]) <= {"reference", "in_band", "too_fast", "too_slow"}
    figure = mixed_study / "results/frameworks/figures/cpu/convergence/time_to_accuracy.pdf"
    assert figure.stat().st_size > 0
