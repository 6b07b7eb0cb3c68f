"""Figures stay readable at scale: a bounded number of files, panels and lines
(dlscale.outputs.plotting)."""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter

import pytest

from dlscale.analysis.stats import GROUP
from dlscale.outputs.figure_layout import (
    FAMILIES,
    FIGURE_NAME_PATTERN,
    MAX_PANELS,
    MAX_SERIES,
    figure_file_bound,
    figure_layout,
    variant,
)
from dlscale.outputs.plotting import plot_figure

from helpers.synthetic_study import DEMO, LARGE, groups, study_tables

COLUMN_IN = 3.5


@pytest.fixture(scope="module")
def large():
    return study_tables(LARGE)


def test_file_bound_formula():
    # per hardware: F families x ceil(10 models / floor(12 / 2 policies)) x ceil(5 series / 8)
    assert figure_file_bound(groups(LARGE)) == 4 * len(FAMILIES) * math.ceil(10 / 6) * 1
    assert figure_file_bound(groups(DEMO)) == len(FAMILIES)


def test_large_layout_is_bounded_and_complete():
    layout = figure_layout(groups(LARGE), COLUMN_IN)
    assert len(layout) == figure_file_bound(groups(LARGE)) == len(FAMILIES) * 4 * 2
    assert len({s["file"] for s in layout}) == len(layout)  # names are unique
    assert Counter(s["family"] for s in layout) == {f: 8 for f in FAMILIES}
    for spec in layout:
        assert 1 <= len(spec["panels"]) <= MAX_PANELS, spec["file"]
        assert 1 <= len(spec["series"]) <= MAX_SERIES, spec["file"]
        assert spec["file"] == f"{spec['hardware']}/{spec['family']}-{spec['part']}.pdf"
    # every (model, policy, series) of every hardware is drawn exactly once per family
    for family in FAMILIES:
        drawn = Counter()
        for spec in (s for s in layout if s["family"] == family):
            for (fw, prec), model in itertools.product(spec["series"], spec["models"]):
                for policy in spec["policies"]:
                    drawn[(spec["hardware"], fw, model, policy, prec)] += 1
        assert drawn == Counter(groups(LARGE)), family


def test_layout_is_deterministic_and_follows_the_axis_order():
    a = figure_layout(groups(LARGE), COLUMN_IN)
    assert a == figure_layout(groups(LARGE), COLUMN_IN)
    # F families x 2 pages per hardware
    assert [s["hardware"] for s in a[:: len(FAMILIES) * 2]] == LARGE["hardware"]
    assert a[0]["models"] == LARGE["model"][:5] and a[1]["models"] == LARGE["model"][5:]


def test_too_many_series_or_models_split_into_more_files():
    axes = {
        "hardware": ["h"],
        "framework": ["pytorch", "tensorflow", "keras"],
        "model": [f"m{i}" for i in range(30)],
        "policy": ["weak"],
        "precision": ["fp32", "bf16", "fp16"],
    }
    g = list(itertools.product(*axes.values()))
    layout = figure_layout(g, COLUMN_IN)
    # 30 models / 12 per file -> 3 model chunks; 9 series / 8 -> 2 series chunks
    assert len(layout) == figure_file_bound(g) == len(FAMILIES) * 3 * 2
    assert [s["file"] for s in layout if s["family"] == "speedup"] == [
        f"h/speedup-{k}.pdf" for k in range(1, 7)
    ]
    assert max(len(s["panels"]) for s in layout) == 10 <= MAX_PANELS
    assert sorted({len(s["series"]) for s in layout}) == [4, 5]


def test_a_page_with_only_excluded_panels_is_dropped():
    # 13 models (chunks of 7 and 6) x 9 series (chunks of 5 and 4); the second series chunk runs
    # only the last model, so (first model chunk, second series chunk) has nothing to draw
    series = [
        (fw, prec)
        for fw in ("pytorch", "tensorflow", "keras", "horovod")
        for prec in ("fp32", "bf16")
    ] + [("mxnet", "fp32")]
    g = [
        ("h", fw, f"m{i}", "weak", prec)
        for k, (fw, prec) in enumerate(series)
        for i in range(13)
        if k < 5 or i == 12
    ]
    layout = figure_layout(g, COLUMN_IN)
    assert figure_file_bound(g) == len(FAMILIES) * 2 * 2
    assert len(layout) == len(FAMILIES) * 3
    assert all(spec["panels"] for spec in layout)
    assert [s["file"] for s in layout if s["family"] == "breakdown"] == [
        f"h/breakdown-{k}.pdf" for k in (1, 2, 3)
    ]


def test_demo_layout_is_one_column_wide_file_per_family():
    layout = figure_layout(groups(DEMO), COLUMN_IN)
    assert [s["file"] for s in layout] == [f"cpu/{f}.pdf" for f in FAMILIES]
    for spec in layout:
        assert spec["width_in"] == COLUMN_IN
        assert len(spec["panels"]) == (2 if spec["family"] == "frameworks" else 4)


