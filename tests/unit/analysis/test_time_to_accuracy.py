"""Convergence validity: each convergence series' epochs to target at every
global batch against its reference convergence point (the smallest global batch), flagged too
fast or too slow outside a band from the reference's repetitions, or a stated fixed tolerance
where the reference has one repetition; the tables, the report's macros and table, the config
key (validated, in no hash). Constructed series go through the production functions: metrics
files -> dlscale.analysis.collect.collect_tables -> dlscale.analysis.time_to_accuracy ->
dlscale.outputs.tta_section."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlscale.analysis.collect import collect_tables
from dlscale.analysis.stats import median_interval
from dlscale.analysis.time_to_accuracy import (
    DEFAULT_VALIDITY_TOLERANCE,
    VALIDITY_COLUMNS,
    time_to_accuracy_summary,
)
from dlscale.outputs.latex_text import tex_escape, write_macros
from dlscale.outputs.tta_section import convergence_macros, write_convergence_table
from dlscale.study.config import ConfigError
from dlscale.study.matrix import load_study

from unit.study.test_convergence import REPORT_CONFIG, assembled, conv_cell, write_cell

TEMPLATE = Path(__file__).parents[3] / "scripts" / "dlscale" / "templates" / "report.tex.j2"


def reaching_at(epochs: int) -> list[float]:
    """Validation accuracies of a run that first reaches the 0.95 target after `epochs`."""
    return [0.5] * (epochs - 1) + [0.96]


def measured_series(root: Path, framework: str, epochs: dict[int, list[int]]) -> list[str]:
    """Metrics files of one series (weak scaling: global batch 16 x nodes): per node count, the
    epochs to target of each repetition."""
    paths = []
    for nodes, reps in epochs.items():
        for rep, e in enumerate(reps, 1):
            cell = conv_cell(framework=framework, nodes=nodes, rep=rep, max_epochs=10)
            paths.append(write_cell(root, cell, assembled(reaching_at(e), cell, seconds=1.0)))
    return paths


# Two series, each with one point too fast, one in band and one too slow:
# pytorch: 2 repetitions per point, the reference (1 node, global batch 16) at 4 and 5 epochs:
#   its band is their range 4--5; 2 nodes at 2, 3 (wholly below), 4 nodes at 5, 6 (overlaps),
#   8 nodes at 7, 8 (wholly above);
# horovod: one repetition per point, the reference at 4 epochs: no band from repetitions, the
#   fixed +/-25 % (3--5): 2 epochs too fast, 5 on the band's edge (inside), 6 too slow.
RANGE_SERIES = {1: [4, 5], 2: [2, 3], 4: [5, 6], 8: [7, 8]}
FIXED_SERIES = {1: [4], 2: [2], 4: [5], 8: [6]}
EXPECTED = {1: "reference", 2: "too_fast", 4: "in_band", 8: "too_slow"}


@pytest.fixture
def tables(tmp_path, monkeypatch) -> dict[str, pd.DataFrame]:
    monkeypatch.chdir(tmp_path)
    paths = measured_series(tmp_path, "pytorch", RANGE_SERIES)
    paths += measured_series(tmp_path, "horovod", FIXED_SERIES)
    return collect_tables(paths)


def test_a_too_fast_a_too_slow_and_an_in_band_point_are_flagged_in_each_series(tables):
    tta = tables["time_to_accuracy"]
    assert len(tables["quarantine"]) == 0 and len(tta) == 8
    for framework in ("pytorch", "horovod"):
        series = tta[tta["framework"] == framework].set_index("nodes")
        assert series["convergence_validity"].to_dict() == EXPECTED, framework
        assert (series["reference_nodes"] == 1).all()
        assert (series["reference_global_batch"] == 16).all()

    ranged = tta[tta["framework"] == "pytorch"].set_index("nodes")
    assert (ranged["epochs_band"] == "range").all() and (ranged["reference_n"] == 2).all()
    assert (ranged["epochs_band_low"] == 4).all() and (ranged["epochs_band_high"] == 5).all()
    assert ranged["validity_tolerance"].isna().all()  # the band is the repetitions', not fixed
    assert ranged.loc[2, ["epochs_to_accuracy_ci_low", "epochs_to_accuracy_ci_high"]].tolist() == [
        2,
        3,
    ]
    assert ranged.loc[8, "epochs_ratio"] == pytest.approx(7.5 / 4.5)

    fixed = tta[tta["framework"] == "horovod"].set_index("nodes")
    assert (fixed["epochs_band"] == "fixed").all() and (fixed["reference_n"] == 1).all()
    assert (fixed["validity_tolerance"] == DEFAULT_VALIDITY_TOLERANCE).all()
    assert fixed.loc[1, ["epochs_band_low", "epochs_band_high"]].tolist() == [3, 5]
    assert fixed["epochs_to_accuracy_ci_low"].isna().all()  # one repetition: no interval


def test_the_summary_only_adds_columns():
    """The table's earlier columns keep their names and order; the validity columns follow."""
    columns = list(time_to_accuracy_summary(pd.DataFrame(columns=["reached"])).columns)
    assert columns[-len(VALIDITY_COLUMNS) :] == VALIDITY_COLUMNS
    assert columns[: -len(VALIDITY_COLUMNS)][-4:] == [
        "baseline_nodes",
        "tta_speedup",
        "tta_efficiency",
        "ideal_time_to_accuracy_s",
    ]


