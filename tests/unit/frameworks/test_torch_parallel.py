"""The parallelism axis: one typed record of parallel dimensions, strategies declared by the
frameworks and refused before any job, degrees checked against the ranks per node, ddp cells
unchanged (path, identity, hash), cells of each strategy run through the launcher with their
memory per rank in the metrics and cells.csv, and a rank out of memory recorded as a result.
Every strategy trained on real ranks against the single-process loss:
test_torch_parallel_ranks.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from dlscale.registry import frameworks
from dlscale.registry.parallel_dims import ParallelDims, degree_problems
from dlscale.registry.strategies import STRATEGIES
from dlscale.study.cell import (
    CELL_PATTERN,
    Cell,
    cell_label,
    parse_cell_path,
    path_key,
    study_dir_of,
    train_rule,
)
from dlscale.study.config import ConfigError
from dlscale.study.hashes import config_hash
from dlscale.study.matrix import load_study

from helpers.cells import cell_dict, launch_cell


# ---- the typed record -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "strategy, nodes, rpn, tp, dims",
    [
        ("ddp", 2, 2, 1, (4, 1, 1)),
        ("fsdp", 2, 2, 1, (1, 4, 1)),
        ("hsdp", 2, 2, 1, (2, 2, 1)),
        ("hsdp", 2, 1, 1, (2, 1, 1)),
        ("tp", 2, 2, 2, (2, 1, 2)),
        ("fsdp+tp", 2, 4, 2, (1, 4, 2)),
        ("tp", 1, 4, 4, (1, 1, 4)),
    ],
)
def test_each_strategy_maps_to_degrees_whose_product_is_the_world(strategy, nodes, rpn, tp, dims):
    d = ParallelDims.of(strategy, nodes, rpn, tp)
    assert (d.dp_replicate, d.dp_shard, d.tp) == dims
    assert d.world_size == nodes * rpn and d.pp == 1
    assert d.mesh() == (dims, ("dp_replicate", "dp_shard", "tp"))


def test_impossible_degrees_are_refused_with_the_allowed_values():
    with pytest.raises(
        ValueError,
        match="must divide the ranks per node .4.: its ranks share a node; allowed: 1, 2, 4",
    ):
        ParallelDims(1, 1, 3, ranks_per_node=4)
    with pytest.raises(ValueError, match="dp_shard must be an integer >= 1"):
        ParallelDims(1, 0, 1, ranks_per_node=1)
    with pytest.raises(ValueError, match=re.escape(f"allowed values: {', '.join(STRATEGIES)}")):
        ParallelDims.of("zero3", 1, 1)
    (msg,) = degree_problems("tp", 2, 4, 3, "hardware 'cpu'")
    assert "tp_degree: 3" in msg and "allowed: 2, 4" in msg
    (msg,) = degree_problems("fsdp+tp", 2, 1, None, "hardware 'cpu'")
    assert "at least 2 ranks per node" in msg and "ranks_per_node 1" in msg
    assert degree_problems("fsdp", 2, 1, 3, "x") == []  # tp_degree only for tp strategies


# ---- the study: refused before any job --------------------------------------------------------
# every strategy a node of 2 ranks runs: a pipeline of tensor-parallel stages needs 4 ranks
# (tests/unit/frameworks/test_torch_pipeline.py plans those)
ONE_NODE_STRATEGIES = [n for n, s in STRATEGIES.items() if not (s.pipeline and s.splits_layers)]


def parallel_config(base_config, **changes) -> dict:
    config = copy.deepcopy(base_config)
    config["workloads"] = ["throughput"]
    config["axes"]["model"] = ["transformer_small"]
    config["axes"]["parallelism"] = list(ONE_NODE_STRATEGIES)
    config["ranks_per_node"] = 2
    for key, value in changes.items():
        if key in config["axes"]:
            config["axes"][key] = value
        else:
            config[key] = value
    return config


def test_a_study_puts_every_strategy_beside_frameworks_and_node_counts(root, base_config):
    study = load_study(parallel_config(base_config), root)
    by = {}
    for cell in study.cells:
        by.setdefault(cell.parallelism, []).append(cell)
    assert sorted(by) == sorted(ONE_NODE_STRATEGIES)
    # micro-batches: at least twice the stages, 1F1B by default
    assert {(c.world_size, c.pp_degree, c.microbatches) for c in by["pp"]} == {(2, 2, 4), (4, 4, 8)}
    assert {c.pp_schedule for c in by["pp"]} == {"1f1b"}
    assert {(c.pp_degree, c.microbatches) for c in by["ddp"] + by["tp"]} == {(1, 1)}
    assert {c.tp_degree for c in by["tp"] + by["fsdp+tp"]} == {2}  # null: the ranks per node
    assert {c.tp_degree for c in by["fsdp"] + by["hsdp"] + by["ddp"]} == {1}
    fsdp = by["fsdp"][0]
    assert "/eager/fsdp/n" in fsdp.path and "/eager/n" in by["ddp"][0].path
    assert parse_cell_path(fsdp.path)["parallelism"] == "fsdp"
    assert parse_cell_path(by["ddp"][0].path)["parallelism"] == "ddp"
    assert study_dir_of(fsdp.path) == study_dir_of(by["ddp"][0].path) == Path("results/demo")
    assert "/fsdp+tp/" in cell_label(parse_cell_path(by["fsdp+tp"][0].path))
    assert Cell.from_json(fsdp.to_json()) == fsdp
    assert len({c.path for c in study.cells}) == len(study.cells)
    assert ("throughput", "cpu", 1, "fsdp+tp", None) in study.train_rules()
    assert train_rule("throughput", "fsdp+tp").format(hardware="cpu", nodes=2) == (
        "train_cpu_n2_fsdp_tp"
    )
    assert "parallelism" in path_key("fsdp") and "parallelism" not in path_key("ddp")


@pytest.mark.parametrize(
    "changes, message",
    [
        (
            {"framework": ["pytorch", "tensorflow"], "parallelism": ["ddp", "fsdp"]},
            "'fsdp' is not supported by framework 'tensorflow' \\(it supports: ddp\\); "
            "frameworks that run fsdp: pytorch",
        ),
        (
            {"model": ["cnn_small"], "parallelism": ["tp"]},
            "'tp' needs a model with a tensor-parallel plan .*model 'cnn_small' has none; "
            "allowed models: transformer_small",
        ),
        ({"ranks_per_node": 1, "parallelism": ["fsdp+tp"]}, "at least 2 ranks per node"),
        (
            {"ranks_per_node": 4, "tp_degree": 3, "parallelism": ["tp"]},
            "tp_degree: 3 .*allowed: 2, 4",
        ),
        ({"parallelism": ["zero3"]}, "zero3.*" + re.escape(", ".join(STRATEGIES))),
        (
            {"model": ["gpt2_tiny"], "parallelism": ["pp"]},
            "'pp' needs a model the pipeline can split .*allowed models: transformer_small",
        ),
        (
            {"ranks_per_node": 4, "nodes": [2], "parallelism": ["pp"]},
            "8 stages .8 ranks x 1 under 1f1b. but the model has 4 layers",
        ),
        (
            {"pp_degree": 3, "parallelism": ["pp"]},
            "pp_degree: 3 does not divide the 2 pipeline ranks",
        ),
        ({"mode": ["eager", "compiled"], "parallelism": ["pp"]}, "allowed with pp: eager"),
        (
            {"microbatches": 3, "parallelism": ["pp"]},
            "microbatches: 3 does not divide a pipeline's batch of 64",
        ),
        (
            {"model": ["gpt2_tiny"], "ranks_per_node": 4, "tp_degree": 4, "parallelism": ["tp"]},
            "heads of model 'gpt2_tiny' \\(2 heads\\) over tensor-parallel degree 4",
        ),
    ],
)
def test_unsupported_combinations_are_refused_before_any_job(root, base_config, changes, message):
    with pytest.raises(ConfigError, match=message):
        load_study(parallel_config(base_config, **changes), root)


def test_an_excluded_combination_is_not_refused(root, base_config):
    config = parallel_config(
        base_config,
        framework=["pytorch", "tensorflow"],
        parallelism=["ddp", "fsdp"],
        exclude=[{"framework": "tensorflow", "parallelism": "fsdp"}],
    )
    study = load_study(config, root)
    assert not [c for c in study.cells if c.framework == "tensorflow" and c.parallelism == "fsdp"]


def test_a_pipeline_excluded_at_a_node_count_is_checked_only_where_it_runs(root, base_config):
    """pp+tp on 2 ranks per node leaves 1 stage at 1 node: refused there unless exclude leaves
    those cells out, while the 2-node cells (2 stages of tp 2) stay."""
    changes = {"nodes": [1, 2], "parallelism": ["pp+tp"], "pp_degree": 2, "tp_degree": 2}
    with pytest.raises(ConfigError, match="a pipeline needs at least 2 stages"):
        load_study(parallel_config(base_config, **changes), root)
    config = parallel_config(base_config, exclude=[{"nodes": 1, "parallelism": "pp+tp"}], **changes)
    assert {c.nodes for c in load_study(config, root).cells} == {2}


def test_adapters_read_their_strategies_from_their_records():
    """An adapter's strategies are its framework record's: no adapter module restates
    them, and the record says which frameworks offer each strategy."""
    from dlscale.frameworks import horovod, pytorch

    assert pytorch.Adapter.strategies == frameworks.get("pytorch").strategies == tuple(STRATEGIES)
    assert horovod.Adapter.strategies == ("ddp",)  # shares TorchModel with pytorch, not its record
    folder = Path(pytorch.__file__).parent
    for name in frameworks.names():
        assert "strategies =" not in (folder / f"{name}.py").read_text()
        if name != "pytorch":
            assert frameworks.get(name).strategies == ("ddp",)


def test_the_adapter_refuses_a_strategy_it_does_not_run():
    from dlscale.frameworks.base import Adapter, RankContext

    from helpers.parallel_ranks import train_spec

    ctx = RankContext(0, 1, 0, 1, 0, "n", "127.0.0.1", 1, "test")

    class DdpOnly(Adapter):
        name, precisions = "ddp_only", {"fp32": None}

    with pytest.raises(ValueError, match="parallelism fsdp is not supported by ddp_only; use"):
        DdpOnly(train_spec("fsdp", 1), ctx)


def test_ddp_cells_keep_their_path_identity_and_hash(root, base_config):
    """Every cell of the demo: the axis at its default adds nothing to a cell's path, identity,
    serialisation or the study's hash, stated or not (the hashes before and after the axis
    were compared on a clean checkout of the commit before it: identical)."""
    plain = load_study(copy.deepcopy(base_config), root)
    stated = copy.deepcopy(base_config)
    stated["axes"]["parallelism"] = ["ddp"]
    stated["tp_degree"] = None
    explicit = load_study(stated, root)
    assert [(c.path, c.config_hash, c.to_json()) for c in plain.cells] == [
        (c.path, c.config_hash, c.to_json()) for c in explicit.cells
    ]
    assert config_hash(plain.config, plain.hardware) == config_hash(
        explicit.config, explicit.hardware
    )
    for cell in plain.cells:
        assert "parallelism" not in cell.identity() and "tp_degree" not in cell.identity()
        assert "parallelism" not in json.loads(cell.to_json())
        assert cell.path == CELL_PATTERN.format(**cell.key_dict(), study=cell.study) or (
            cell.workload == "convergence"
        )
    tp = dict(base_config, tp_degree=2)  # ignored by ddp cells: no identity, but the study's
    assert [c.config_hash for c in load_study(tp, root).cells] == [
        c.config_hash for c in plain.cells
    ]


def test_cells_of_each_strategy_record_memory_per_rank(tmp_path):
    """Through the launcher, as a study runs them: an fsdp cell and a ddp cell of the same
    model; the metrics carry each rank's memory, cells.csv its largest per rank."""
    from dlscale.analysis.collect import cell_rows
    from dlscale.store.metrics import read_metrics

    paths = {}
    for parallelism in ("ddp", "fsdp"):
        cell = cell_dict(model="transformer_small", parallelism=parallelism, steps=1)
        code, out = launch_cell(tmp_path / parallelism, cell)
        assert code == 0
        paths[parallelism] = out
    cells = {
        p: cell_rows(read_metrics(out, steps=False), str(out), 0.1)[0] for p, out in paths.items()
    }
    assert cells["fsdp"]["parallelism"] == "fsdp" and cells["ddp"]["parallelism"] == "ddp"
    ratio = cells["fsdp"]["state_bytes_per_rank_max"] / cells["ddp"]["state_bytes_per_rank_max"]
    assert ratio <= 1 / 2 * 1.10
    assert cells["ddp"]["param_bytes_per_rank_max"] == 4 * 5_289_986  # fp32, full replica
    assert "fully_shard" in cells["fsdp"]["wrapper"]
    # the predicted parts beside the measured bytes, and the report's table of them
    import pandas as pd

    from dlscale.outputs.memory_table import write_memory_table

    for p, row in cells.items():
        assert row["optimizer"] == "sgd" and row["peak_scope"] is None  # a CPU cell
        assert row["predicted_state_bytes_per_rank_max"] == pytest.approx(
            row["state_bytes_per_rank_max"], rel=0.02
        )
        assert row["predicted_activation_bytes_per_rank_max"] > 0
    fsdp = cells["fsdp"]
    assert fsdp["shard_degree"] == 2 and cells["ddp"]["shard_degree"] is None
    assert fsdp["state_bytes_per_rank_max"] == pytest.approx(
        fsdp["full_state_bytes"] / fsdp["shard_degree"], rel=0.02
    )
    table = tmp_path / "memory_table.tex"
    assert write_memory_table(pd.DataFrame(list(cells.values())), str(table)) == 2
    text = table.read_text()
    assert (
        "transformer\\_small & weak & fp32 & ddp & 2 & sgd" in text and " & fsdp & 2 & sgd" in text
    )


