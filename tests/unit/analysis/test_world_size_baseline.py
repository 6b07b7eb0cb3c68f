"""Speedup against world size 1 where it was measured, the baseline of the smallest node count
for every table of one ranks per node per group, and figures over world size where nodes are not
the scaling unit."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer

from dlscale.analysis import scaling_model
from dlscale.analysis.stats import GROUP, add_speedup, scaling_summary
from dlscale.outputs import figure_kit, plotting
from dlscale.outputs.figure_layout import figure_layout, variant

from helpers.figure_check import figure_problems
from helpers.synthetic_study import DEMO_STUDY, cells_table

ADDED = ["baseline_nodes", "baseline_throughput", "baseline_world_size", "speedup"]


def gpu_cells(shape: list[tuple[int, int]]) -> pd.DataFrame:
    """One h100 pytorch/cnn_small/weak series: (nodes, ranks per node) -> 2 repetitions each,
    throughput 100 x world size x 0.9 per doubling."""
    axes = {**DEMO_STUDY, "hardware": ["h100"], "model": ["cnn_small"], "policy": ["weak"]}
    template = cells_table({**axes, "nodes": [1]}).drop(columns=ADDED + ["scaling_efficiency"])
    rows = []
    for nodes, rpn in shape:
        world = nodes * rpn
        rows.append(
            template.assign(
                nodes=nodes,
                ranks_per_node=rpn,
                world_size=world,
                global_batch=16 * world,
                throughput_samples_per_s=[
                    100.0 * world * 0.9 ** np.log2(world) * f for f in (0.99, 1.01)
                ],
            )
        )
    return add_speedup(pd.concat(rows, ignore_index=True))


def test_speedup_is_taken_against_world_size_one_where_it_was_measured():
    cells = gpu_cells([(1, 1), (1, 2), (1, 4), (2, 4)])
    assert set(cells["baseline_world_size"]) == {1} and set(cells["baseline_nodes"]) == {1}
    scaling = scaling_summary(cells)
    assert list(zip(scaling["nodes"], scaling["ranks_per_node"], scaling["world_size"])) == [
        (1, 1, 1),
        (1, 2, 2),
        (1, 4, 4),
        (2, 4, 8),
    ]
    expected = np.array([1.0, 2 * 0.9, 4 * 0.81, 8 * 0.729])
    np.testing.assert_allclose(scaling["speedup_median"], expected)
    np.testing.assert_allclose(scaling["scaling_efficiency_median"], expected / [1, 2, 4, 8])
    assert scaling["speedup_interval"].iloc[0] == "exact"


def test_without_world_size_one_the_smallest_world_size_is_the_baseline():
    scaling = scaling_summary(gpu_cells([(1, 2), (1, 4), (2, 4)]))
    assert set(scaling["baseline_world_size"]) == {2}
    np.testing.assert_allclose(scaling["speedup_median"], [1.0, 2 * 0.9, 4 * 0.81])
    np.testing.assert_allclose(scaling["scaling_efficiency_median"], [1.0, 0.9, 0.81])


def test_a_table_of_one_ranks_per_node_keeps_its_numbers():
    """The rule before the axis: the group's smallest node count (here 2, the 1-node cells
    missing) is its baseline, whatever its ranks per node (4 on every node here)."""
    cells = cells_table({**DEMO_STUDY, "hardware": ["h100"], "nodes": [2, 4, 8]})
    cells = add_speedup(
        cells.drop(columns=ADDED + ["scaling_efficiency"]).assign(
            ranks_per_node=4, world_size=lambda t: 4 * t["nodes"]
        )
    )
    base = cells[cells["nodes"] == 2].groupby(GROUP)["throughput_samples_per_s"].median()
    old = cells["throughput_samples_per_s"] / [base[tuple(r)] for r in cells[GROUP].to_numpy()]
    np.testing.assert_allclose(cells["speedup"], old)
    np.testing.assert_allclose(cells["scaling_efficiency"], old / (cells["nodes"] / 2))
    assert set(cells["baseline_nodes"]) == {2} and set(cells["baseline_world_size"]) == {8}


def _drawn(monkeypatch, tmp_path, cells: pd.DataFrame, family: str, predictions=None):
    """The figure of one family as drawn (checked by the figure check instead of saved)."""
    keys = [
        (*row[:4], variant(*row[4:]))
        for row in cells[GROUP].drop_duplicates().itertuples(index=False, name=None)
    ]
    spec = next(
        s
        for s in figure_layout(keys, 3.5, devices={"h100": "cuda", "cpu": "cpu"})
        if s["family"] == family
    )
    seen = {}

    def savefig(fig, out, *args, **kwargs):
        seen["problems"] = figure_problems(fig, spec["caption"], True)
        seen["fig"] = fig

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    plotting.plot_figure(scaling_summary(cells), spec, str(tmp_path / "f.pdf"), predictions)
    assert not seen["problems"], seen["problems"]
    return seen["fig"].axes[0]


@pytest.mark.parametrize("family", ["speedup", "breakdown", "memory"])
def test_a_series_within_a_node_is_drawn_over_world_size(monkeypatch, tmp_path, family):
    # world size 2 twice (1 x 2 and 2 x 1): the bar groups are nodes x GPUs per node
    cells = gpu_cells([(1, 1), (1, 2), (2, 1), (1, 4), (2, 4)])
    ax = _drawn(monkeypatch, tmp_path, cells, family)
    if family == "breakdown":
        assert ax.get_xlabel() == "Nodes x GPUs per node"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1x1", "1x2", "2x1", "1x4", "2x4"]
        return
    assert ax.get_xlabel() == "World size (GPUs)"
    if family == "speedup":
        measured, ideal = (
            ax.lines[0],
            next(line for line in ax.lines if line.get_label() == "ideal"),
        )
        assert list(measured.get_xdata()) == [1, 2, 4, 8]  # 2 x 1: an open point apart
        assert list(ideal.get_ydata()) == [1, 2, 4, 8]


def test_a_table_of_one_ranks_per_node_is_drawn_over_nodes(monkeypatch, tmp_path):
    cells = cells_table({**DEMO_STUDY, "model": ["cnn_small"], "policy": ["weak"]})
    ax = _drawn(monkeypatch, tmp_path, cells, "speedup")
    assert ax.get_xlabel() == "Nodes"
    assert list(ax.lines[0].get_xdata()) == [1, 2]


# the line families: (column of scaling.csv drawn, its scale on the y axis)
LINES = {
    "throughput": ("throughput_samples_per_s_median", 1.0),
    "speedup": ("speedup_median", 1.0),
    "efficiency": ("scaling_efficiency_median", 1.0),
    "telemetry": ("gpu_util_pct_mean_median", 1.0),
    "mfu": ("mfu_median", 100.0),
    "memory": ("state_bytes_per_rank_max_median", 2.0**-20),
}


def spread_cells() -> pd.DataFrame:
    """1x1, 1x2, 2x1, 2x2 (nodes x GPUs per node): world size 2 twice; the 2x1 cell 20 % below
    the 1x2 one in every quantity a line figure draws, so each point can be told apart."""
    cells = gpu_cells([(1, 1), (1, 2), (2, 1), (2, 2)]).drop(columns=ADDED + ["scaling_efficiency"])
    spread = (cells["nodes"] == 2) & (cells["ranks_per_node"] == 1)
    for q in ("throughput_samples_per_s", "gpu_util_pct_mean", "mfu", "state_bytes_per_rank_max"):
        cells.loc[spread, q] = pd.to_numeric(cells.loc[spread, q]) * 0.8
    return add_speedup(cells)


def labelled(ax, label: str) -> list:
    """The panel's data lines drawn with `label` (an error bar's line: its container's)."""
    bars = [c.lines[0] for c in ax.containers if c.get_label() == label]
    return bars + [ln for ln in ax.lines if ln.get_label() == label]