def summary_rows(points: dict[tuple[int, int], list[float]], policy="weak") -> pd.DataFrame:
    """Convergence table rows of one series: (nodes, global batch) -> epochs per repetition
    (NaN: not reached within 10 epochs)."""
    rows = []
    for (nodes, batch), reps in points.items():
        for rep, e in enumerate(reps, 1):
            done = not np.isnan(e)
            rows.append(
                {
                    "study": "s",
                    "hardware": "cpu",
                    "framework": "pytorch",
                    "model": "cnn_small",
                    "policy": policy,
                    "precision": "fp32",
                    "mode": "eager",
                    "nodes": nodes,
                    "rep": rep,
                    "world_size": nodes,
                    "per_rank_batch": batch // nodes,
                    "global_batch": batch,
                    "reached": done,
                    "time_to_accuracy_s": 2.0 * e,
                    "epochs_to_accuracy": e,
                    "epochs_run": e if done else 10,
                    "training_seconds": 2.0 * (e if done else 10),
                    "best_val_accuracy": 0.96 if done else 0.9,
                    "lr_rule": "linear",
                    "base_learning_rate": 0.05,
                    "reference_batch": 16,
                    "effective_learning_rate": 0.05,
                    "target_accuracy": 0.95,
                    "max_epochs": 10,
                }
            )
    return pd.DataFrame(rows)


def test_six_reference_repetitions_give_the_order_statistic_ci_as_the_band():
    reference = [4, 4, 5, 5, 5, 6, 6, 7]
    tta = time_to_accuracy_summary(
        summary_rows({(1, 16): reference, (2, 32): [8, 9, 9, 9, 10, 10, 9, 9], (4, 64): [5, 6]})
    ).set_index("nodes")
    low, high, kind = median_interval(reference)
    assert kind == "ci"
    assert (tta["epochs_band"] == "ci").all() and (tta["reference_n"] == 8).all()
    assert tta.loc[1, ["epochs_band_low", "epochs_band_high"]].tolist() == [low, high]
    assert tta.loc[2, "convergence_validity"] == "too_slow"
    assert tta.loc[4, "convergence_validity"] == "in_band"


def test_not_reached_and_a_reference_without_a_median_are_said_so():
    nan = float("nan")
    tta = time_to_accuracy_summary(summary_rows({(1, 16): [4, 5], (2, 32): [nan, nan]}))
    assert tta.set_index("nodes")["convergence_validity"].to_dict() == {
        1: "reference",
        2: "not_reached",
    }
    tta = time_to_accuracy_summary(summary_rows({(1, 16): [nan], (2, 32): [3]}))
    assert tta["convergence_validity"].tolist() == ["reference", "no_reference"]
    assert (tta["epochs_band"] == "none").all()


def test_under_the_strong_policy_the_reference_is_the_smallest_node_count():
    """Equal global batch at every node count: the smallest node count is the reference."""
    tta = time_to_accuracy_summary(
        summary_rows({(2, 32): [2], (1, 32): [4], (4, 32): [4]}, policy="strong")
    ).set_index("nodes")
    assert tta.loc[1, "convergence_validity"] == "reference"
    assert (tta["reference_nodes"] == 1).all()
    assert tta.loc[2, "convergence_validity"] == "too_fast"  # 2 < 4 x 0.75
    assert tta.loc[4, "convergence_validity"] == "in_band"


