"""The planner on constructed predictions whose optimum is known by hand, and checked against
brute-force enumeration (dlscale.decisions.planner)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from dlscale.decisions import plan_options, plan_program, plan_report
from dlscale.decisions import planner as pl

HOUR = 3600.0


def predictions(rates: dict, max_nodes: int = 2, model: str = "m") -> pd.DataFrame:
    """Predicted throughput `rate(n)` for every (hardware, framework) in `rates`, n = 1..max."""
    rows = []
    for (hw, fw), rate in rates.items():
        for n in range(1, max_nodes + 1):
            x = rate(n)
            rows.append(
                {
                    "hardware": hw,
                    "framework": fw,
                    "model": model,
                    "policy": "weak",
                    "precision": "fp32",
                    "mode": "eager",
                    "nodes": n,
                    "world_size": n,
                    "throughput_samples_per_s_pred": x,
                    "throughput_samples_per_s_low": 0.9 * x,
                    "throughput_samples_per_s_high": 1.1 * x,
                    "interval": "range",
                    "model_kind": "usl",
                    "measured": n <= 2,
                    "extrapolated": n > 2,
                    "measured_max_nodes": 2,
                }
            )
    return pd.DataFrame(rows)


# fast: 100 samples/s per node at 4 per node-hour; cheap: 25 per node at 0.5 per node-hour
FAST_CHEAP = predictions({("fast", "pt"): lambda n: 100 * n, ("cheap", "pt"): lambda n: 25 * n})
PARTS = [pl.Partition("fast", 2, 4.0, 500.0), pl.Partition("cheap", 2, 0.5, 200.0)]
JOB = [{"name": "a", "model": "m", "samples": 100 * HOUR}]  # 1 node-hour on fast


def choice(result) -> list[tuple]:
    return [(r.job, r.hardware, int(r.nodes)) for r in result.plan.itertuples()]


def test_min_time_takes_the_fastest_partition():
    result = pl.make_plan(FAST_CHEAP, JOB, PARTS)
    assert choice(result) == [("a", "fast", 2)]
    assert result.plan.loc[0, "hours"] == pytest.approx(0.5)
    assert result.plan.loc[0, "charged_node_hours"] == pytest.approx(4.0)
    assert result.plan.loc[0, "energy_kwh"] == pytest.approx(2 * 0.5 * 0.5)
    assert (result.plan.loc[0, "hours_low"], result.plan.loc[0, "hours_high"]) == pytest.approx(
        (0.5 / 1.1, 0.5 / 0.9)
    )
    lost = result.alternatives.set_index("hardware")["lost_because"]
    assert lost["cheap"] == "slower"


def test_cheapest_partition_is_not_the_fastest():
    # fewest node-hours within 2 h: cheap, 2 nodes (2 h, 2 charged) beats fast (4 charged)
    result = pl.make_plan(FAST_CHEAP, JOB, PARTS, objective=pl.MIN_NODE_HOURS, deadline_hours=2)
    assert choice(result) == [("a", "cheap", 2)]
    assert result.plan.loc[0, "charged_node_hours"] == pytest.approx(2.0)
    # a budget below fast's 4 charged node-hours: the fastest plan within it is cheap's
    result = pl.make_plan(FAST_CHEAP, JOB, PARTS, budget_node_hours=3)
    assert choice(result) == [("a", "cheap", 2)]
    binding = result.constraints.set_index("constraint")["binding"]
    assert binding["budget_node_hours"] and not binding["capacity_fast"]
    # an energy budget: fast 0.5 kWh (any n), cheap 0.8 kWh
    assert choice(pl.make_plan(FAST_CHEAP, JOB, PARTS, budget_kwh=0.6)) == [("a", "fast", 2)]
    # a tighter deadline rules cheap out
    result = pl.make_plan(FAST_CHEAP, JOB, PARTS, objective=pl.MIN_NODE_HOURS, deadline_hours=1.5)
    assert [c[1] for c in choice(result)] == ["fast"]


def test_shared_capacity_forces_the_second_job_elsewhere():
    preds = predictions({("fast", "pt"): lambda n: 100 * n, ("slow", "pt"): lambda n: 50 * n})
    parts = [pl.Partition("fast", 2), pl.Partition("slow", 2)]
    jobs = [
        {"name": "big", "model": "m", "samples": 100 * HOUR},  # fast 2: 0.5 h
        {"name": "small", "model": "m", "samples": 75 * HOUR},  # fast 2: 0.375 h, slow 2: 0.75 h
    ]
    result = pl.make_plan(preds, jobs, parts)
    # alone each would take fast x 2; together: big on fast x 2, small on slow x 2 (0.75 h)
    # beats both on fast x 1 (1 h) and small on fast, big on slow (1 h)
    assert choice(result) == [("big", "fast", 2), ("small", "slow", 2)]
    assert result.objectives["makespan"] == pytest.approx(0.75)
    binding = result.constraints.set_index("constraint")["binding"]
    assert binding["capacity_fast"]
    lost = result.alternatives[result.alternatives["job"] == "small"].iloc[0]
    assert lost["hardware"] == "fast" and "capacity" in lost["lost_because"]


def test_infeasible_budget_names_the_smallest_feasible_one():
    with pytest.raises(pl.PlanError, match=r"smallest feasible budget_node_hours is 2 "):
        pl.make_plan(FAST_CHEAP, JOB, PARTS, budget_node_hours=1)
    with pytest.raises(pl.PlanError, match=r"smallest feasible deadline_hours is 0.5 "):
        pl.make_plan(FAST_CHEAP, JOB, PARTS, objective=pl.MIN_NODE_HOURS, deadline_hours=0.1)
    with pytest.raises(pl.PlanError, match=r"smallest feasible budget_kwh is 0.5 "):
        pl.make_plan(FAST_CHEAP, JOB, PARTS, budget_kwh=0.1)
    five = [{**JOB[0], "name": f"j{i}"} for i in range(5)]  # 5 jobs, 4 nodes in all
    with pytest.raises(pl.PlanError, match="more nodes than the partitions offer"):
        pl.make_plan(FAST_CHEAP, five, PARTS)
    with pytest.raises(pl.PlanError, match="no measured series of model 'other'"):
        pl.make_plan(FAST_CHEAP, [{"name": "x", "model": "other", "samples": 1}], PARTS)
    with pytest.raises(pl.PlanError, match="convergence cells"):
        pl.jobs_from_config({"jobs": [{"model": "m", "target_accuracy": 0.9}]}, ["m"])


def brute_force(opts: pd.DataFrame, n_jobs: int, capacity: dict, limits: dict, objective: str):
    """The lexicographic optimum over every combination of one option per job."""
    per_job = [opts[opts["job_index"] == j].to_dict("records") for j in range(n_jobs)]
    best = None
    for combo in itertools.product(*per_job):
        used: dict = {}
        for o in combo:
            used[o["hardware"]] = used.get(o["hardware"], 0) + o["nodes"]
        if any(used[h] > capacity[h] for h in used):
            continue
        values = {
            "makespan": max(o["hours"] for o in combo),
            "sum_hours": sum(o["hours"] for o in combo),
            "charged_node_hours": sum(o["charged_node_hours"] for o in combo),
        }
        energy = sum(o["energy_kwh"] for o in combo)
        if limits.get("budget_node_hours") is not None and (
            values["charged_node_hours"] > limits["budget_node_hours"] * (1 + 1e-9)
        ):
            continue
        if limits.get("budget_kwh") is not None and energy > limits["budget_kwh"] * (1 + 1e-9):
            continue
        if limits.get("deadline_hours") is not None and (
            values["makespan"] > limits["deadline_hours"] * (1 + 1e-9)
        ):
            continue
        key = tuple(values[k] for k in plan_program.ORDER[objective])
        if best is None or key < best:
            best = key
    return best


@pytest.mark.parametrize("seed", range(8))
def test_plan_is_the_exact_optimum_by_enumeration(seed):
    rng = np.random.default_rng(seed)
    hws = ["p", "q", "r"]
    rates = {}
    for hw in hws:
        for fw in ("f1", "f2"):
            lam, sigma = rng.uniform(10, 100), rng.uniform(0, 0.3)
            rates[(hw, fw)] = lambda n, lam=lam, sigma=sigma: lam * n / (1 + sigma * (n - 1))
    preds = predictions(rates, max_nodes=3)
    parts = [
        pl.Partition(h, int(rng.integers(2, 5)), float(rng.uniform(0.5, 4)), 300.0) for h in hws
    ]
    jobs = [
        {"name": f"j{j}", "model": "m", "samples": float(rng.uniform(1, 5)) * 100 * HOUR}
        for j in range(3)
    ]
    capacity = {p.name: p.nodes_available for p in parts}
    opts_all = plan_options.options(preds, jobs, parts)
    loose = brute_force(opts_all, 3, capacity, {}, pl.MIN_TIME)
    cases = [
        (pl.MIN_TIME, {}),
        (pl.MIN_TIME, {"budget_node_hours": float(rng.uniform(3, 12))}),
        (pl.MIN_NODE_HOURS, {"deadline_hours": loose[0] * float(rng.uniform(1.0, 2.5))}),
    ]
    for objective, limits in cases:
        expected = brute_force(opts_all, 3, capacity, limits, objective)
        try:
            result = pl.make_plan(preds, jobs, parts, objective=objective, **limits)
        except pl.PlanError:
            assert expected is None, (objective, limits)
            continue
        got = tuple(result.objectives[k] for k in plan_program.ORDER[objective])
        assert got == pytest.approx(expected, rel=1e-6), (objective, limits)


def test_command_line_plans_from_an_existing_results_folder(tmp_path, root, capsys):
    from unit.analysis.test_scaling_model import cells

    results = tmp_path / "results" / "demo"
    (results / "tables").mkdir(parents=True)
    cells(nodes=(1, 2), reps=2, noise=0.02).to_csv(results / "tables" / "cells.csv", index=False)
    out = tmp_path / "plan"
    rc = pl.main(
        [str(results), "--workflow-dir", str(root), "--job", "cnn_small:1e6", "--out", str(out)]
    )
    assert rc == 0, capsys.readouterr().err
    plan = pd.read_csv(out / "plan.csv")
    assert list(plan["hardware"]) == ["cpu"] and plan.loc[0, "nodes"] in (1, 2)
    assert "solved in" in capsys.readouterr().out
    rc = pl.main([str(results), "--workflow-dir", str(root), "--budget-node-hours", "1e-6"])
    assert rc == 2 and "smallest feasible budget_node_hours" in capsys.readouterr().err


def test_recommendations_come_as_macros_and_bounded_tables(tmp_path):
    from dlscale.analysis.scaling_model import model_tables

    from unit.analysis.test_scaling_model import cells

    fits, _ = model_tables(cells(nodes=(1, 2, 4), reps=2, noise=0.01))
    config = {"objective": pl.MIN_TIME, "budget_node_hours": 3.0, "max_extrapolation": 8}
    result = pl.make_plan(FAST_CHEAP, JOB, PARTS, budget_node_hours=3)
    plan_report.write_recommendations(result, fits, config, tmp_path / "m.tex", tmp_path / "t.tex")
    macros = (tmp_path / "m.tex").read_text()
    assert r"\newcommand{\dlsPlanBinding}{budget\_node\_hours}" in macros
    assert r"\newcommand{\dlsModelValidated}{1}" in macros
    assert r"\newcommand{\dlsPlanLimits}{budget node hours 3}" in macros
    tables = (tmp_path / "t.tex").read_text()
    assert "cheap" in tables and "Alternatives the plan beat" in tables
    many = pd.concat([fits] * 70, ignore_index=True)
    assert "10 more series" in plan_report.recommendation_tables(result, many)
    failed = plan_report.recommendation_macros(pl.PlanError("budget too small"), fits, config)
    assert failed["dlsPlanOutcome"] == "No plan: budget too small"
    with pytest.raises(pl.PlanError, match="given more than once"):
        pl.jobs_from_config({"jobs": [{"name": "a", "model": "m", "samples": 1}] * 2}, ["m"])


def test_the_plan_table_says_which_intervals_carry_the_model_error():
    from dlscale.analysis.scaling_model import model_tables

    from unit.analysis.test_scaling_model import cells

    parts = [pl.Partition("cpu", 64, 1.0, None)]
    job = [{"name": "j", "model": "cnn_small", "samples": 1e6}]
    for nodes, validated, top in (((1, 2, 4), True, 32), ((1, 2), False, 4)):
        _, preds = model_tables(cells(nodes=nodes, reps=2, noise=0.02), plan_nodes={"cpu": 64})
        assert preds["nodes"].max() == top  # the planner sees no node count beyond the cap
        result = pl.make_plan(preds, job, parts)
        row = result.plan.iloc[0]
        assert bool(row["validated"]) is validated and row["nodes"] <= top
        assert ("model error (leave-one-out" in row["interval_spans"]) is validated
        table = plan_report.recommendation_tables(result, pd.DataFrame())
        assert ("range + LOO" in table) is validated


# ---- strategies, memory per rank, jobs in tokens -------------------------------------------------

GIB = 1024.0  # MiB


def strategy_predictions(**axes):
    """Predictions of a ddp and an fsdp series (h100, transformer_small, 1..8 nodes from cells at
    1, 2, 4): peak memory per rank 20 GiB + 80 GiB / d (d: the world size under fsdp, else 1),
    fsdp at 0.8 x ddp's throughput."""
    from dlscale.analysis.scaling_model import model_tables

    from helpers.synthetic_study import cells_table, with_memory
    from unit.analysis.test_scaling_model import STRATEGY_AXES

    cells = with_memory(
        cells_table({**STRATEGY_AXES, **axes}), 20 * GIB, 80 * GIB, speed={"fsdp": 0.8}
    )
    return model_tables(cells, plan_nodes={"h100": 8})[1]