@pytest.mark.parametrize("family", list(LINES))
def test_a_line_over_world_size_runs_through_the_packed_cells(monkeypatch, tmp_path, family):
    """The line runs through each world size's cell on the fewest nodes (1x1, 1x2, 2x2): no
    repeated x, no vertical step at world size 2; the 2x1 cell is an open point of the
    series' colour at world size 2, not connected, with its own value; every point inside the
    panel (the figure check)."""
    cells = spread_cells()
    ax = _drawn(monkeypatch, tmp_path, cells, family)
    column, scale = LINES[family]
    row = scaling_summary(cells).set_index(["nodes", "ranks_per_node"])[column] * scale
    (line,) = labelled(ax, "pytorch")
    assert list(line.get_xdata()) == [1, 2, 4]
    np.testing.assert_allclose(np.asarray(line.get_ydata(), float), row[[(1, 1), (1, 2), (2, 2)]])
    for drawn in ax.lines:  # no connected line of the panel repeats an x (dotted ones included)
        if drawn.get_linestyle() != "None":
            assert (np.diff(np.asarray(drawn.get_xdata(), dtype=float)) > 0).all(), drawn
    (apart, *second) = labelled(ax, figure_kit.APART_LABEL)  # second: a dotted line's quantity
    assert apart.get_linestyle() == "None" and apart.get_markerfacecolor() == "none"
    assert apart.get_color() == line.get_color()
    assert list(apart.get_xdata()) == [2]
    np.testing.assert_allclose(np.asarray(apart.get_ydata(), float), [row[(2, 1)]])
    if family in ("throughput", "speedup", "efficiency"):  # its own error bar
        assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 2
    legend = [t.get_text() for t in ax.figure.legends[0].get_texts()]
    assert legend.count(figure_kit.APART_LABEL) == 1


def test_the_prediction_continues_from_the_packed_line(monkeypatch, tmp_path):
    cells = spread_cells()
    _, preds = scaling_model.model_tables(cells)
    ax = _drawn(monkeypatch, tmp_path, cells, "throughput", preds)
    (line,) = labelled(ax, "pytorch")
    (dashed,) = [ln for ln in ax.lines if ln.get_label() == figure_kit.UNVALIDATED_LABEL]
    assert list(dashed.get_xdata()) == [4, 8]
    assert dashed.get_ydata()[0] == line.get_ydata()[-1]


def test_the_frameworks_figure_takes_the_largest_world_size_on_its_fewest_nodes(
    monkeypatch, tmp_path
):
    """World size 4 twice (1x4 and 4x1) at the top: one point per model, the 1-node cell's (its
    bar groups were indexed by model twice: 'cannot reindex on an axis with duplicate labels')."""
    cells = gpu_cells([(1, 1), (1, 4), (4, 1)])
    ax = _drawn(monkeypatch, tmp_path, cells, "frameworks")
    assert ax.get_title() == "weak scaling, 1 node(s)"
    (line,) = labelled(ax, "pytorch")
    top = scaling_summary(cells).set_index(["nodes", "ranks_per_node"])
    np.testing.assert_allclose(
        np.asarray(line.get_ydata(), float), [top.loc[(1, 4), "throughput_samples_per_s_median"]]
    )
