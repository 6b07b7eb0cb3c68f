"""The convergence workload: config and cells, the epoch and convergence records, their
collection into time-to-accuracy tables (reached and not reached), figures, report tables, the
frameworks' declared capability, and a real launch on the shipped digits data."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dlscale.registry import frameworks
from dlscale.store import metrics
from dlscale.store.metrics import MetricsError
from dlscale.study.cell import CELL_PATTERNS, Cell, cell_label, parse_cell_path
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

from helpers.cells import cell_dict
from helpers.synthetic_metrics import assembled as throughput_file
from helpers.synthetic_metrics import idle_probe, rank_records, rank_start, unavailable

CONVERGENCE = dict(
    workload="convergence",
    warmup_steps=0,
    steps=0,
    learning_rate=0.05,
    dataset="digits",
    data_format="cifar_binary",
    data_path="results/data/digits/cifar_binary",
    target_accuracy=0.95,
    max_epochs=4,
    lr_rule="linear",
    reference_batch=16,
    warmup_epochs=1.0,
    loader_workers=0,
)


# The study settings the report's time-to-accuracy macros read (dlscale.outputs.tta_section).
REPORT_CONFIG = {
    "workloads": ["throughput", "convergence"],
    "optimizer": {"momentum": 0.9},
    "convergence": {
        "dataset": "digits",
        "data_format": "cifar_binary",
        "target_accuracy": 0.95,
        "max_epochs": 4,
        "lr_rule": "linear",
        "learning_rate": 0.05,
        "warmup_epochs": 1,
    },
}


def conv_cell(**changes) -> Cell:
    fields = {**CONVERGENCE, "nodes": 2, "per_rank_batch": 16, "global_batch": 32, **changes}
    fields["global_batch"] = fields["per_rank_batch"] * fields["nodes"]
    return Cell.from_dict(cell_dict(**fields))


def epoch_value(epoch: int, accuracy: float, seconds: float, rank: int) -> dict:
    return {
        "epoch": epoch,
        "train_loss": 1.0 / epoch,
        "val_accuracy": accuracy,
        "val_correct": round(accuracy * 359),
        "val_samples": 359,
        "epoch_seconds": seconds,
        "training_seconds": seconds * epoch,
        "samples": 1408,
        "samples_seen": 1408 * epoch,
        "steps": 44,
        "learning_rate": 0.1,
        "learning_rate_first": 0.05 if epoch == 1 else 0.1,
        "validation_seconds": 0.2,
        "rank_epoch_seconds": seconds - 0.01 * rank,
        "rank_samples": 704,
    }


def conv_rank_records(
    rank: int,
    accuracies: list[float],
    seconds: float = 2.0,
    loader_ratio: float | None = None,
    staged: dict | None = None,
) -> list[dict]:
    """A rank's records; `loader_ratio`: its loader-only measurement (none: written before the
    measurement existed); `staged`: its staging (none: no staging record)."""
    start = rank_start(
        rank,
        per_rank_batch=16,
        backend="gloo",
        data="real: digits",
        dataset={"train_samples": 1438, "val_samples": 359},
        **({"staging": staged} if staged else {}),
    )
    recs = [
        metrics.make_record("rank_start", rank, start),
        metrics.make_record("idle_probe", rank, idle_probe()),
    ]
    recs += [
        metrics.make_record("epoch", rank, epoch_value(e, acc, seconds, rank))
        for e, acc in enumerate(accuracies, 1)
    ]
    total = seconds * len(accuracies)
    train_rate = 704 * len(accuracies) / total
    loader = (
        {
            "loader_only": {
                "samples_per_s": loader_ratio * train_rate,
                "batches": 50,
                "seconds": 0.5,
                "train_samples_per_s": train_rate,
                "ratio": loader_ratio,
                "input_bound": loader_ratio < 3.0,
                "method": "test",
            }
        }
        if loader_ratio is not None
        else {}
    )
    recs.append(
        metrics.make_record(
            "rank_end",
            rank,
            {
                "steps": 44 * len(accuracies),
                "seconds_total": total,
                "throughput_samples_per_s": 704 * len(accuracies) / total,
                "step_seconds_median": seconds / 44,
                "peak_rss_mb": 100.0,
                "peak_device_memory_mb": None,
                "warmup_pass_seconds": 0.05,
                "clock_start_time": 3.0,
                "energy": unavailable(),
                "breakdown": unavailable(),
                "allreduce": unavailable(),
                **loader,
            },
        )
    )
    return recs


def assembled(
    accuracies=(0.6, 0.93, 0.96), cell=None, seconds=2.0, loader_ratios=None, staged=None
) -> list[dict]:
    """A cell's metrics; `loader_ratios`: each rank's loader / train ratio; `staged`: rank ->
    its staging record."""
    cell = cell or conv_cell()
    return metrics.assemble(
        cell=cell,
        git_commit="c0ffee",
        slurm_job_id=None,
        rank_records={
            r: conv_rank_records(
                r,
                list(accuracies),
                seconds,
                loader_ratios[r] if loader_ratios else None,
                (staged or {}).get(r),
            )
            for r in range(cell.world_size)
        },
        wall_seconds=20.0,
        started=1.0,
    )


# ---- cells and config ------------------------------------------------------------------------


def test_convergence_cells_live_in_their_own_folder_and_throughput_paths_are_unchanged():
    conv = conv_cell()
    throughput = Cell.from_dict(cell_dict())
    assert conv.path.startswith("results/t/convergence/cpu/pytorch/")
    assert throughput.path == (
        "results/t/runs/cpu/pytorch/cnn_small/weak/fp32/eager/n2/r1/metrics.jsonl"
    )
    assert parse_cell_path(conv.path)["workload"] == "convergence"
    assert parse_cell_path(throughput.path)["workload"] == "throughput"
    assert conv.key != throughput.key and conv.key[0] == "convergence"
    assert cell_label(parse_cell_path(conv.path)).startswith("convergence/cpu/")
    assert set(CELL_PATTERNS) == {"throughput", "convergence", "script"}


def test_a_throughput_cell_serialises_and_hashes_as_before_workloads_existed():
    """The convergence fields are left out at their defaults: a throughput cell's JSON (its
    job's params), identity and hash are those of a cell measured before they existed."""
    before = cell_dict()
    for key in ("workload", "dataset", "lr_rule", "data_path", "target_accuracy"):
        assert key not in before
    cell = Cell.from_dict(before)  # a serialised cell from before reads back
    assert json.loads(cell.to_json()) == before
    assert "data_path" not in conv_cell().identity()  # where the data lie is not what is measured
    assert conv_cell().identity()["dataset"] == "digits"