TOKEN_JOB = [{"name": "j", "model": "transformer_small", "samples": 1e7}]


def test_an_option_over_the_partitions_memory_is_not_offered_and_named():
    preds = strategy_predictions()
    # memory not checked (no device_memory_gib): ddp, the faster strategy, and the plan says so
    free = pl.make_plan(preds, TOKEN_JOB, [pl.Partition("h100", 8)])
    assert free.plan.loc[0, "parallelism"] == "ddp"
    assert free.plan.loc[0, "memory_check"] == "not checked: h100 has no device_memory_gib"
    # 80 GiB per rank: ddp holds 100 GiB at every node count, fsdp at 1 node (measured) too
    result = pl.make_plan(preds, TOKEN_JOB, [pl.Partition("h100", 8, device_memory_mb=80 * GIB)])
    row = result.plan.iloc[0]
    assert (row["parallelism"], int(row["nodes"])) == ("fsdp", 8)
    assert row["memory_check"] == (
        "fits: 30 GiB per rank (predicted from n=4) within 80 GiB (h100 device_memory_gib)"
    )
    assert sorted(zip(result.excluded["parallelism"], result.excluded["nodes"])) == [
        ("ddp", n) for n in range(1, 9)
    ] + [("fsdp", 1)]
    assert not result.options["parallelism"].eq("ddp").any()  # not in the program
    lost = result.alternatives.set_index(["parallelism", "nodes"])["lost_because"]
    assert lost[("ddp", 8)] == (
        "not offered at 1-8 nodes: does not fit: 100 GiB per rank (predicted from n=4) over "
        "80 GiB (h100 device_memory_gib)"
    )
    assert lost[("fsdp", 1)].startswith(
        "not offered at 1 node: does not fit: 100 GiB per rank (measured)"
    )
    tables = plan_report.recommendation_tables(result, pd.DataFrame())
    assert "Memory per rank: j: fits: 30 GiB per rank (predicted from n=4)" in tables
    # nothing fits: no plan, and the message says why
    with pytest.raises(pl.PlanError, match=r"no option of model 'transformer_small' fits in "):
        pl.make_plan(preds, TOKEN_JOB, [pl.Partition("h100", 8, device_memory_mb=20 * GIB)])


