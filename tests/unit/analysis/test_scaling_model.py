"""The scaling model on cells generated from known parameters (dlscale.analysis.scaling_model)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dlscale.analysis import scaling_model as sm
from dlscale.analysis import scaling_series as ss
from dlscale.analysis.stats import CI, NONE, RANGE, bootstrap_interval

ALPHA, BETA, C0, C1 = 2e-3, 1 / 5e8, 0.05, 0.002  # s, s/byte, s, s/sample
MODEL = "cnn_small"
G = ss.gradient_bytes(MODEL)


def tau(p, b, c2=0.0):
    return C0 + C1 * b + c2 * np.log2(p) + ALPHA * np.log2(p) + BETA * G * (p - 1) / p


def cells(
    nodes=(1, 2, 4, 8),
    reps=3,
    policy="weak",
    noise=0.0,
    compute=True,
    busbw=True,
    seed=0,
    contention=0.0,
):
    """Cells of one series whose step time is tau(p, b) (times 1 + noise), compute-only step
    C0 + C1 b and bus bandwidth 2 / BETA (the ring allreduce's busbw)."""
    rng = np.random.default_rng(seed)
    rows = []
    for n in nodes:
        for r in range(reps):
            b = 16 if policy == "weak" else 64 / n
            t = tau(n, b, contention) * (1 + noise * rng.standard_normal())
            rows.append(
                {
                    "hardware": "cpu",
                    "framework": "pytorch",
                    "model": MODEL,
                    "policy": policy,
                    "precision": "fp32",
                    "mode": "eager",
                    "nodes": n,
                    "rep": r + 1,
                    "ranks_per_node": 1,
                    "world_size": n,
                    "per_rank_batch": b,
                    "global_batch": b * n,
                    "throughput_samples_per_s": n * b / t,
                    "compute_seconds_median": C0 + C1 * b + contention * np.log2(n)
                    if compute
                    else np.nan,
                    "allreduce_busbw_gb_per_s": 2 / BETA / 1e9 if (busbw and n > 1) else np.nan,
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("policy", ["weak", "strong"])
def test_known_alpha_beta_are_recovered(policy):
    (series,) = ss.series_of(cells(policy=policy))
    model = sm.fit(series.points(), series.grad_bytes)
    assert model.kind == sm.COMMUNICATION and model.params["beta_from"] == "fitted"
    assert model.params["alpha"] == pytest.approx(ALPHA, rel=1e-6)
    assert model.params["beta"] == pytest.approx(BETA, rel=1e-6)
    assert model.params["c0"] + model.params["c1"] * 16 == pytest.approx(C0 + C1 * 16)
    # extrapolation to 64 nodes is exact on data the model generated
    b64 = 16 if policy == "weak" else 1
    assert model.throughput(64, b64) == pytest.approx(64 * b64 / tau(64, b64), rel=1e-6)
    loo = sm.leave_one_out(series)
    assert loo["loo_status"] == "validated" and loo["loo_folds"] == 4
    assert loo["loo_max_error"] < 1e-6


def test_host_contention_in_the_compute_step_is_separated_from_communication():
    (series,) = ss.series_of(cells(contention=0.01))
    model = sm.fit(series.points(), series.grad_bytes)
    assert model.params["c2"] == pytest.approx(0.01, rel=1e-6)
    assert model.params["alpha"] == pytest.approx(ALPHA, rel=1e-6)
    assert model.params["beta"] == pytest.approx(BETA, rel=1e-6)
    assert model.throughput(64, 16) == pytest.approx(64 * 16 / tau(64, 16, 0.01), rel=1e-6)


def test_one_node_count_above_one_takes_beta_from_the_bandwidth_probe():
    (series,) = ss.series_of(cells(nodes=(1, 4)))
    model = sm.fit(series.points(), series.grad_bytes)
    assert model.params["beta_from"] == "allreduce probe"
    assert model.params["beta"] == pytest.approx(BETA)
    assert model.params["alpha"] == pytest.approx(ALPHA)
    assert sm.leave_one_out(series)["loo_status"].startswith("too short to validate (2 node")


def test_without_compute_only_step_an_empirical_law():
    (two,) = ss.series_of(cells(nodes=(1, 2), compute=False))
    assert sm.fit(two.points(), two.grad_bytes).kind == sm.AMDAHL
    (four,) = ss.series_of(cells(compute=False))
    model = sm.fit(four.points(), four.grad_bytes)
    assert model.kind == sm.USL
    # USL data are fitted exactly
    lam, sigma, kappa = 100.0, 0.05, 0.001
    usl = sm.ScalingModel(sm.USL, {"lam": lam, "sigma": sigma, "kappa": kappa})
    p = np.array([1.0, 2, 4, 8, 16])
    pts = {"p": p, "b": np.full(5, 16.0), "throughput": usl.throughput(p, 16)}
    pts["compute"] = pts["busbw"] = np.full(5, np.nan)
    fitted = sm.fit(pts, G)
    assert fitted.params["sigma"] == pytest.approx(sigma, rel=1e-4)
    assert fitted.params["kappa"] == pytest.approx(kappa, rel=1e-4)


def test_intervals_are_honest_for_n():
    # one repetition, not validated (2 node counts): no interval at all, and the rows say why
    fits, preds = sm.model_tables(cells(nodes=(1, 2), reps=1))
    assert set(preds["interval"]) == {NONE} and preds["throughput_samples_per_s_low"].isna().all()
    assert not preds["validated"].any() and preds["model_error"].isna().all()
    spans = "only; not validated: too short to validate (2 node counts; 3 needed); model error"
    assert preds["interval_spans"].str.contains(spans, regex=False).all()
    # one repetition, validated: the band is the model error's alone (no noise interval)
    fits, preds = sm.model_tables(cells(reps=1, noise=0.05))
    assert set(preds["interval"]) == {NONE} and preds["validated"].all()
    e = fits.loc[0, "loo_max_error"]
    assert e > 0 and (preds["model_error"] == e).all()
    x = preds["throughput_samples_per_s_pred"]
    assert np.allclose(preds["throughput_samples_per_s_low"], x / (1 + e))
    assert np.allclose(preds["throughput_samples_per_s_high"], x / (1 - e))
    assert preds["interval_spans"].str.startswith("no repetition noise (n = 1) + model error").all()
    fits, preds = sm.model_tables(cells(reps=2, noise=0.05))
    assert set(preds["interval"]) == {RANGE}
    ok = preds.dropna(subset=["throughput_samples_per_s_low"])
    assert (ok["throughput_samples_per_s_low"] <= ok["throughput_samples_per_s_high"]).all()


def test_predictions_extend_with_intervals_and_flags():
    fits, preds = sm.model_tables(cells(reps=2, noise=0.02), plan_nodes={"cpu": 64})
    assert fits.loc[0, "loo_status"] == "validated" and fits.loc[0, "loo_median_error"] < 0.1
    # validated: 1..64 (max_extrapolation 8 x the largest, 8)
    assert preds["nodes"].max() == 64 and len(preds) == 64
    assert fits.loc[0, "max_extrapolation"] == 8 and (preds["max_extrapolation"] == 8).all()
    top = preds[preds["nodes"] == 64].iloc[0]
    assert top["extrapolated"] and not top["measured"]
    assert top["throughput_samples_per_s_low"] <= top["throughput_samples_per_s_pred"]
    assert top["throughput_samples_per_s_pred"] <= top["throughput_samples_per_s_high"]
    # at most max_extrapolation x the largest measured node count
    _, capped = sm.model_tables(cells(nodes=(1, 2, 4)), max_extrapolation=4)
    assert capped["nodes"].max() == 16 and list(capped["nodes"]) == [1, 2, 4, 8, 16]


def test_bootstrap_interval_kinds_follow_n():
    def stat(*samples):
        return np.array([np.median(samples[0])])

    assert bootstrap_interval([np.arange(1.0)], stat)[2] == NONE
    low, high, kind = bootstrap_interval([np.arange(3.0)], stat)
    assert kind == RANGE and (low[0], high[0]) == (0.0, 2.0)
    low, high, kind = bootstrap_interval([np.arange(20.0)], stat, n_resamples=500)
    assert kind == CI and low[0] < 9.5 < high[0]


# ---- what a prediction may claim: capped extrapolation, widened intervals ----------------------


def test_an_unvalidated_series_is_predicted_at_most_twice_its_largest_node_count():
    # the demo's shape: measured at 1 and 2 nodes, too short to validate
    fits, preds = sm.model_tables(cells(nodes=(1, 2), reps=2, noise=0.02), plan_nodes={"cpu": 64})
    assert fits.loc[0, "loo_status"].startswith("too short to validate")
    assert fits.loc[0, "max_extrapolation"] == sm.DEFAULT_MAX_EXTRAPOLATION_UNVALIDATED == 2
    assert list(preds["nodes"]) == [1, 2, 3, 4]  # the planner's 1..64 stop at 2 x 2 as well
    assert list(preds.loc[preds["extrapolated"], "nodes"]) == [3, 4]
    # explicit predict_nodes are capped too
    _, preds = sm.model_tables(cells(nodes=(1, 2), reps=2), predict_nodes=[4, 8, 16])
    assert list(preds["nodes"]) == [1, 2, 4]
    # a validated series of the same data goes to max_extrapolation
    _, preds = sm.model_tables(cells(nodes=(1, 2, 4), reps=2, noise=0.02))
    assert list(preds["nodes"]) == [1, 2, 4, 8, 16, 32]


def test_the_config_key_allows_unvalidated_extrapolation_further():
    series = cells(nodes=(1, 2), reps=2, noise=0.02)
    fits, preds = sm.model_tables(series, max_extrapolation_unvalidated=8)
    assert fits.loc[0, "max_extrapolation"] == 8
    assert list(preds["nodes"]) == [1, 2, 4, 8, 16]
    assert not preds["validated"].any()  # still said to be unvalidated
    # max_extrapolation bounds every series: the unvalidated factor cannot exceed it
    fits, preds = sm.model_tables(series, max_extrapolation=4, max_extrapolation_unvalidated=16)
    assert fits.loc[0, "max_extrapolation"] == 4 and preds["nodes"].max() == 8
    # and 1 means no extrapolation
    _, preds = sm.model_tables(series, max_extrapolation_unvalidated=1)
    assert list(preds["nodes"]) == [1, 2] and not preds["extrapolated"].any()


def test_a_validated_series_interval_is_widened_by_its_leave_one_out_error():
    series = cells(nodes=(1, 2, 4, 8), reps=3, noise=0.03, seed=3)
    (s,) = ss.series_of(series)
    loo = sm.leave_one_out(s)
    e = loo["loo_max_error"]
    assert loo["loo_status"] == sm.VALIDATED and 0 < e < 1
    noise_only = sm.predict(s, [1, 2, 4, 8, 16, 32])
    widened = sm.predict(s, [1, 2, 4, 8, 16, 32], loo=loo)
    assert not noise_only["validated"].any() and widened["validated"].all()
    assert (widened["model_error"] == e).all()
    for m in ("throughput_samples_per_s", "speedup", "scaling_efficiency"):
        pd.testing.assert_series_equal(widened[f"{m}_pred"], noise_only[f"{m}_pred"])
        assert np.allclose(widened[f"{m}_low"], noise_only[f"{m}_low"] / (1 + e))
        assert np.allclose(widened[f"{m}_high"], noise_only[f"{m}_high"] / (1 - e))
        assert (widened[f"{m}_low"] < noise_only[f"{m}_low"]).all()
        assert (widened[f"{m}_high"] > noise_only[f"{m}_high"]).all()
    assert widened["interval_spans"].str.contains(f"leave-one-out max {e:.1%}").all()
    # model_tables does the same
    _, preds = sm.model_tables(series)
    assert list(preds["nodes"]) == [1, 2, 4, 8, 16, 32, 64]
    assert np.allclose(
        preds["throughput_samples_per_s_low"][:6], widened["throughput_samples_per_s_low"]
    )
    # an unvalidated series keeps the noise interval and says the model error is unknown
    (short,) = ss.series_of(cells(nodes=(1, 2), reps=3, noise=0.03, seed=3))
    plain = sm.predict(short, [1, 2, 4], loo=sm.leave_one_out(short))
    assert plain["model_error"].isna().all() and not plain["validated"].any()
    assert plain["interval_spans"].str.endswith("; model error unknown").all()
    assert plain["interval_spans"].str.contains("too short to validate").all()


def test_widen_keeps_no_upper_bound_for_an_error_of_100_percent_or_more():
    low, high = sm.widen([10.0], [20.0], 0.25)
    assert low[0] == pytest.approx(8.0) and high[0] == pytest.approx(20 / 0.75)
    low, high = sm.widen([10.0], [20.0], 1.5)
    assert low[0] == pytest.approx(4.0) and np.isinf(high[0])
    low, high = sm.widen([10.0], [20.0], np.nan)
    assert (low[0], high[0]) == (10.0, 20.0)


# ---- a series per parallelism strategy; memory per rank ----------------------------------------

STRATEGY_AXES = {
    "hardware": ["h100"],
    "framework": ["pytorch"],
    "model": ["transformer_small"],
    "policy": ["weak"],
    "precision": ["fp32"],
    "mode": ["eager"],
    "parallelism": ["ddp", "fsdp"],
    "nodes": [1, 2, 4],
    "rep": [1, 2],
}


def test_a_series_is_per_parallelism_strategy():
    from helpers.synthetic_study import cells_table

    mixed = cells_table(STRATEGY_AXES)
    fits, preds = sm.model_tables(mixed)
    assert list(fits["parallelism"]) == ["ddp", "fsdp"]
    assert set(preds["parallelism"]) == {"ddp", "fsdp"}
    # each strategy's series is fitted from its own cells only, never pooled across strategies
    alone, _ = sm.model_tables(mixed[mixed["parallelism"] == "fsdp"])
    pd.testing.assert_frame_equal(fits.iloc[[1]].reset_index(drop=True), alone)
    # a cells table written before the axis gives the tables of its cells as ddp
    ddp = cells_table({**STRATEGY_AXES, "parallelism": ["ddp"]})
    for old, new in zip(sm.model_tables(ddp.drop(columns="parallelism")), sm.model_tables(ddp)):
        assert (old["parallelism"] == "ddp").all()
        pd.testing.assert_frame_equal(old, new)


def test_memory_per_rank_is_measured_or_predicted_from_the_sharding():
    from helpers.synthetic_study import cells_table, with_memory

    table = with_memory(cells_table(STRATEGY_AXES), rest_mib=1000.0, state_mib=8000.0)
    _, preds = sm.model_tables(table, plan_nodes={"h100": 8})
    got = preds.set_index(["parallelism", "nodes"])
    assert got.loc[("fsdp", 2), "memory_from"] == ss.MEASURED
    assert got.loc[("fsdp", 2), "memory_per_rank_mb"] == pytest.approx(1000 + 8000 / 2)
    assert got.loc[("fsdp", 2), "memory_measure"] == "peak_reserved_mb_max"
    # fsdp: the state shards over the world size; the rest is held at the nearest measured count
    assert got.loc[("fsdp", 8), "memory_from"] == "predicted from n=4"
    assert got.loc[("fsdp", 8), "memory_per_rank_mb"] == pytest.approx(1000 + 8000 / 8)
    assert got.loc[("fsdp", 3), "memory_per_rank_mb"] == pytest.approx(1000 + 8000 / 3)
    # ddp: every rank a full replica, the same at every node count
    assert got.loc[("ddp", 8), "memory_per_rank_mb"] == pytest.approx(9000)
    # strong scaling towards fewer ranks: the rest grows with the per-rank batch (64 / n)
    strong = cells(nodes=(2, 4), reps=1, policy="strong").assign(
        peak_allocated_mb_max=500.0, state_bytes_per_rank_max=100 * 2**20
    )
    (series,) = ss.series_of(strong)
    memory, source = ss.memory_per_rank(series, [1, 2, 8])
    assert memory == pytest.approx([(500 - 100) * 2 + 100, 500, 500])
    assert source == ["predicted from n=2", ss.MEASURED, "predicted from n=4"]
    # no memory recorded: a lower bound, the model's state with its optimizer
    # (float32 parameters and gradients, SGD's momentum 4 bytes, AdamW's moments 8), said so
    from dlscale.models import SPECS

    params = SPECS[MODEL].param_count
    (bare,) = ss.series_of(cells(nodes=(1, 2), reps=1))
    memory, source = ss.memory_per_rank(bare, [4])
    assert memory[0] == pytest.approx(params * 12 / 2**20)
    assert source[0] == f"{ss.LOWER_BOUND}: the model's state with sgd / 1, no memory measured"
    (adamw,) = ss.series_of(cells(nodes=(1, 2), reps=1).assign(optimizer="adamw"))
    assert ss.memory_per_rank(adamw, [4])[0][0] == pytest.approx(params * 16 / 2**20)
    # a model the registry does not know: unknown, and said so
    (bare,) = ss.series_of(cells(nodes=(1, 2), reps=1).assign(model="no_such_model"))
    memory, source = ss.memory_per_rank(bare, [4])
    assert np.isnan(memory[0]) and source[0].startswith("unknown")