# ---- out of memory: a result -----------------------------------------------------------------
def test_a_rank_out_of_memory_records_does_not_fit(tmp_path, monkeypatch):
    """A rank that runs out of memory (here: DLSCALE_FAULT's oom before its first timed step)
    records what it held; the cell's failure record and status row say "does not fit", not
    "failed"."""
    from dlscale.analysis.cell_status import cell_status
    from dlscale.store.does_not_fit import DOES_NOT_FIT
    from dlscale.study.cell import FAILURE_FILE

    monkeypatch.setenv("DLSCALE_FAULT", "cell:1:1:oom")
    cell = cell_dict(model="transformer_small", parallelism="fsdp")
    code, out = launch_cell(tmp_path, cell)
    assert code != 0 and not out.exists()
    record = json.loads((out.parent / FAILURE_FILE).read_text())
    assert record["status"] == DOES_NOT_FIT
    assert record["reason"].startswith("does not fit: rank 1 ran out of memory (MemoryError")
    (rank,) = record["does_not_fit"]
    assert rank["rank"] == 1 and rank["memory"]["param_bytes"] == 4 * 5_289_986 // 2
    monkeypatch.chdir(tmp_path)  # the same record at the cell's place in a study
    study_cell = Cell.from_dict(cell)
    metrics = Path(study_cell.path)
    metrics.parent.mkdir(parents=True)
    (metrics.parent / FAILURE_FILE).write_text(json.dumps(record))
    row = cell_status(study_cell.path, ok=False)
    assert row["status"] == DOES_NOT_FIT and row["reason"] == record["reason"]