def test_a_cell_that_did_not_fit_is_never_offered():
    preds = strategy_predictions()
    status = pd.DataFrame(
        [
            {
                **{c: preds[c].iloc[0] for c in pl.GROUP},
                "parallelism": s,
                "nodes": n,
                "rep": 1,
                "status": st,
            }
            for s, n, st in (
                ("ddp", 4, "does_not_fit"),
                ("fsdp", 2, "does_not_fit"),
                ("fsdp", 4, "ok"),
            )
        ]
    )
    result = pl.make_plan(preds, TOKEN_JOB, [pl.Partition("h100", 8)], does_not_fit=status)
    offered = set(zip(result.options["parallelism"], result.options["nodes"]))
    # ddp: a replica that ran out of memory at 4 nodes does so at any; fsdp: at 2 nodes and at
    # 1 (more state per rank), not at 4 or 8
    assert not any(s == "ddp" for s, _ in offered)
    assert ("fsdp", 1) not in offered and ("fsdp", 2) not in offered
    assert ("fsdp", 4) in offered and ("fsdp", 8) in offered
    assert result.plan.loc[0, "parallelism"] == "fsdp"
    lost = result.alternatives.set_index(["parallelism", "nodes"])["lost_because"]
    assert "ran out of memory at 4 nodes (status does_not_fit)" in lost[("ddp", 8)]
    assert lost[("fsdp", 2)].endswith("ran out of memory at 2 nodes (status does_not_fit)")