def study_with_convergence(root, base_config, **conv):
    config = copy.deepcopy(base_config)
    config["workloads"] = ["throughput", "convergence"]
    config["convergence"] = {"axes": {"model": ["cnn_small"]}, **conv}
    return load_study(config, root)


def test_matrix_adds_convergence_cells_with_their_lr_settings(root, base_config):
    study = study_with_convergence(root, base_config, repetitions=1, lr_rule="sqrt")
    conv = study.cells_of("convergence")
    throughput = study.cells_of("throughput")
    assert len(throughput) == 16 and len(conv) == 4  # 1 model x 2 nodes x 2 policies x 1 rep
    assert {c.lr_rule for c in conv} == {"sqrt"} and {c.reference_batch for c in conv} == {16}
    assert {(c.policy, c.nodes, c.global_batch) for c in conv} == {
        ("weak", 1, 16),
        ("weak", 2, 32),
        ("strong", 1, 16),
        ("strong", 2, 16),
    }
    assert {c.steps for c in conv} == {0} and {c.max_epochs for c in conv} == {20}
    assert ("convergence", "cpu", 2) in study.train_classes()
    assert len({c.path for c in study.cells}) == len(study.cells)


@pytest.mark.parametrize(
    "conv, fragments",
    [
        (
            {"lr_rule": "cubic"},
            ["convergence.lr_rule", "'cubic'", "allowed values: none, linear, sqrt"],
        ),
        ({"target_accuracy": 1.5}, ["convergence.target_accuracy", "must be <= 1"]),
        ({"max_epochs": 0}, ["convergence.max_epochs", "must be >= 1"]),
        (
            {"axes": {"model": ["transformer_small"]}},
            [
                "convergence.axes.model[0]",
                "does not fit dataset 'digits'",
                "allowed values: cnn_small",
            ],
        ),
        (
            {"axes": {"model": ["cnn_small"]}, "global_batch": 15},
            ["convergence.global_batch: 15", "not divisible by world size(s) [2]"],
        ),
        ({"data_format": "tfrecord"}, ["convergence.data_format", "allowed values: cifar_binary"]),
    ],
)
def test_bad_convergence_settings_name_the_key_and_allowed_values(
    root, base_config, conv, fragments
):
    config = copy.deepcopy(base_config)
    config["workloads"] = ["convergence"]
    config["convergence"] = conv
    with pytest.raises(ConfigError) as info:
        load_study(config, root)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_workloads_name_their_allowed_values(root, base_config):
    config = dict(copy.deepcopy(base_config), workloads=["throughput", "accuracy"])
    with pytest.raises(ConfigError, match="allowed values: throughput, convergence"):
        load_study(config, root)


