"""A figure checked by machine, not by eye: what a reader would catch, read from the
drawn matplotlib artists of a figure as it is saved, after a draw with the figure's renderer.

`figure_problems(fig, caption)` lists, as sentences:

- a measured or predicted point (a line's vertex or a scatter marker), or an error bar's end,
  outside its panel's axis limits (data coordinates against the drawn limits; NaN ends, which
  draw nothing, are not points);
- a visible panel's x or y axis without a tick label inside its limits (an axis hidden, or a
  panel that draws data with its axes switched off, shows none);
- two text labels (titles, axis labels, tick labels inside the limits, legend entries, panel
  texts) whose rendered bounding boxes overlap (the renderer's window extents);
- an element the caption names (CAPTION_ELEMENTS: "shaded by its interval", "error bars",
  "dashed: ideal", "dashed: the target", "dotted", "hatched") that no visible panel draws
  (an element is drawn when its artist is in the panel and visible: a band hidden or fully
  transparent, an error-bar call without an interval, a reference line hidden, draw nothing).

This is the tests' own inspection: it reads the artists, it does not call the plotting
module's helpers.
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection, PathCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.lines import Line2D

# the smallest overlap of two labels' boxes that counts, in square pixels at the figure's dpi
# (boxes that only touch along an edge do not overlap)
MIN_OVERLAP_PX2 = 1.0


def _inside(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Finite values outside [lo, hi] (a relative slack of 1e-9 for float round-off)."""
    lo, hi = min(lo, hi), max(lo, hi)
    slack = 1e-9 * max(abs(lo), abs(hi), 1e-300)
    v = values[np.isfinite(values)]
    return v[(v < lo - slack) | (v > hi + slack)]


def _points(ax) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(what, x, y) of every data point the panel draws: lines' vertices (markers and line
    ends), scatter markers and error bars' segment ends."""
    out = []
    for line in ax.get_lines():
        if not line.get_visible() or not isinstance(line, Line2D):
            continue
        x = np.asarray(line.get_xdata(), dtype=float)
        y = np.asarray(line.get_ydata(), dtype=float)
        if x.size == 0:
            continue
        if line.get_transform() != ax.transData:  # axhline/axvline: axes-fraction coordinates
            continue
        out.append((f"line {line.get_label()!r}", x, y))
    for coll in ax.collections:
        if isinstance(coll, LineCollection) and coll.get_visible():
            segs = [np.asarray(s, dtype=float) for s in coll.get_segments() if len(s)]
            if segs:
                xy = np.concatenate(segs)
                out.append(("error bar", xy[:, 0], xy[:, 1]))
        elif isinstance(coll, PathCollection) and coll.get_visible():  # ax.scatter
            if coll.get_offset_transform() != ax.transData:
                continue
            xy = np.ma.filled(np.ma.asarray(coll.get_offsets(), dtype=float), np.nan)
            if xy.size:
                xy = xy.reshape(-1, 2)
                out.append((f"markers {coll.get_label()!r}", xy[:, 0], xy[:, 1]))
    return out


def points_outside(ax) -> list[str]:
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    bad = []
    for what, x, y in _points(ax):
        drawn = np.isfinite(x) & np.isfinite(y)
        ox = _inside(x[drawn], x0, x1)
        oy = _inside(y[drawn], y0, y1)
        if ox.size:
            bad.append(f"{what}: x {ox.tolist()} outside [{x0:.4g}, {x1:.4g}]")
        if oy.size:
            bad.append(f"{what}: y {oy.tolist()} outside [{y0:.4g}, {y1:.4g}]")
    return bad