def test_a_job_in_tokens_gives_the_plan_of_its_samples():
    preds = strategy_predictions()
    seq_len = 128  # transformer_small's, as its cells recorded it
    assert set(preds["seq_len"]) == {seq_len}
    parts = [pl.Partition("h100", 8, 3.0, 3600.0)]
    jobs = pl.jobs_from_config({"jobs": [{"model": "transformer_small", "tokens": 1e7 * 128}]}, [])
    in_tokens = pl.make_plan(preds, jobs, parts, budget_node_hours=100)
    in_samples = pl.make_plan(preds, TOKEN_JOB, parts, budget_node_hours=100)
    cols = ["parallelism", "nodes", "samples", "hours", "charged_node_hours", "energy_kwh"]
    pd.testing.assert_frame_equal(in_tokens.plan[cols], in_samples.plan[cols])
    assert in_tokens.plan.loc[0, "tokens"] == 1e7 * 128
    assert in_tokens.objectives == in_samples.objectives
    # the command line's syntax
    assert pl.parse_job("transformer_small:tokens=1.28e9") == {
        "model": "transformer_small",
        "tokens": 1.28e9,
    }
    assert pl.parse_job("cnn_small:1e6") == pl.parse_job("cnn_small:samples=1e6")


def test_a_job_in_tokens_for_a_model_without_a_sequence_length_is_refused():
    from dlscale.analysis.scaling_model import model_tables

    from unit.analysis.test_scaling_model import cells

    preds = pd.concat([strategy_predictions(), model_tables(cells(nodes=(1, 2)))[1]])
    job = [{"name": "v", "model": "cnn_small", "tokens": 1e9, "samples": None}]
    with pytest.raises(
        pl.PlanError,
        match=r"job 'v': tokens is for models with a sequence length; 'cnn_small' has none "
        r"\(give samples\); allowed models for tokens: transformer_small$",
    ):
        pl.make_plan(preds, job, [pl.Partition("h100", 8), pl.Partition("cpu", 4)])
    with pytest.raises(pl.PlanError, match=r"plan.jobs\[0\]: give tokens or samples"):
        pl.jobs_from_config({"jobs": [{"model": "m", "tokens": 1, "samples": 1}]}, ["m"])
    with pytest.raises(ValueError, match="allowed keys: samples, tokens"):
        pl.parse_job("gpt2_tiny:epochs=3")