def test_every_framework_is_accepted_for_convergence_and_one_without_it_is_refused(
    root, base_config, monkeypatch
):
    """All five frameworks make convergence cells; a framework whose adapter declared no
    convergence method would be refused before any job, naming the ones that do."""
    config = copy.deepcopy(base_config)
    config["workloads"] = ["convergence"]
    config["convergence"] = {"axes": {"framework": frameworks.names(), "model": ["cnn_small"]}}
    study = load_study(config, root)
    assert {c.framework for c in study.cells_of("convergence")} == set(frameworks.names())
    monkeypatch.setitem(
        frameworks.FRAMEWORKS,
        "tensorflow",
        dataclasses.replace(frameworks.get("tensorflow"), workloads=("throughput",)),
    )
    with pytest.raises(ConfigError) as info:
        load_study(config, root)
    for fragment in (
        "convergence.axes.framework[1]",
        "'tensorflow' does not support the convergence workload",
        "allowed values: pytorch, keras, horovod, mxnet",
    ):
        assert fragment in str(info.value), str(info.value)


# The convergence contract (base.Adapter), which an adapter that declares convergence implements.
CONTRACT = (
    "data_loaders",
    "train_batch",
    "warmup_pass",
    "evaluate",
    "to_host",
    "allreduce_sum",
    "allreduce_max",
)


