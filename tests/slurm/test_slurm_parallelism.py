"""Sharded data parallel on the local Slurm cluster: a 2-node fsdp cell and a 2-node
hsdp cell of the tiny decoder through `snakemake --profile profiles/slurm`, their ranks started
by srun on the two nodes, ending in the report; each rank holds half of the model's parameter,
gradient and optimizer-state bytes under fsdp, all of them under hsdp (one rank per node:
sharded within the node, replicated across), as predicted, with AdamW's state, and
the report's memory table shows both.

On separate hosts node n2 has a second interface, on a network the other node cannot reach,
and its own name resolves to that interface's address on n2 (as a management network's address
can): gloo left to itself would bind it, for every process group a strategy makes; the ranks
take the interface that reaches the other node instead (dlscale.rank.network, by the route
there), and record it."""

from __future__ import annotations

import contextlib
import json

import pytest
import yaml

from helpers.checkout import ROOT, copy_workflow, snakemake
from helpers.cluster_layout import decoy_interface, layout

pytestmark = [pytest.mark.slurm, pytest.mark.workflow]


@pytest.fixture(scope="module")
def sharded_study(cluster, tmp_path_factory):
    config = yaml.safe_load((ROOT / "config/studies/parallelism.yaml").read_text())
    config["axes"].update(model=["gpt2_tiny"], nodes=[2], parallelism=["fsdp", "hsdp"])
    config.update(ranks_per_node=1, steps=4, exclude=[])  # the study's exclude names pp
    work = copy_workflow(tmp_path_factory.mktemp("parallelism"), config)
    nodes = layout()
    with decoy_interface(nodes.nodes["n2"]) if nodes.separate_hosts else contextlib.nullcontext():
        proc = snakemake(work, "--profile", "profiles/slurm", timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return work


@pytest.mark.parametrize("parallelism, share", [("fsdp", 0.5), ("hsdp", 1.0)])
def test_a_two_node_sharded_cell(sharded_study, parallelism, share):
    path = (
        sharded_study / "results/parallelism/runs/cpu/pytorch/gpt2_tiny/weak/fp32/eager"
        f"/{parallelism}/n2/r1/metrics.jsonl"
    )
    records = [json.loads(line) for line in path.read_text().splitlines()]
    start = records[0]["value"]
    assert start["cell"]["parallelism"] == parallelism
    assert start["provenance"]["launcher"] == "srun"
    ranks = [r["value"] for r in records if r["event"] == "rank_start"]
    assert len({r["node"] for r in ranks}) == 2  # distinct nodes
    if layout().separate_hosts:  # the interface that reaches n1, beside n2's second network
        network = {r["node"]: r["network"] for r in ranks}
        assert {n["interface"] for n in network.values()} == {"eth0"}, network
        assert network["n2"]["chosen_by"] == "the route to n1", network
    assert {r["parallelism"]["strategy"] for r in ranks} == {parallelism}
    ends = [r["value"] for r in records if r["event"] == "rank_end"]
    # fp32 parameters and gradients, AdamW's two moments (auto: the decoders' optimizer, issue
    # 48); the predicted state beside it, and the shard fraction under fsdp
    assert start["cell"]["optimizer"] == "adamw"
    full = (4 + 4 + 8) * ranks[0]["param_count"]
    for end in ends:
        m = end["memory"]
        held = m["param_bytes"] + m["grad_bytes"] + m["optimizer_state_bytes"]
        assert held == pytest.approx(share * full, rel=0.02)
        assert held == pytest.approx(m["predicted"]["state_bytes"], rel=0.02)
        assert m["predicted"]["full_state_bytes"] == full
    assert records[-1]["value"]["throughput_samples_per_s"] > 0


def test_the_sharded_study_reports(sharded_study):
    import pandas as pd

    cells = pd.read_csv(sharded_study / "results/parallelism/tables/cells.csv")
    assert sorted(cells["parallelism"]) == ["fsdp", "hsdp"]
    assert cells["state_bytes_per_rank_max"].notna().all()
    assert set(cells["optimizer"]) == {"adamw"}
    assert cells["predicted_state_bytes_per_rank_max"].notna().all()
    table = (sharded_study / "results/parallelism/report/memory_table.tex").read_text()
    assert " & fsdp & 2 & adamw & " in table and " & hsdp & 2 & adamw & " in table
    assert (sharded_study / "results/parallelism/report/report.pdf").stat().st_size > 0