# What the planner refuses from the study's settings alone is refused when the study is
# parsed (dlscale.decisions.plan_jobs.plan_problems, called by rules/common.smk), with the
# planner's own message: each case is refused both ways, and the messages are the same.
PARSE_TIME_REFUSALS = {
    "tokens for a vision model": {"jobs": [{"model": "cnn_small", "tokens": 1000}]},
    "a model the study does not measure": {"jobs": [{"model": "resnet50", "samples": 1e6}]},
    "a framework no cell uses": {
        "jobs": [{"model": "cnn_small", "samples": 1e6, "frameworks": ["tensorflow"]}]
    },
    "an energy budget without any node power": {"budget_kwh": 5.0},
    "a node-hour objective without a deadline": {"objective": "min_node_hours"},
    "a target accuracy": {"jobs": [{"model": "cnn_small", "target_accuracy": 0.9}]},
}


@pytest.mark.parametrize("case", PARSE_TIME_REFUSALS)
def test_the_planners_settings_checks_run_at_parse_time_with_its_messages(root, case):
    from dlscale.analysis.scaling_model import model_tables
    from dlscale.decisions.plan_jobs import plan_problems
    from dlscale.study.matrix import load_workflow_study

    from helpers.synthetic_study import cells_table

    study = load_workflow_study({"plan": PARSE_TIME_REFUSALS[case]}, root)
    cells = study.cells_of("throughput")
    models = study.config["axes"]["model"]
    parts = pl.partitions_from_hardware(study.hardware)
    at_parse = plan_problems(study.config["plan"], models, cells, parts)
    # the planner, after the cells: predictions of every planned series of the study
    axes = {axis: sorted({getattr(c, axis) for c in cells}) for axis in ("hardware", "model")}
    axes |= {a: sorted({getattr(c, a) for c in cells}) for a in ("framework", "policy")}
    axes |= {a: sorted({getattr(c, a) for c in cells}) for a in ("precision", "mode", "nodes")}
    preds = model_tables(cells_table({**axes, "rep": [1, 2]}))[1]
    with pytest.raises(pl.PlanError) as late:
        pl.plan_from_config(preds, study.config["plan"], study.hardware, models)
    # the planner stops at its first refusal; the parse-time check lists every one, that first
    assert at_parse[0] == str(late.value)