def test_declared_capability_matches_the_adapters():
    """The registry's workloads (dlscale.registry.frameworks.FRAMEWORKS, read before any job)
    say what the adapters declare (convergence_method), and each implements the whole contract;
    adapters whose framework is not in the driver environment are imported in their own
    environment."""
    import subprocess

    from dlscale.frameworks import horovod, pytorch
    from dlscale.frameworks.base import Adapter as Base

    from unit.frameworks.test_modes import python_of

    for name, module in (("pytorch", pytorch), ("horovod", horovod)):
        assert module.Adapter.workloads() == list(frameworks.get(name).workloads)
        assert all(getattr(module.Adapter, m) is not getattr(Base, m) for m in CONTRACT)
    scripts = Path(pytorch.__file__).parents[2]
    probe = (
        "import json, sys; from dlscale.registry.frameworks import get_adapter; "
        "from dlscale.frameworks.base import Adapter as Base; A = get_adapter(sys.argv[1]); "
        "print(json.dumps([A.workloads(), bool(A.convergence_method), "
        "[m for m in sys.argv[2:] if getattr(A, m) is getattr(Base, m)]]))"
    )
    for name in ("tensorflow", "keras", "mxnet"):
        out = subprocess.run(
            [str(python_of(name)), "-c", probe, name, *CONTRACT],
            env={"PYTHONPATH": str(scripts), "PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
            capture_output=True,
            text=True,
            check=True,
        )
        workloads, declared, missing = json.loads(out.stdout.strip().splitlines()[-1])
        assert workloads == list(frameworks.get(name).workloads) == ["throughput", "convergence"]
        assert declared and missing == [], (name, missing)
    assert frameworks.supporting("convergence") == frameworks.names()


# ---- records ---------------------------------------------------------------------------------


def test_a_convergence_file_validates_and_states_its_outcome(tmp_path):
    records = assembled()
    path = tmp_path / "m.jsonl"
    metrics.write_atomic(path, records)
    back = metrics.read_metrics(path, steps=False)
    assert [r["event"] for r in back][-2:] == ["convergence", "summary"]
    outcome = back[-2]["value"]
    assert outcome["reached"] is True and outcome["epochs_to_accuracy"] == 3
    assert outcome["time_to_accuracy_s"] == pytest.approx(6.0)  # 3 epochs x 2 s
    assert outcome["samples_to_accuracy"] == 3 * 1408
    assert outcome["effective_learning_rate"] == pytest.approx(0.1)  # linear: 0.05 x 32 / 16
    assert outcome["lr_rule"] == "linear" and outcome["reference_batch"] == 16
    assert outcome["policy"] == "weak" and outcome["global_batch"] == 32
    assert "validation" in outcome["excluded"] and "start-up" in outcome["excluded"]
    assert outcome["startup_seconds"] == pytest.approx(2.0)  # clock start 3.0 - launch 1.0
    assert back[0]["value"]["timing"]["excluded"] == outcome["excluded"]
    summary = back[-1]["value"]
    assert summary["throughput_samples_per_s"] == pytest.approx(2 * 704 * 3 / 6.0)
    # written without a loader-only measurement or staging: said so, not invented
    assert outcome["input_bound"] is None and outcome["loader_train_ratio"] is None
    assert outcome["stage_dir"] is None and outcome["staged_seconds"] is None


def test_the_input_pipeline_and_staging_reach_the_outcome_the_tables_and_the_report(
    tmp_path, monkeypatch
):
    """Each rank's loader-only measurement and staging: the outcome keeps the worst rank
    (smallest loader / train ratio, input-bound when any rank is; the longest staging, bytes
    summed), the time-to-accuracy table the worst repetition, the report marks it IB."""
    from dlscale.analysis.collect import collect_tables
    from dlscale.outputs.latex_text import tex_escape
    from dlscale.outputs.tta_section import convergence_macros, write_convergence_table

    staged = {
        0: {"stage_dir": "$TMPDIR", "path": "/tmp/x", "seconds": 0.4, "bytes_copied": 1000},
        1: {"stage_dir": "$TMPDIR", "path": "/tmp/x", "seconds": 0.6, "bytes_copied": 0},
    }
    monkeypatch.chdir(tmp_path)
    paths = []
    for rep, ratios in ((1, [12.0, 2.5]), (2, [40.0, 30.0])):
        cell = conv_cell(rep=rep)
        records = assembled(cell=cell, loader_ratios=ratios, staged=staged)
        outcome = records[-2]["value"]
        assert outcome["loader_train_ratio"] == pytest.approx(min(ratios))
        assert outcome["input_bound"] is (min(ratios) < 3.0)
        assert outcome["loader_batches"] == 50
        assert outcome["staged_seconds"] == pytest.approx(0.6)
        assert outcome["staged_bytes"] == 1000 and outcome["stage_dir"] == "$TMPDIR"
        paths.append(write_cell(tmp_path, cell, records))
    tables = collect_tables(paths)
    conv = tables["convergence"].sort_values("rep")
    assert conv["input_bound"].tolist() == [True, False]
    point = tables["time_to_accuracy"].iloc[0]
    assert point["loader_train_ratio_min"] == pytest.approx(2.5)
    assert point["input_bound_reps"] == 1 and point["staged_seconds_max"] == pytest.approx(0.6)
    out = tmp_path / "table.tex"
    write_convergence_table(tables["time_to_accuracy"], str(out), tex_escape)
    assert " 2.5 IB \\\\" in out.read_text()
    macros = convergence_macros(REPORT_CONFIG, conv, tables["time_to_accuracy"])
    assert macros["ConvInputBoundCells"] == "1 of 2"
    assert "n2/r1 (2.5)" in macros["ConvInputBoundList"]
    assert macros["ConvLoaderRatioRange"] == "2.5--30"
    assert "2 of 2 cells staged the dataset to $TMPDIR" in macros["ConvStaging"]
    assert "0.002 MB copied" in macros["ConvStaging"]
    # tables collected before these columns existed: said so, not an error
    old = conv.drop(columns=["loader_train_ratio", "input_bound", "staged_seconds"])
    macros = convergence_macros(REPORT_CONFIG, old, tables["time_to_accuracy"])
    assert macros["ConvLoaderRatioRange"].startswith("not measured")
    assert macros["ConvStaging"].startswith("The ranks read the dataset in place")


def test_a_cell_that_never_reaches_its_target_says_so():
    outcome = assembled(accuracies=(0.5, 0.7, 0.8, 0.9))[-2]["value"]
    assert outcome["reached"] is False
    assert outcome["time_to_accuracy_s"] is None and outcome["epochs_to_accuracy"] is None
    assert outcome["epochs_run"] == 4 == outcome["max_epochs"]
    assert outcome["best_val_accuracy"] == pytest.approx(0.9)
    assert outcome["training_seconds"] == pytest.approx(8.0)


def _tamper(records, event, change):
    out = copy.deepcopy(records)
    for rec in out:
        if rec["event"] == event:
            change(rec)
            break
    return out


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda rs: [r for r in rs if r["event"] != "convergence"], "one convergence record"),
        (
            lambda rs: _tamper(rs, "convergence", lambda r: r["value"].update(reached=False)),
            "contradicts the epoch records",
        ),
        (
            lambda rs: _tamper(
                rs, "convergence", lambda r: r["value"].update(time_to_accuracy_s=1.0)
            ),
            "contradict the epoch records",
        ),
        (
            lambda rs: [
                r
                for r in rs
                if not (r["event"] == "epoch" and r["rank"] == 1 and r["value"]["epoch"] == 3)
            ],
            "rank 1's epochs disagree",
        ),
        (
            lambda rs: _tamper(rs, "epoch", lambda r: r["value"].update(val_accuracy=1.2)),
            "val_accuracy",
        ),
        (
            lambda rs: _tamper(rs, "epoch", lambda r: r["value"].update(epoch_seconds=0)),
            "epoch_seconds",
        ),
    ],
)
def test_inconsistent_convergence_files_are_refused(mutate, fragment):
    with pytest.raises(MetricsError, match=fragment):
        metrics.validate_records(mutate(assembled()))