def tick_labels(ax, which: str) -> list:
    """The axis' visible, non-empty tick labels (major and minor) inside its limits; none where
    the axis is hidden or the panel's axes are switched off (neither is drawn, whatever text
    its ticks kept from an earlier draw)."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    if not ax.axison or not axis.get_visible():
        return []
    lo, hi = sorted(axis.get_view_interval())
    slack = 1e-9 * max(abs(lo), abs(hi), 1e-300)
    shown = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        label = tick.label1
        loc = tick.get_loc()
        if loc is None or not (lo - slack <= loc <= hi + slack):
            continue
        if tick.get_visible() and label.get_visible() and label.get_text().strip():
            shown.append(label)
    return shown


def _texts(fig) -> list:
    """Every visible, non-empty text label of the figure: panels' titles, axis labels, tick
    labels inside the limits, texts; legends' entries and titles; the figure's own texts."""
    texts = list(fig.texts)
    for name in ("_suptitle", "_supxlabel", "_supylabel"):
        if getattr(fig, name, None) is not None:
            texts.append(getattr(fig, name))
    legends = list(fig.legends)
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison and not ax.texts:
            continue
        texts += [ax.title, ax._left_title, ax._right_title]
        texts += [a.label for a in (ax.xaxis, ax.yaxis) if ax.axison and a.get_visible()]
        texts += list(ax.texts)
        if ax.axison:
            texts += tick_labels(ax, "x") + tick_labels(ax, "y")
        if ax.get_legend() is not None:
            legends.append(ax.get_legend())
    for leg in legends:
        texts += [*leg.get_texts(), leg.get_title()]
    unique = list({id(t): t for t in texts}.values())  # a figure's sup-labels are in its texts
    return [t for t in unique if t.get_visible() and t.get_text().strip()]


def overlapping_labels(fig) -> list[str]:
    """Pairs of text labels whose rendered boxes (the renderer's window extents) overlap by
    more than MIN_OVERLAP_PX2 (all pairs at once, as arrays)."""
    renderer = fig.canvas.get_renderer()
    texts = _texts(fig)
    if len(texts) < 2:
        return []
    box = np.array([t.get_window_extent(renderer).extents for t in texts])  # x0 y0 x1 y1
    width = np.minimum.outer(box[:, 2], box[:, 2]) - np.maximum.outer(box[:, 0], box[:, 0])
    height = np.minimum.outer(box[:, 3], box[:, 3]) - np.maximum.outer(box[:, 1], box[:, 1])
    area = np.clip(width, 0, None) * np.clip(height, 0, None)
    i, j = np.nonzero(np.triu(area > MIN_OVERLAP_PX2, k=1))
    return [f"{texts[a].get_text()!r} overlaps {texts[b].get_text()!r}" for a, b in zip(i, j)]


# ---- what a caption names, and how to see it drawn ------------------------------------------


def _shaded(ax) -> bool:
    """A filled band (fill_between) with an area in the panel, visible and not fully
    transparent."""
    for coll in ax.collections:
        if isinstance(coll, PolyCollection) and not isinstance(coll, LineCollection):
            face = np.asarray(coll.get_facecolor(), dtype=float).reshape(-1, 4)
            if not coll.get_visible() or not (face[:, 3] > 0).any():
                continue
            for path in coll.get_paths():
                v = path.vertices
                v = v[np.isfinite(v).all(axis=1)]
                if len(v) >= 3:
                    x, y = v[:, 0], v[:, 1]
                    area = 0.5 * abs(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1)))
                    if area > 0:
                        return True
    return False


def _error_bars(ax) -> bool:
    """An error bar drawn: a segment with finite ends in a bar collection of an errorbar call
    that is still in the panel and visible. An errorbar call without an interval (no yerr or
    xerr) draws no bar, though it leaves its container; a zero-length bar (no interval, n = 1)
    counts as drawn."""
    drawn = [c for c in ax.collections if isinstance(c, LineCollection) and c.get_visible()]
    for container in ax.containers:
        if not isinstance(container, ErrorbarContainer):
            continue
        for bars in container.lines[2]:
            if not any(bars is c for c in drawn):
                continue
            for seg in bars.get_segments():
                if len(seg) and np.isfinite(np.asarray(seg, dtype=float)).all():
                    return True
    return False


def _line_styled(ax, style: str, label: str | None = None) -> bool:
    for line in ax.get_lines():
        if not line.get_visible() or label is not None and line.get_label() != label:
            continue
        if line.get_linestyle() == style:
            return True
    return False


def _hatched(ax) -> bool:
    return any(p.get_hatch() and p.get_visible() for p in ax.patches)


# phrase in a caption -> does a panel draw it (any visible panel; `predicted_panels_only`: the
# phrase is about predictions, so only panels that draw a predicted point must draw it)
CAPTION_ELEMENTS = {
    "shaded by its interval": _shaded,
    "error bars": _error_bars,
    "dashed: ideal": lambda ax: _line_styled(ax, "--", "ideal"),
    "dashed: the target": lambda ax: _line_styled(ax, "--", "target"),
    "dotted": lambda ax: _line_styled(ax, ":"),
    "hatched": _hatched,
}


def predicted_panels(fig) -> list:
    """Panels that draw a predicted point (open markers: white face, no line)."""
    return [
        ax
        for ax in fig.axes
        if ax.get_visible()
        and any(
            ln.get_markerfacecolor() == "white" and ln.get_linestyle() == "None"
            for ln in ax.get_lines()
        )
    ]


def missing_caption_elements(fig, caption: str, shaded_expected: bool = True) -> list[str]:
    """Caption phrases whose element no panel draws. "shaded by its interval" is owed by every
    panel that draws a prediction with a finite interval (`shaded_expected`)."""
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    bad = []
    for phrase, drawn in CAPTION_ELEMENTS.items():
        if phrase not in caption:
            continue
        if phrase == "shaded by its interval":
            owing = predicted_panels(fig) if shaded_expected else []
            bad += [f"{ax.get_title()!r}: not {phrase}" for ax in owing if not drawn(ax)]
        elif panels and not any(drawn(ax) for ax in panels):
            bad.append(f"caption says {phrase!r}, no panel draws it")
    return bad


def _draws_data(ax) -> bool:
    """A panel that draws lines, markers, bands or bars (not only texts, as a panel that says
    "no plan" in words)."""
    return any(a.get_visible() for a in [*ax.get_lines(), *ax.collections, *ax.patches])


def figure_problems(fig, caption: str = "", shaded_expected: bool = True) -> list[str]:
    """Every problem a reader would catch in `fig` (drawn with its canvas' renderer first)."""
    fig.canvas.draw()
    problems = []
    for ax in fig.axes:
        if not ax.get_visible() or not (ax.axison or _draws_data(ax)):
            continue
        title = ax.get_title() or "untitled panel"
        problems += [f"{title}: {p}" for p in points_outside(ax)]
        for which in ("x", "y"):
            if not tick_labels(ax, which):
                problems.append(f"{title}: no {which} tick label")
    problems += overlapping_labels(fig)
    problems += missing_caption_elements(fig, caption, shaded_expected)
    return problems
