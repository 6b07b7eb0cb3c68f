"""Published references (config/references.yaml `published:`, dlscale.decisions.published): the
shipped torchtitan figures validate; a measured cell of the same model, framework, strategy and
precision is set against the closest entry, with the fraction reached and each differing
condition named; nothing else matches; `bless` keeps the published entries."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from dlscale.decisions import published
from dlscale.decisions.reference_bless import _dump
from dlscale.study.references import load_published, schema_path

from helpers.checkout import ROOT

REFS = ROOT / "config" / "references.yaml"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(scope="module")
def entries() -> list[dict]:
    return load_published(REFS, schema_path(ROOT))


def _row(**changes) -> dict:
    row = {
        "hardware": "h100",
        "framework": "pytorch",
        "model": "llama3_8b",
        "policy": "weak",
        "precision": "bf16",
        "mode": "eager",
        "parallelism": "fsdp",
        "nodes": 1,
        "world_size": 8,
        "per_rank_batch": 2,
        "n": 5,
        "throughput_tokens_per_s_median": 8 * 4000.0,
    }
    return {**row, **changes}


def test_the_shipped_figures_are_torchtitans_with_their_conditions(entries):
    by_name = {e["name"]: e for e in entries}
    eight = by_name["torchtitan-llama3.1-8b-fsdp-8gpu"]
    assert eight["tokens_per_s_per_gpu"] == 5762 and eight["peak_memory_gib"] == 82.4
    assert (eight["world_size"], eight["per_rank_batch"], eight["seq_len"]) == (8, 2, 8192)
    assert eight["activation_checkpointing"] == "selective_op" and "500 W" in eight["device"]
    assert "SXM peak" in eight["notes"] and "does not fit an 80 GB" in eight["notes"]
    compiled = by_name["torchtitan-llama3.1-8b-fsdp-compile-128gpu"]
    assert (compiled["tokens_per_s_per_gpu"], compiled["world_size"]) == (6514, 128)
    assert sorted(e["tokens_per_s_per_gpu"] for e in entries) == [5605, 5762, 6514, 6667]


def test_a_matching_cell_reads_its_fraction_and_what_differs(entries):
    table = published.comparison(pd.DataFrame([_row()]), entries, {"h100": H100})
    (r,) = table.to_dict("records")
    assert r["reference"] == "torchtitan-llama3.1-8b-fsdp-8gpu"  # the closest of four
    assert r["measured_tokens_per_s_per_gpu"] == 4000.0
    assert r["fraction"] == pytest.approx(4000 / 5762)
    assert r["conditions_differing"] == (
        "activation checkpointing none (published selective_op); device NVIDIA H100 80GB HBM3 "
        "(published NVIDIA H100 96GB HBM2e (SXM, 500 W power limit))"
    )
    compiled = published.comparison(
        pd.DataFrame([_row(mode="compiled", world_size=128, nodes=16, per_rank_batch=1)]),
        entries,
        {"h100": H100},
    ).iloc[0]
    assert compiled["reference"] == "torchtitan-llama3.1-8b-fsdp-compile-128gpu"
    assert "per rank batch 1 (published 2)" in compiled["conditions_differing"]
    text = published.tex(table, entries)
    assert "69.4\\,\\% of 5,762" in text and "n = 5" in text


def test_other_models_strategies_and_precisions_match_nothing(entries):
    rows = [
        _row(model="llama3_debug", hardware="cpu", precision="fp32"),
        _row(parallelism="ddp"),
        _row(precision="fp32"),
        _row(throughput_tokens_per_s_median=float("nan")),
    ]
    table = published.comparison(pd.DataFrame(rows), entries, {"h100": H100})
    assert table.empty and list(table.columns) == published.COLUMNS
    assert "No measured cell of this study matches one" in published.tex(table, entries)


def test_bless_keeps_the_published_entries(entries):
    text = _dump({"cpu": {}}, entries)
    assert yaml.safe_load(text)["published"] == entries
