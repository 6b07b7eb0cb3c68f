"""Compare knows what it compares: settings, the competition flag and
provenance differences come first, each difference is a column of its own, and a cell whose
settings differ is never called faster or slower without saying so."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from dlscale.decisions.compare import (
    BOTH,
    COLUMNS,
    FASTER,
    SETTINGS_DIFFER,
    compare_cells,
    compare_outputs,
    counts,
)

from helpers.synthetic_study import DEMO, cells_table


def two_studies() -> tuple[pd.DataFrame, pd.DataFrame]:
    """A = the demo (steps 10); B = the demo with 12 timed steps for cnn_small, 20 % more
    throughput there, and every cell of B measured under competition."""
    a = cells_table(DEMO).assign(steps=10, warmup_steps=3, libraries="torch 2.13", hosts="n1")
    b = a.copy()
    cnn = b["model"] == "cnn_small"
    b.loc[cnn, "steps"] = 12
    b.loc[cnn, "throughput_samples_per_s"] *= 1.2
    b["competing"] = True
    return a, b


def test_a_cell_whose_settings_differ_is_never_plainly_faster():
    a, b = two_studies()
    table = compare_cells(a, b)
    cnn = table[table["model"] == "cnn_small"]
    assert cnn["beyond_noise"].all()
    assert set(cnn["difference"]) == {f"{FASTER}, {SETTINGS_DIFFER}"}
    assert set(cnn["settings_differ"]) == {"steps 10 -> 12"}
    other = table[table["model"] != "cnn_small"]
    assert set(other["settings_differ"]) == {""} and not other["beyond_noise"].any()
    assert set(table["competing"]) == {"A 0/2, B 2/2"}
    c = counts(table)
    assert c["faster"] == 0 and c["settings_beyond"] == len(cnn) == 4 and c["competing"] == 8
    # each difference a column, before the numbers
    assert COLUMNS.index("settings_differ") < COLUMNS.index("competing")
    assert COLUMNS.index("provenance_differs") < COLUMNS.index("median_a")


def test_the_summary_shows_what_differs_first(tmp_path, monkeypatch):
    import matplotlib.figure

    from helpers.figure_check import figure_problems

    checked = {}
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, out, *args, **kwargs):  # the ratio figure, checked as it is saved
        checked[Path(out).parent.name] = (
            figure_problems(fig),
            {ln.get_color() for ax in fig.axes for ln in ax.get_lines()},
        )
        return original(fig, out, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    a, b = two_studies()
    for name, cells in (("a", a), ("b", b)):
        (tmp_path / name / "tables").mkdir(parents=True)
        cells.assign(study=name).to_csv(tmp_path / name / "tables/cells.csv", index=False)
    b.assign(study="b", libraries="torch 2.14").to_csv(tmp_path / "b/tables/cells.csv", index=False)
    table, md = compare_outputs(tmp_path / "a", tmp_path / "b", tmp_path / "out")
    first, ratios = md.split("## Ratios")
    assert "| steps | 10; 12 | 10 |" not in first  # study-wide values: A's, then B's
    assert "| steps | 10 | 10; 12 |" in first
    assert "Competition: cells measured while other processes competed" in first
    assert "A 0 of 8, B 8 of 8" in first
    assert "| libraries | torch 2.13 | torch 2.14 |" in first
    assert "0 slower and 0 faster beyond noise" in ratios
    assert "4 more differ beyond noise but their settings differ too" in ratios
    assert "| faster |" not in ratios and "**faster, settings differ**" in ratios
    tex = (tmp_path / "out/summary.tex").read_text()
    assert tex.index("setting & steps") < tex.index("Ratio of median throughput")
    assert "faster, settings differ" in tex
    # the same study against itself: nothing differs, and it says so
    _, same = compare_outputs(tmp_path / "a", tmp_path / "a", tmp_path / "self")
    assert "Settings: no difference in" in same and "no cell of either study" in same
    assert (table["side"] == BOTH).all()
    problems, colours = checked["out"]
    assert problems == [] and "tab:orange" in colours  # settings differ: drawn apart
    assert checked["self"][0] == [] and "tab:orange" not in checked["self"][1]