def test_epoch_records_in_a_throughput_file_are_refused():
    records = throughput_file()
    records.insert(2, metrics.make_record("epoch", 0, epoch_value(1, 0.5, 1.0, 0)))
    with pytest.raises(MetricsError, match="epoch or convergence records in a throughput cell"):
        metrics.validate_records(records)


# ---- tables, figures, report -----------------------------------------------------------------


def write_cell(root: Path, cell: Cell, records: list[dict]) -> str:
    path = root / cell.path
    metrics.write_atomic(path, records)
    return str(path.relative_to(root))


def test_collect_tabulates_convergence_cells_apart_and_keeps_the_not_reached(tmp_path, monkeypatch):
    from dlscale.analysis.collect import collect_tables

    monkeypatch.chdir(tmp_path)
    reached = {1: (0.7, 0.96), 2: (0.9, 0.97)}
    paths = []
    for nodes, acc in reached.items():
        for rep in (1, 2):
            cell = conv_cell(nodes=nodes, rep=rep)
            paths.append(write_cell(tmp_path, cell, assembled(acc, cell, seconds=3.0 / nodes)))
    missed = conv_cell(nodes=2, rep=3)  # a third repetition that never gets there
    paths.append(write_cell(tmp_path, missed, assembled((0.5, 0.6, 0.7, 0.8), missed)))
    throughput = Cell.from_dict(cell_dict(nodes=1, global_batch=4))
    paths.append(
        write_cell(
            tmp_path,
            throughput,
            metrics.assemble(
                cell=throughput,
                git_commit="c",
                slurm_job_id=None,
                rank_records={0: rank_records(0, [0.1, 0.1], "n1")},
                wall_seconds=1.0,
                started=0.0,
            ),
        )
    )
    tables = collect_tables(paths)
    assert len(tables["cells"]) == 1 and (tables["cells"]["workload"] == "throughput").all()
    conv = tables["convergence"]
    assert len(conv) == 5 and conv["reached"].tolist().count(False) == 1
    row = conv[conv["rep"] == 3].iloc[0]
    assert math.isnan(row["time_to_accuracy_s"]) and row["best_val_accuracy"] == 0.8
    assert len(tables["epochs"]) == 2 * 2 + 2 * 2 + 4
    status = tables["status"]
    assert (status["status"] == "ok").all() and set(status["workload"]) == {
        "throughput",
        "convergence",
    }
    tta = tables["time_to_accuracy"].set_index("nodes")
    assert tta.loc[1, "n"] == 2 and tta.loc[1, "reached_reps"] == 2
    assert tta.loc[1, "time_to_accuracy_s_median"] == pytest.approx(6.0)
    assert tta.loc[1, "interval"] == "range"
    # node count 2: 2 of 3 reached (3.0 s each); the third counts as longer: median 3.0,
    # its range open above
    assert tta.loc[2, "reached_reps"] == 2 and tta.loc[2, "n"] == 3
    assert tta.loc[2, "time_to_accuracy_s_median"] == pytest.approx(3.0)
    assert math.isinf(tta.loc[2, "time_to_accuracy_s_ci_high"])
    assert tta.loc[2, "tta_speedup"] == pytest.approx(2.0)
    assert tta.loc[2, "tta_efficiency"] == pytest.approx(1.0)
    assert tta.loc[2, "ideal_time_to_accuracy_s"] == pytest.approx(3.0)
    assert tta.loc[2, "effective_learning_rate"] == pytest.approx(0.1)

    # half or more not reached: no median, reported as not reached
    from dlscale.analysis.time_to_accuracy import time_to_accuracy_summary

    half = conv[conv["nodes"] == 2].copy()
    half.loc[half["rep"] == 1, "reached"] = False
    point = time_to_accuracy_summary(half).iloc[0]
    assert point["reached_reps"] == 1 and math.isnan(point["time_to_accuracy_s_median"])

    # figures and the report's table from these tables
    from dlscale.outputs.convergence_plots import plot_convergence_figure
    from dlscale.outputs.figure_layout import convergence_layout
    from dlscale.outputs.latex_text import tex_escape
    from dlscale.outputs.tta_section import convergence_macros, write_convergence_table

    layout = convergence_layout([("cpu", "pytorch", "cnn_small", "weak", "fp32")], 3.5)
    assert [s["file"] for s in layout] == [
        "cpu/convergence/time_to_accuracy.pdf",
        "cpu/convergence/epochs_to_accuracy.pdf",
        "cpu/convergence/accuracy_curves.pdf",
    ]
    for spec in layout:
        drawn = plot_convergence_figure(
            tables["time_to_accuracy"], tables["epochs"], conv, spec, str(tmp_path / "f.pdf")
        )
        assert drawn["panels"] == 1 and (tmp_path / "f.pdf").stat().st_size > 0
    out = tmp_path / "table.tex"
    write_convergence_table(tables["time_to_accuracy"], str(out), tex_escape)
    text = out.read_text()
    assert "linear 0.1" in text and "2/3" in text and r"(3--$\infty$)" in text
    macros = convergence_macros(REPORT_CONFIG, conv, tables["time_to_accuracy"])
    assert macros["ConvCellsNotReached"] == 1 and "n2/r3" in macros["ConvNotReachedList"]
    assert macros["ConvTarget"] == "95.0 %" and macros["ConvRepsMax"] == 3