def test_every_file_name_matches_the_figure_rule_wildcard():
    names = [
        spec["file"] for axes in (LARGE, DEMO) for spec in figure_layout(groups(axes), COLUMN_IN)
    ]
    assert all(re.fullmatch(rf"[^/]+/{FIGURE_NAME_PATTERN}\.pdf", name) for name in names)
    for other in ("cpu/speedup-a.pdf", "cpu/speedups.pdf", "cpu/throughput-1-2.pdf"):
        assert not re.fullmatch(rf"[^/]+/{FIGURE_NAME_PATTERN}\.pdf", other)


def test_large_study_renders_every_file_within_the_bounds(large, tmp_path):
    _, scaling, _ = large
    keys = [
        (*row[:4], variant(*row[4:]))
        for row in scaling[GROUP].drop_duplicates().itertuples(index=False, name=None)
    ]
    layout = figure_layout(keys, COLUMN_IN)
    assert len(layout) == figure_file_bound(groups(LARGE))
    for spec in layout:  # every file of the layout within the bounds
        assert len(spec["panels"]) <= MAX_PANELS and len(spec["series"]) <= MAX_SERIES, spec
    # drawn: per family, the file with the most panels and the one with the most series (the
    # fullest; every hardware key's layout has the same shape here; drawing all 40 files took a
    # minute of the suite)
    fullest = {}
    for spec in layout:
        for size in ("panels", "series"):
            key = (spec["family"], size)
            if key not in fullest or len(spec[size]) > len(fullest[key][size]):
                fullest[key] = spec
    drawn_files = {spec["file"]: spec for spec in fullest.values()}
    assert len({s["family"] for s in layout}) * 2 >= len(drawn_files) >= 5
    for spec in drawn_files.values():
        out = tmp_path / spec["file"]
        out.parent.mkdir(parents=True, exist_ok=True)
        drawn = plot_figure(scaling, spec, str(out))
        assert drawn["panels"] == len(spec["panels"]) <= MAX_PANELS, spec["file"]
        assert drawn["series_max"] == len(spec["series"]) <= MAX_SERIES, spec["file"]
        data = out.read_bytes()
        assert data.startswith(b"%PDF") and len(data) > 5000, spec["file"]
    assert len(list(tmp_path.rglob("*.pdf"))) == len(drawn_files)


def test_missing_data_still_renders(tmp_path):
    _, scaling, _ = study_tables(DEMO)
    layout = figure_layout(groups(DEMO), COLUMN_IN)
    part = scaling[scaling["model"] == "cnn_small"]  # one model never measured
    for spec in layout:
        out = tmp_path / spec["file"]
        out.parent.mkdir(parents=True, exist_ok=True)
        drawn = plot_figure(part, spec, str(out))
        assert drawn["panels"] == len(spec["panels"]) and out.stat().st_size > 0


def test_one_figure_at_a_time_across_threads():
    """The workflow draws figures on Snakemake's job threads (`run:` jobs, force-use-threads):
    while one thread draws under the paper style, no other thread can start drawing, and the
    style's rcParams never leak out of a drawing."""
    import threading

    import matplotlib

    from dlscale.outputs import figure_kit

    default_size = matplotlib.rcParams["font.size"]
    entered, release, other = threading.Event(), threading.Event(), []

    def draw():
        with figure_kit.paper_style():
            entered.set()
            release.wait(10)

    drawer = threading.Thread(target=draw)
    drawer.start()
    assert entered.wait(10)
    blocked = threading.Thread(target=lambda: other.append(figure_kit._PYPLOT.acquire(timeout=0.2)))
    blocked.start()
    blocked.join()
    assert other == [False]  # the second drawer waits while the first draws
    release.set()
    drawer.join()
    assert figure_kit._PYPLOT.acquire(timeout=1)
    figure_kit._PYPLOT.release()
    assert matplotlib.rcParams["font.size"] == default_size


def test_importing_the_drawing_code_never_switches_pyplots_backend(tmp_path):
    """The figure jobs import the drawing modules on Snakemake's threads, where another thread
    may be half-way through importing matplotlib.pyplot (seaborn imports it). An import that
    called `matplotlib.use` then found that half-made module and failed ("partially
    initialized module 'matplotlib.pyplot' has no attribute 'switch_backend'"), as a study
    did in the full test run; the backend is now chosen under the drawing lock. Reproduced
    here in a fresh interpreter with pyplot left half-imported in sys.modules."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "half_imported.py"
    script.write_text(
        "import sys, types\n"
        "import matplotlib\n"
        "sys.modules['matplotlib.pyplot'] = types.ModuleType('matplotlib.pyplot')\n"
        "import dlscale.outputs.plotting, dlscale.outputs.convergence_plots\n"
        "import dlscale.outputs.plan_figure, dlscale.decisions.compare\n"
    )
    scripts = Path(__file__).resolve().parents[3] / "scripts"
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(scripts), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