def test_a_plan_the_planner_can_make_passes_the_parse_time_checks(root):
    from dlscale.decisions.plan_jobs import plan_problems
    from dlscale.study.matrix import load_workflow_study

    plan = {"jobs": [{"model": "gpt2_tiny", "tokens": 1e9}, {"model": "cnn_small", "samples": 5}]}
    study = load_workflow_study({"plan": plan}, root)
    parts = pl.partitions_from_hardware(study.hardware)
    assert (
        plan_problems(
            study.config["plan"], study.config["axes"]["model"], study.cells_of("throughput"), parts
        )
        == []
    )


# The fit check's limit is device_memory_gib less a headroom stated in the hardware
# entry (memory_headroom_gib; the device's default where none is stated), and a series with no
# memory measured is held against its model's state with its optimizer (AdamW: 8 bytes of
# float32 moments per parameter, SGD's momentum 4), a lower bound that rules options out.
def test_partitions_take_the_headroom_stated_or_their_devices_default():
    from dlscale.study.partitions import DEFAULT_HEADROOM_GIB, partitions_from_hardware

    parts = partitions_from_hardware(
        {
            "h100": {"device": "cuda", "max_nodes": 8, "device_memory_gib": 80},
            "a100": {
                "device": "cuda",
                "max_nodes": 8,
                "device_memory_gib": 80,
                "memory_headroom_gib": 2.5,
            },
            "cpu": {"device": "cpu", "max_nodes": 4, "device_memory_gib": 64},
            "free": {"device": "cuda", "max_nodes": 2},
        }
    )
    by = {p.name: p for p in parts}
    assert DEFAULT_HEADROOM_GIB == {"cuda": 1.0, "cpu": 0.0}
    assert by["h100"].device_memory_mb == 79 * 1024
    assert by["h100"].limit_words() == (
        "h100 device_memory_gib 80 - memory_headroom_gib 1, the default for its device"
    )
    assert by["a100"].device_memory_mb == 77.5 * 1024
    assert by["a100"].limit_words() == "a100 device_memory_gib 80 - memory_headroom_gib 2.5"
    assert by["cpu"].device_memory_mb == 64 * 1024
    assert by["cpu"].limit_words() == "cpu device_memory_gib"
    assert by["free"].device_memory_mb is None