# ---- a real launch ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """The shipped digits data in cifar_binary (dlscale.data.shipped)."""
    from dlscale.data.shipped import write_digits

    out = tmp_path_factory.mktemp("data") / "digits"
    write_digits(out, "cifar_binary")
    return out


def test_the_shipped_digits_are_what_models_are_checked_against_before_any_job(digits):
    from dlscale.data import inspect_dataset
    from dlscale.study.workloads import SHIPPED_DATASETS

    info = inspect_dataset(digits, "cifar_binary")
    shipped = SHIPPED_DATASETS["digits"]
    assert (info.image_shape, info.num_classes) == (shipped["image_shape"], shipped["num_classes"])
    assert (info.train_samples, info.val_samples) == (1438, 359)


@pytest.mark.parametrize("framework, nodes", [("pytorch", 1), ("horovod", 2)])
def test_a_real_convergence_cell_records_every_epoch_and_its_outcome(
    tmp_path, digits, framework, nodes, monkeypatch
):
    """On the digits data, one epoch against an unreachable target: the cell ends at its cap,
    reports not reached, and its records hold what the report needs (PyTorch at 1 rank,
    Horovod's torch path at 2: counts summed over both ranks), each rank's loader-only
    measurement; Horovod's 2 ranks first stage the dataset to a node-local folder named by a
    variable: one copy for the node, trained from."""
    from helpers.cells import launch_cell
    from unit.frameworks.test_modes import python_of

    cell = cell_dict(
        **{
            **CONVERGENCE,
            "framework": framework,
            "nodes": nodes,
            "per_rank_batch": 32 // nodes,
            "global_batch": 32,
            "data_path": str(digits),
            "target_accuracy": 0.999,
            "max_epochs": 1,
            "stage_dir": "$DLSCALE_TEST_STAGE/local" if nodes == 2 else None,
        }
    )
    monkeypatch.setenv("DLSCALE_TEST_STAGE", str(tmp_path / "node-local"))
    code, out = launch_cell(tmp_path, cell, python_of(framework))
    assert code == 0
    records = metrics.read_metrics(out)
    ends = [r["value"] for r in records if r["event"] == "rank_end"]
    assert len(ends) == nodes and all(e["loader_only"]["batches"] >= 1 for e in ends)
    staging = [r["value"]["staging"] for r in records if r["event"] == "rank_start"]
    if nodes == 2:
        copies = list((tmp_path / "node-local" / "local").glob("dlscale-data-digits-*"))
        assert len(copies) == 1 and all(s["path"] == str(copies[0]) for s in staging)
        dataset_bytes = sum(f.stat().st_size for f in digits.rglob("*") if f.is_file())
        assert sum(s["bytes_copied"] for s in staging) == records[-2]["value"]["staged_bytes"]
        assert 0 < records[-2]["value"]["staged_bytes"] <= dataset_bytes
    else:
        assert all(s["stage_dir"] is None for s in staging)
    epochs = [r["value"] for r in records if r["event"] == "epoch" and r["rank"] == 0]
    start = [r["value"] for r in records if r["event"] == "rank_start"][0]
    outcome = records[-2]["value"]
    assert len(epochs) == 1 and epochs[0]["val_samples"] == start["dataset"]["val_samples"]
    assert epochs[0]["samples"] == sum(
        r["value"]["rank_samples"] for r in records if r["event"] == "epoch"
    )
    assert start["data"].startswith("real: digits")
    assert outcome["reached"] is False and outcome["epochs_run"] == 1
    assert 0.0 < epochs[0]["val_accuracy"] < 1.0 and epochs[0]["train_loss"] > 0
    # warm-up over 1 epoch at global batch 32 (reference 16): 0.05 rising towards 0.1
    assert epochs[0]["learning_rate_first"] == pytest.approx(0.05)
    assert 0.05 < epochs[0]["learning_rate"] < 0.1
    assert not any(r["event"] == "step" for r in records)
    assert pd.notna(outcome["warmup_pass_seconds"]) and outcome["startup_seconds"] > 0
    assert outcome["loader_train_ratio"] > 0 and isinstance(outcome["input_bound"], bool)