def test_the_fixed_tolerance_is_the_configured_one():
    rows = summary_rows({(1, 16): [4], (2, 32): [5]})
    assert time_to_accuracy_summary(rows)["convergence_validity"].tolist()[1] == "in_band"
    narrow = time_to_accuracy_summary(rows, validity_tolerance=0.2)
    assert narrow["convergence_validity"].tolist()[1] == "too_slow"  # 5 > 4 x 1.2
    assert narrow["validity_tolerance"].tolist() == [0.2, 0.2]
    with pytest.raises(ValueError, match="convergence.validity_tolerance"):
        time_to_accuracy_summary(rows, validity_tolerance=1.0)


def test_the_config_key_is_validated_documented_and_in_no_hash(root, base_config):
    schema = json.loads((root / "config" / "schemas" / "config.schema.json").read_text())
    key = schema["properties"]["convergence"]["properties"]["validity_tolerance"]
    assert key["default"] == DEFAULT_VALIDITY_TOLERANCE and "fixed" in key["description"]
    for bad, fragment in ((0, "must be > 0"), (1.5, "must be < 1"), ("x", "must be a number")):
        config = copy.deepcopy(base_config)
        config["convergence"]["validity_tolerance"] = bad
        with pytest.raises(ConfigError) as info:
            load_study(config, root)
        assert "convergence.validity_tolerance" in str(info.value) and fragment in str(info.value)
    config = copy.deepcopy(base_config)
    config["convergence"]["validity_tolerance"] = 0.4
    default, changed = load_study(base_config, root), load_study(config, root)
    assert "convergence" in default.config["workloads"]
    assert changed.config_hash == default.config_hash
    assert [(c.path, c.config_hash) for c in changed.cells] == [
        (c.path, c.config_hash) for c in default.cells
    ]


def test_the_report_says_each_points_repetitions_band_and_flag(tables, tmp_path):
    tta, cells = tables["time_to_accuracy"], tables["convergence"]
    out = tmp_path / "convergence_table.tex"
    write_convergence_table(tta, str(out), tex_escape)
    text = out.read_text()
    assert "Reps" in text and r"\textbf{too fast}" in text and r"\textbf{too slow}" in text
    assert "2.5 (2--3) & n1/16 & 4--5 (range, n=2)" in text
    assert r"6 & n1/16 & 3--5 (fixed $\pm$25\,\%, n=1)" in text
    macros = convergence_macros(REPORT_CONFIG, cells, tta)
    assert macros["ConvValidityCounts"] == (
        "6 point(s) compared with their series' reference: 2 in band, 2 too fast, 2 too slow, "
        "0 not reached, 0 no reference"
    )
    assert "1 with the min-max range of the reference's repetitions" in macros["ConvValidityBands"]
    assert "1 with the fixed tolerance +/-25 %" in macros["ConvValidityBands"]
    assert "no band from repetitions" in macros["ConvValidityBands"]
    assert (
        "horovod/cnn_small/weak/n8 (global batch 128): too slow, 6 epochs (n = 1)"
        in (macros["ConvValidityFlagged"])
    )
    # every validity macro the template uses is written
    used = set(re.findall(r"\\dls(ConvValidity\w+)", TEMPLATE.read_text()))
    assert used and used <= set(macros)
    # TeX Live is installed by scripts/setup.sh: its absence fails, never skips, the compile
    assert shutil.which("latexmk"), "latexmk not found: scripts/setup.sh installs TeX Live"
    write_macros({f"dls{k}": tex_escape(v) for k, v in macros.items()}, tmp_path / "macros.tex")
    paragraph = re.search(
        r"\\paragraph\{Convergence validity\.\}.*?(?=\\paragraph)", TEMPLATE.read_text(), re.S
    )
    assert paragraph
    (tmp_path / "doc.tex").write_text(
        "\\documentclass[10pt]{article}\\usepackage[T1]{fontenc}\\usepackage{lmodern}"
        "\\usepackage[margin=2.2cm]{geometry}\\usepackage{booktabs}\\usepackage{longtable}"
        "\\input{macros.tex}\\begin{document}\n"
        + paragraph.group(0)
        + "\\input{convergence_table.tex}\n\\end{document}\n"
    )
    done = subprocess.run(
        ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    log = (tmp_path / "doc.log").read_text()
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull \\hbox.*", log)