def test_the_fit_check_subtracts_the_headroom():
    """A replica measured at 79.5 GiB per rank fits an 80 GiB board only without headroom."""
    from dlscale.analysis.scaling_model import model_tables
    from dlscale.study.partitions import partitions_from_hardware

    from helpers.synthetic_study import cells_table, with_memory
    from unit.analysis.test_scaling_model import STRATEGY_AXES

    axes = {**STRATEGY_AXES, "parallelism": ["ddp"]}
    cells = with_memory(cells_table(axes), 79.5 * GIB - 8 * GIB, 8 * GIB)
    preds = model_tables(cells, plan_nodes={"h100": 8})[1]
    entry = {"device": "cuda", "max_nodes": 8, "device_memory_gib": 80}
    with pytest.raises(pl.PlanError, match="no option of model 'transformer_small' fits"):
        pl.make_plan(preds, TOKEN_JOB, partitions_from_hardware({"h100": entry}))
    stated = partitions_from_hardware({"h100": {**entry, "memory_headroom_gib": 0}})
    assert pl.make_plan(preds, TOKEN_JOB, stated).plan.loc[0, "memory_check"] == (
        "fits: 79.5 GiB per rank (predicted from n=4) within 80 GiB (h100 device_memory_gib)"
    )
    lost = pl.candidate_options(
        preds, TOKEN_JOB, partitions_from_hardware({"h100": entry})
    ).set_index("nodes")["not_offered_because"]
    assert lost[1] == (
        "does not fit: 79.5 GiB per rank (measured) over 79 GiB (h100 device_memory_gib 80 - "
        "memory_headroom_gib 1, the default for its device)"
    )


def test_a_series_without_memory_is_held_against_its_models_state_with_its_optimizer():
    """gpt2_350m (354,871,296 parameters), nothing measured: its state with SGD is 12 bytes per
    parameter (3.97 GiB), with AdamW 16 (5.29 GiB). On a 5 GiB partition the AdamW series does
    not fit, and the SGD series is offered with its lower bound stated, not as a fit."""
    from dlscale.analysis.scaling_model import model_tables
    from dlscale.models import SPECS

    from helpers.synthetic_study import cells_table
    from unit.analysis.test_scaling_model import STRATEGY_AXES

    params = SPECS["gpt2_350m"].param_count
    axes = {**STRATEGY_AXES, "model": ["gpt2_350m"], "parallelism": ["ddp"]}
    bare = cells_table(axes).drop(columns=["state_bytes_per_rank_max", "peak_allocated_mb_max"])
    bare = bare.assign(peak_rss_mb_max=np.nan)
    job = [{"name": "j", "model": "gpt2_350m", "samples": 1e6}]
    part = [pl.Partition("h100", 8, device_memory_mb=5 * GIB)]
    sgd = model_tables(bare, plan_nodes={"h100": 8})[1]
    plan = pl.make_plan(sgd, job, part)
    assert plan.plan.loc[0, "memory_per_rank_mb"] == pytest.approx(params * 12 / 2**20)
    assert plan.plan.loc[0, "memory_check"] == (
        "not checked: no memory measured; at least 3.97 GiB per rank (lower bound: the model's "
        "state with sgd / 1, no memory measured) within 5 GiB (h100 device_memory_gib)"
    )
    adamw = model_tables(bare.assign(optimizer="adamw"), plan_nodes={"h100": 8})[1]
    with pytest.raises(pl.PlanError, match="no option of model 'gpt2_350m' fits in"):
        pl.make_plan(adamw, job, part)
    why = pl.candidate_options(adamw, job, part)["not_offered_because"].iloc[0]
    assert why == (
        "does not fit: at least 5.29 GiB per rank (lower bound: the model's state with adamw / "
        "1, no memory measured) over 5 GiB (h100 device_memory_gib)"
    )


def test_a_plan_without_alternatives_says_so_in_a_sentence(capsys):
    """One series on one partition: no alternative; the printed plan says so in words where
    pandas would print "Empty DataFrame" and its columns."""
    alone = predictions({("fast", "pt"): lambda n: 100 * n}, max_nodes=1)
    result = pl.make_plan(alone, JOB, [pl.Partition("fast", 2, 4.0, 500.0)])
    assert result.alternatives.empty
    pl._print_plan(result)
    out = capsys.readouterr().out
    assert "Empty DataFrame" not in out and "Columns:" not in out
    assert "alternatives:\nnone: each job had one measured series" in out