def test_the_pytorch_adapter_knows_out_of_memory_errors():
    import torch

    from dlscale.frameworks.pytorch import Adapter

    oom = Adapter.out_of_memory
    assert oom(None, torch.OutOfMemoryError("CUDA out of memory"))
    assert oom(None, RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried"))
    assert oom(None, MemoryError())
    assert not oom(None, RuntimeError("some other failure"))


def test_a_pipeline_cell_runs_through_the_launcher(tmp_path):
    """pp across 2 nodes: each rank holds its stage's layers, GPipe over 2 micro-batches."""
    from dlscale.store.metrics import read_metrics

    cell = cell_dict(model="transformer_small", parallelism="pp", pp_degree=2, microbatches=2)
    code, out = launch_cell(tmp_path, cell)
    assert code == 0
    records = read_metrics(out)
    starts = {r["rank"]: r["value"] for r in records if r["event"] == "rank_start"}
    assert [starts[r]["parallelism"]["pipeline"]["stage"] for r in (0, 1)] == [0, 1]
    ends = [r["value"] for r in records if r["event"] == "rank_end"]
    held = sum(e["memory"]["param_bytes"] for e in ends)
    assert held == 4 * 5_289_986  # the stages together hold the model once
    assert all(e["memory"]["param_bytes"] < held for e in ends)
    # cells.csv states the schedule, micro-batches and the bubble: (2-1)/(2+2-1)
    from dlscale.analysis.collect import cell_rows

    row = cell_rows(read_metrics(out, steps=False), str(out), 0.1)[0]
    assert (row["pp_degree"], row["microbatches"], row["pp_schedule"]) == (2, 2, "gpipe")
    assert row["bubble_fraction"] == pytest.approx(1 / 3)


def test_tables_from_before_the_axis_read_as_ddp():
    """A cells.csv or scaling.csv written before the axis (an archived study, `dlscale check`
    or `compare` on an older results folder) has no parallelism column: every cell was ddp; a
    reference's cell name keeps its old form for ddp and names another strategy."""
    import pandas as pd

    from dlscale.analysis.stats import with_axes
    from dlscale.decisions.reference_verdicts import cell_name

    old = pd.DataFrame({"hardware": ["cpu"], "nodes": [1]})
    assert list(with_axes(old)["parallelism"]) == ["ddp"]
    point = {
        "hardware": "cpu",
        "framework": "pytorch",
        "model": "gpt2_tiny",
        "policy": "weak",
        "precision": "fp32",
        "mode": "eager",
        "nodes": 2,
    }
    assert cell_name(point) == "pytorch/gpt2_tiny/weak/fp32/eager/n2"
    assert cell_name({**point, "parallelism": "ddp"}) == "pytorch/gpt2_tiny/weak/fp32/eager/n2"
    assert cell_name({**point, "parallelism": "fsdp"}) == (
        "pytorch/gpt2_tiny/weak/fp32/eager/fsdp/n2"
    )