def demo_cell(digits: Path, framework: str, nodes: int, **changes) -> dict:
    """The demo's convergence cell (config/config.yaml: per-rank batch 16, base rate 0.05 at
    reference batch 16, linear rule, 1 warm-up epoch, target 95 %, cap 10 epochs)."""
    fields = {
        **CONVERGENCE,
        "framework": framework,
        "nodes": nodes,
        "per_rank_batch": 16,
        "global_batch": 16 * nodes,
        "data_path": str(digits),
        "max_epochs": 10,
        **changes,
    }
    return cell_dict(**fields)


def rank0_epochs(records: list[dict]) -> list[dict]:
    return [r["value"] for r in records if r["event"] == "epoch" and r["rank"] == 0]


@pytest.mark.parametrize("framework", frameworks.names())
def test_every_framework_reaches_the_target_on_digits_at_2_ranks_and_repeats_its_first_epoch(
    tmp_path, digits, framework
):
    """A real 2-rank launch of each framework (its own environment,
    through the launcher) reaches 95 % on the shipped digits within the demo's 10 epochs, with
    the learning-rate rule and warm-up of every framework (0.05 rising to 0.1 at global batch
    32) and validation over the whole split; a second run of the same seed gives the same
    first-epoch training loss."""
    from helpers.cells import launch_cell
    from unit.frameworks.test_modes import python_of

    python = python_of(framework)
    code, out = launch_cell(tmp_path / "a", demo_cell(digits, framework, 2), python)
    assert code == 0
    records = metrics.read_metrics(out)
    outcome, epochs = records[-2]["value"], rank0_epochs(records)
    assert outcome["reached"] is True and outcome["epochs_run"] == len(epochs) <= 10
    assert (
        epochs[-1]["val_accuracy"]
        >= 0.95
        > max(e["val_accuracy"] for e in epochs[:-1] or [{"val_accuracy": 0}])
    )
    assert all(e["val_samples"] == 359 and e["samples"] == 1408 for e in epochs)
    assert epochs[0]["learning_rate_first"] == pytest.approx(0.05)
    assert epochs[-1]["learning_rate"] == pytest.approx(0.1)
    assert outcome["time_to_accuracy_s"] == pytest.approx(sum(e["epoch_seconds"] for e in epochs))
    code, again = launch_cell(
        tmp_path / "b", demo_cell(digits, framework, 2, max_epochs=1, target_accuracy=0.999), python
    )
    assert code == 0
    repeated = rank0_epochs(metrics.read_metrics(again))
    assert repeated[0]["train_loss"] == pytest.approx(epochs[0]["train_loss"], rel=1e-6)


