"""Regression references and verdicts (dlscale.decisions.regression_check) and study comparison
(dlscale.decisions.compare) on
synthetic tables; the same on a real study's outputs is in tests/workflow/test_local_workflow.py."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from dlscale.decisions.compare import BOTH, ONLY_A, ONLY_B, compare_cells, provenance_differences
from dlscale.decisions.reference_bless import bless
from dlscale.decisions.reference_verdicts import (
    FAIL,
    NO_REFERENCE,
    NOT_MEASURED,
    PASS,
    best_reference,
    verdicts,
)
from dlscale.decisions.regression_check import load_references, write_verdicts_tex
from dlscale.study.config import ConfigError, load_schema

from helpers.synthetic_study import DEMO, study_tables


@pytest.fixture
def schema(root):
    return root / "config" / "schemas" / "references.schema.json"


def _walk(schema: dict, path: str = ""):
    for key, sub in schema.get("properties", {}).items():
        yield f"{path}{key}", sub
        yield from _walk(sub, f"{path}{key}.")
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        yield from _walk(extra, path)


def test_references_schema_keys_are_described_and_documented(root, schema):
    from unit.study.test_config import _configuration_reference

    readme = _configuration_reference(root)  # docs/pages/configuration.md, rendered
    s = load_schema(schema)
    keys = list(_walk(s)) + list(_walk(s["$defs"]["reference"]))
    names = {key.split(".")[-1] for key, _ in keys}
    assert {"references", "throughput_samples_per_s", "scaling_efficiency", "value", "lower"} <= (
        names
    )
    for key, sub in keys:
        if key.endswith("unit") and "const" in sub:
            continue  # a metric's fixed unit (the $defs entry describes `unit`)
        assert sub.get("description"), f"{key} lacks a description"
        name = re.escape(key.split(".")[-1])
        assert re.search(rf"[`.]{name}`", readme), f"the configuration reference lacks {key}"
    assert "`config/references.yaml`" in readme


def test_shipped_references_are_valid(root, schema):
    assert load_references(root / "config" / "references.yaml", schema) == []


@pytest.mark.parametrize(
    "entry, fragment",
    [
        ({"value": 1.0, "lower": -0.05, "upper": 0.05, "unit": "ms"}, "'samples/s' was expected"),
        ({"value": 1.0, "lower": 0.05, "upper": 0.05, "unit": "samples/s"}, "must be <= 0"),
        ({"value": 0, "lower": -0.05, "upper": 0.05, "unit": "samples/s"}, "must be > 0"),
        ({"value": 1.0, "upper": 0.05, "unit": "samples/s"}, "'lower' is a required property"),
    ],
)
def test_bad_references_are_refused_by_key(tmp_path, schema, entry, fragment):
    path = tmp_path / "refs.yaml"
    path.write_text(json.dumps({"references": {"cpu": {"*": {"throughput_samples_per_s": entry}}}}))
    with pytest.raises(ConfigError) as err:
        load_references(path, schema)
    assert fragment in str(err.value)
    path.write_text("references:\n  cpu:\n    '*':\n      speed: {value: 1}\n")
    with pytest.raises(ConfigError, match="unknown key 'speed'"):
        load_references(path, schema)


def _refs(tmp_path, schema, references: dict):
    path = tmp_path / "refs.yaml"
    path.write_text(json.dumps({"references": references}))
    return load_references(path, schema)


def _ref(value, lower=-0.05, upper=0.05, unit="samples/s"):
    return {"value": value, "lower": lower, "upper": upper, "unit": unit}


def test_most_specific_reference_wins(tmp_path, schema):
    refs = _refs(
        tmp_path,
        schema,
        {
            "*": {"*": {"throughput_samples_per_s": _ref(1)}},
            "cpu": {
                "*": {"throughput_samples_per_s": _ref(2)},
                "pytorch/*/n2": {"throughput_samples_per_s": _ref(3)},
            },
        },
    )
    cell = "pytorch/cnn_small/weak/fp32/eager/n2"
    pick = best_reference
    assert pick(refs, "cpu", cell, "throughput_samples_per_s").value == 3
    assert pick(refs, "cpu", cell.replace("n2", "n1"), "throughput_samples_per_s").value == 2
    assert pick(refs, "v100", cell, "throughput_samples_per_s").value == 1
    assert pick(refs, "cpu", cell, "scaling_efficiency") is None


def test_verdicts_pass_fail_margin_and_not_measured(tmp_path, schema):
    _, scaling, status = study_tables(DEMO)  # 2 repetitions: min-max ranges
    row = scaling[(scaling["model"] == "cnn_small") & (scaling["policy"] == "weak")]
    n1, n2 = (row[row["nodes"] == n].iloc[0] for n in (1, 2))
    refs = _refs(
        tmp_path,
        schema,
        {
            "cpu": {
                "pytorch/cnn_small/weak/fp32/eager/n1": {
                    "throughput_samples_per_s": _ref(n1["throughput_samples_per_s_median"]),
                    "time_to_accuracy_s": _ref(60.0, unit="s"),
                },
                "pytorch/cnn_small/weak/fp32/eager/n2": {
                    # measured 10 % below a +-5 % reference
                    "throughput_samples_per_s": _ref(n2["throughput_samples_per_s_median"] / 0.9),
                    "joules_per_sample": _ref(0.5, unit="J/sample"),
                },
                "pytorch/cnn_small/weak/fp32/eager/n4": {"throughput_samples_per_s": _ref(1.0)},
            }
        },
    )
    status = pd.concat(
        [status, status.iloc[[0]].assign(nodes=4, rep=1, status="failed")], ignore_index=True
    )
    table = verdicts(scaling, status, refs).set_index(["cell", "metric"])
    v = table["verdict"]
    assert v[("pytorch/cnn_small/weak/fp32/eager/n1", "throughput_samples_per_s")] == PASS
    fail = table.loc[("pytorch/cnn_small/weak/fp32/eager/n2", "throughput_samples_per_s")]
    assert fail["verdict"] == FAIL
    assert fail["margin"] == pytest.approx(0.9 * 1 - 0.95, abs=1e-9)  # -5 % of the reference
    assert fail["interval"] == "range (n=2)"
    assert fail["interval_vs_bounds"] in ("outside", "overlaps")
    assert v[("pytorch/cnn_small/weak/fp32/eager/n1", "time_to_accuracy_s")] == NOT_MEASURED
    assert v[("pytorch/cnn_small/weak/fp32/eager/n2", "joules_per_sample")] == NOT_MEASURED
    failed = table.loc[("pytorch/cnn_small/weak/fp32/eager/n4", "throughput_samples_per_s")]
    assert failed["verdict"] == NOT_MEASURED and "failed or missing" in failed["note"]
    # every other measured point: no-reference; no row for a baseline's efficiency
    others = table.drop(index=[i for i in table.index if "cnn_small/weak" in i[0]])
    assert set(others["verdict"]) == {NO_REFERENCE}
    baseline_efficiency = [
        i for i in table.index if i[0].endswith("/n1") and i[1] == "scaling_efficiency"
    ]
    assert baseline_efficiency == []
    out = tmp_path / "verdicts_table.tex"
    write_verdicts_tex(table.reset_index(), out, references_file="refs.yaml", unused=[])
    tex = out.read_text()
    assert "1 PASS, 1 FAIL, 3 not-measured" in tex and r"\textbf{FAIL}" in tex


def test_bless_shows_refuses_and_writes_valid_references(tmp_path, schema):
    _, scaling, _ = study_tables(DEMO)
    results = tmp_path / "results" / "demo"
    (results / "tables").mkdir(parents=True)
    scaling.to_csv(results / "tables" / "scaling.csv", index=False)
    refs = tmp_path / "references.yaml"
    refs.write_text("# my site\nreferences: {}\n")
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        assert bless(results, "cpu", refs, schema=schema, dry_run=True, out=fh) == 0
    assert refs.read_text() == "# my site\nreferences: {}\n"  # a dry run writes nothing
    assert out.read_text().count("\n+ cpu: ") == 8 + 4  # 8 throughputs, 4 non-baseline efficiencies
    with out.open("w") as fh:
        assert bless(results, "cpu", refs, schema=schema, out=fh) == 0
    assert refs.read_text().startswith("# my site\n")
    loaded = load_references(refs, schema)
    assert len(loaded) == 12 and {r.system for r in loaded} == {"cpu"}
    range_kind = [r for r in loaded if r.metric == "throughput_samples_per_s"]
    assert all(r.lower <= -0.05 and r.upper >= 0.05 for r in range_kind)  # widened by the range
    # the study's own results pass their references
    assert set(verdicts(scaling, pd.DataFrame(), loaded)["verdict"]) == {PASS}
    # other results would replace them: refused without --force, nothing written
    before = refs.read_text()
    doubled = scaling["throughput_samples_per_s_median"] * 2
    scaling.assign(throughput_samples_per_s_median=doubled).to_csv(
        results / "tables" / "scaling.csv", index=False
    )
    with out.open("w") as fh:
        assert bless(results, "cpu", refs, schema=schema, out=fh) == 2
    assert "refused" in out.read_text() and "~ cpu: " in out.read_text()
    assert refs.read_text() == before
    with out.open("w") as fh:
        assert bless(results, "cpu", refs, schema=schema, force=True, out=fh) == 0
    assert refs.read_text() != before
    with out.open("w") as fh:
        assert bless(results, "v100", refs, schema=schema, out=fh) == 2
    assert "no measured cell on system 'v100'" in out.read_text()


def test_compare_flags_beyond_noise_with_intervals():
    cells, _, _ = study_tables(DEMO)  # 2 repetitions per cell: min-max range intervals
    same = compare_cells(cells, cells)
    assert (same["side"] == BOTH).all() and not same["beyond_noise"].any()
    assert same["ratio"].tolist() == pytest.approx([1.0] * len(same))
    assert set(same["interval"]) == {"range (n=2/2)"}
    b = cells.copy()
    slow = b["model"] == "transformer_small"
    b.loc[slow, "throughput_samples_per_s"] *= 0.8
    b = b[~((b["model"] == "cnn_small") & (b["nodes"] == 2) & (b["policy"] == "strong"))]
    extra = b.iloc[[0]].assign(hardware="v100")
    table = compare_cells(cells, pd.concat([b, extra]))
    flagged = table[table["beyond_noise"]]
    assert set(flagged["model"]) == {"transformer_small"} and len(flagged) == 4
    assert set(flagged["difference"]) == {"slower"}
    assert (flagged["ratio_high"] < 1).all()
    assert table.loc[table["side"] == ONLY_A, "cell"].tolist() == [
        "pytorch/cnn_small/strong/fp32/eager/n2"
    ]
    assert table.loc[table["side"] == ONLY_B, "hardware"].tolist() == ["v100"]


def test_compare_names_provenance_differences():
    cells, _, _ = study_tables(DEMO)
    a = cells.assign(libraries="torch=2.1", hosts="n1")
    b = cells.assign(libraries="torch=2.2", hosts="n1")
    table = compare_cells(a, b)
    assert set(table["provenance_differs"]) == {"libraries"}
    sys_a = pd.DataFrame({"hardware": ["cpu"], "field": ["GPU driver"], "value": ["535.1"]})
    prov = provenance_differences(a, b, sys_a, sys_a.assign(value="550.2"))
    assert prov.set_index("field").to_dict("index") == {
        "libraries": {"a": "torch=2.1", "b": "torch=2.2"},
        "GPU driver": {"a": "535.1", "b": "550.2"},
    }