def test_the_report_compares_frameworks_at_equal_global_batch_and_states_their_start():
    """ConvFrameworkComparison: at each global batch more than one framework trained at, each
    framework's epochs and seconds with the interval its n allows (a CI at n = 6, a labelled
    range at n = 3, an open end where a repetition missed), fastest first; a global batch only
    one framework trained at is not compared. ConvFrameworkInit names every framework's start."""
    from dlscale.analysis.stats import CI, RANGE
    from dlscale.outputs.tta_section import framework_macros

    def row(framework, nodes, median, low, high, interval, n, epochs=(3, 3, 4)):
        return {
            "framework": framework,
            "model": "cnn_small",
            "policy": "weak",
            "nodes": nodes,
            "global_batch": 16 * nodes,
            "n": n,
            "time_to_accuracy_s_median": median,
            "time_to_accuracy_s_ci_low": low,
            "time_to_accuracy_s_ci_high": high,
            "interval": interval,
            "epochs_to_accuracy_median": epochs[1],
            "epochs_to_accuracy_min": epochs[0],
            "epochs_to_accuracy_max": epochs[2],
        }

    tta = pd.DataFrame(
        [
            row("tensorflow", 1, 9.0, 8.0, 11.0, CI, 6),
            row("pytorch", 1, 5.0, 4.5, 6.0, CI, 6, epochs=(2, 2, 2)),
            row("mxnet", 1, 7.0, 6.0, math.inf, RANGE, 3, epochs=(3, 3, math.inf)),
            row("keras", 2, math.nan, math.nan, math.nan, "none", 6),
        ]
    )
    macros = framework_macros(tta)
    text = macros["ConvFrameworkComparison"]
    assert text.startswith("global batch 16 (cnn_small, weak, 1 node(s)): pytorch 2 epochs")
    assert text.index("pytorch") < text.index("mxnet") < text.index("tensorflow")
    assert "pytorch 2 epochs, 5 [4.5, 6] s (n = 6)" in text
    assert "mxnet 3 (range 3-open) epochs, 7 (range 6-open) s (n = 3)" in text
    assert "tensorflow 3 (range 3-4) epochs, 9 [8, 11] s (n = 6)" in text
    assert "keras" not in text and "global batch 32" not in text
    init = macros["ConvFrameworkInit"]
    for name in ("keras", "mxnet", "pytorch", "tensorflow"):
        assert f"{name}: {frameworks.get(name).initialisation_and_data_order}" in init
    assert "not stated" not in init
    alone = framework_macros(tta[tta["framework"] == "keras"])
    assert alone["ConvFrameworkComparison"] == (
        "no global batch was trained by more than one framework"
    )
